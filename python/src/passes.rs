//! Passes written in Python: a registration from the Python side becomes a Rust [`Pass`] beside
//! the built-ins in the same [`Registry`], so the driver checks its contract, verifies its output
//! and blames it by name like any other pass.
//!
//! The Python side hands over, per pass, its name, what it requires (pacings, layout kinds,
//! whole backwards), what it changes besides the orders, `make(kwargs) -> instance`, which
//! builds the user's class with the expression's keyword arguments (its errors are the user's:
//! a bad argument of the pass), and `run(instance, plan_json) -> orders`, which calls the
//! instance's `rewrite` (its errors are the pass's bugs). The plan it sees is [`plan_view`]'s JSON; the orders it returns are read back in
//! PyTorch's action notation. A pass can change only the orders and the facts they imply: its
//! new facts follow from the orders (split backwards where they hold I or W, the residency
//! where they hold R or OFFLOAD, a custom pacing) for what it declares it changes.

use crate::errors::bad_input;
use pipeweave_core::{Backwards, Facts, LayoutKind, Pacing, Plan, Residency, Task};
use pipeweave_transforms::{Arity, Changes, Contract, Pass, Registry, Requires, TransformError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

/// One pass as the Python side registers it.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct PythonPass {
    name: String,
    pacing: Option<Vec<String>>,
    layouts: Option<Vec<String>>,
    whole_backwards: bool,
    changes: Vec<String>,
    make: Py<PyAny>,
    run: Py<PyAny>,
}

/// The pacing names a Python pass may require.
const PACINGS: [(&str, Pacing); 4] = [
    ("unscheduled", Pacing::Unscheduled),
    ("fill_drain", Pacing::FillDrain),
    ("1f1b", Pacing::OneForwardOneBackward),
    ("custom", Pacing::Custom),
];

/// The layout kinds a Python pass may require.
const LAYOUTS: [(&str, LayoutKind); 4] = [
    ("linear", LayoutKind::Linear),
    ("interleaved", LayoutKind::Interleaved),
    ("dual", LayoutKind::Dual),
    ("custom", LayoutKind::Custom),
];

/// What a Python pass may declare it changes: what follows from the orders it returns.
const CHANGES: [&str; 3] = ["backwards", "pacing", "residency"];

fn lookup<T: Copy>(
    what: &str,
    pass: &str,
    names: &[String],
    table: &[(&str, T)],
) -> Result<Vec<T>, String> {
    names
        .iter()
        .map(|name| {
            table
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    let known: Vec<&str> = table.iter().map(|(n, _)| *n).collect();
                    format!(
                        "pass `{pass}`: {what} `{name}` is not one of {}",
                        known.join(", ")
                    )
                })
        })
        .collect()
}

impl PythonPass {
    /// The contract the registration declares. Its lists live as long as the process: a
    /// contract's requirements are `'static` slices, and a registration makes one per pass.
    fn contract(&self) -> Result<Contract, String> {
        let pacing: &'static [Pacing] = match &self.pacing {
            None => Requires::ANY.pacing,
            Some(names) => Box::leak(lookup("pacing", &self.name, names, &PACINGS)?.into()),
        };
        let layout: &'static [LayoutKind] = match &self.layouts {
            None => LayoutKind::ALL,
            Some(names) => Box::leak(lookup("layout", &self.name, names, &LAYOUTS)?.into()),
        };
        let mut changes = Changes::default();
        for change in &self.changes {
            match change.as_str() {
                "backwards" => changes.backwards = true,
                "pacing" => changes.pacing = true,
                "residency" => changes.residency = true,
                other => {
                    return Err(format!(
                        "pass `{}`: a Python pass changes the orders and what follows from them \
                         ({}); `{other}` is not one of those",
                        self.name,
                        CHANGES.join(", ")
                    ))
                }
            }
        }
        let requires = Requires {
            pacing,
            layout,
            whole_backwards: self.whole_backwards,
            residency: Requires::ANY_RESIDENCY,
        };
        Ok(Contract::new(requires, changes))
    }
}

/// The built-in registry with `passes` added (each under its name; a clash with a built-in or
/// another is an error).
pub fn registry_with(py: Python<'_>, passes: Vec<PythonPass>) -> PyResult<Registry> {
    let mut registry = Registry::builtin();
    for pass in passes {
        let contract = pass.contract().map_err(|m| bad_input(py, m))?;
        let shared = Arc::new(Registered {
            name: pass.name.clone(),
            contract,
            make: pass.make,
            run: pass.run,
        });
        let factory = move |args: &pipeweave_transforms::Arguments| {
            let instance = Python::attach(|py| -> Result<Py<PyAny>, TransformError> {
                let kwargs = PyDict::new(py);
                for (name, column, node) in args.keywords() {
                    let set = match node {
                        pipeweave_transforms::expr::Node::Number { value, .. } => {
                            if value.fract() == 0.0 && value.abs() < 9.0e15 {
                                kwargs.set_item(name, *value as i64)
                            } else {
                                kwargs.set_item(name, *value)
                            }
                        }
                        pipeweave_transforms::expr::Node::Call(call)
                            if call.positional.is_empty() && call.keywords.is_empty() =>
                        {
                            kwargs.set_item(name, call.name.as_str())
                        }
                        pipeweave_transforms::expr::Node::Call(_) => {
                            return Err(args.bad(
                                name,
                                column,
                                "a pass written in Python takes numbers and words",
                            ))
                        }
                    };
                    set.map_err(|e| args.bad(name, column, &e.to_string()))?;
                }
                shared
                    .make
                    .bind(py)
                    .call1((kwargs,))
                    .map(Bound::unbind)
                    .map_err(|e| args.bad("(arguments)", args.column(), &e.to_string()))
            })?;
            Ok(Box::new(Instance {
                pass: shared.clone(),
                instance,
            }) as Box<dyn Pass>)
        };
        registry
            .register(&pass.name, Arity::Rewrite, Box::new(factory))
            .map_err(|e| bad_input(py, e.to_string()))?;
    }
    Ok(registry)
}

/// What a registration declared.
struct Registered {
    name: String,
    contract: Contract,
    make: Py<PyAny>,
    run: Py<PyAny>,
}

/// A Python pass built for one call of an expression (the user's object, made with the call's
/// keyword arguments).
struct Instance {
    pass: Arc<Registered>,
    instance: Py<PyAny>,
}

impl Pass for Instance {
    fn name(&self) -> &str {
        &self.pass.name
    }

    fn contract(&self) -> Contract {
        self.pass.contract
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let failed = |message: String| TransformError::PassFailed {
            pass: self.pass.name.clone(),
            message,
        };
        let view = plan_view(&plan);
        let orders: Vec<Vec<String>> = Python::attach(|py| {
            self.pass
                .run
                .bind(py)
                .call1((self.instance.bind(py), view))
                .and_then(|orders| orders.extract())
                .map_err(|e| e.to_string())
        })
        .map_err(failed)?;
        let orders = orders
            .iter()
            .map(|order| {
                order
                    .iter()
                    .map(|text| text.parse::<Task>())
                    .collect::<Result<Vec<Task>, _>>()
            })
            .collect::<Result<Vec<Vec<Task>>, _>>()
            .map_err(|e| failed(format!("its orders: {e}")))?;
        let facts = implied_facts(plan.facts(), self.pass.contract.changes, &orders);
        plan.reshaped(None, orders, facts)
            .map_err(|e| failed(format!("its orders: {e}")))
    }
}

/// The facts of `orders` where `changes` lets them differ from `before`.
fn implied_facts(before: Facts, changes: Changes, orders: &[Vec<Task>]) -> Facts {
    let tasks = || orders.iter().flatten();
    let mut facts = before;
    if changes.backwards {
        let split = tasks().any(|t| matches!(t, Task::InputGrad(_) | Task::WeightGrad(_)));
        facts.backwards = if split {
            Backwards::Split
        } else {
            Backwards::Whole
        };
    }
    if changes.pacing {
        facts.pacing = Pacing::Custom;
    }
    if changes.residency {
        facts.residency = Residency {
            recomputed: tasks()
                .any(|t| matches!(t, Task::Recompute(_) | Task::RecomputeWeightGrad(_))),
            offloaded: tasks().any(|t| matches!(t, Task::Offload(_))),
        };
    }
    facts
}

/// The plan a Python pass sees, as JSON: sizes, placement, orders in notation, per-stage costs
/// and memory, the memory limit, the facts and the passes so far.
pub fn plan_view(plan: &Plan) -> String {
    let problem = plan.problem();
    let costs: Vec<_> = plan
        .costs()
        .stages()
        .iter()
        .map(|c| {
            serde_json::json!({
                "F": c.forward(), "I": c.input_grad(), "W": c.weight_grad(),
                "B": c.full_backward(), "FB": c.overlapped(), "R": c.recompute(),
                "offload": c.offload(),
            })
        })
        .collect();
    let memory: Vec<_> = plan
        .memory()
        .stages()
        .iter()
        .map(|m| serde_json::json!({"total": m.total(), "weight_grad": m.weight_grad()}))
        .collect();
    let facts = plan.facts();
    let pacing = PACINGS
        .iter()
        .find(|(_, p)| *p == facts.pacing)
        .map_or("custom", |(n, _)| n);
    let layout = LAYOUTS
        .iter()
        .find(|(_, k)| *k == facts.layout.kind())
        .map_or("custom", |(n, _)| n);
    let stage_to_rank: Vec<u32> = problem.stage_to_rank().iter().map(|r| r.get()).collect();
    serde_json::json!({
        "ranks": problem.ranks(),
        "stages": problem.stages(),
        "microbatches": problem.microbatches(),
        "stage_to_rank": stage_to_rank,
        "order": plan.orders_notation(),
        "costs": costs,
        "comm": plan.costs().comm(),
        "memory": memory,
        "memory_limit": plan.memory_limit(),
        "facts": {
            "pacing": pacing,
            "layout": layout,
            "split_backwards": facts.backwards == Backwards::Split,
            "recomputed": facts.residency.recomputed,
            "offloaded": facts.residency.offloaded,
        },
        "passes": plan.passes(),
    })
    .to_string()
}

/// The built-in pass names (for `pipeweave.passes()` and for refusing a Python pass that would
/// shadow one).
#[pyfunction]
pub fn builtin_passes() -> Vec<String> {
    Registry::builtin()
        .names()
        .into_iter()
        .map(str::to_string)
        .collect()
}
