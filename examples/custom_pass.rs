//! A pass defined outside the library, registered under a name and composed with the built-ins.
//!
//! `lazy_w(schedule, memory=N)` splits every full backward into its input-gradient half (I),
//! which stays where the backward was, and its weight-gradient half (W), which it delays: a W
//! waits in a queue until the rank's held activations would otherwise exceed `N` before the next
//! forward, or until the rank's order ends. The Is reach the previous rank sooner, so the pipeline
//! drains faster; the price is the memory the queued Ws hold (the part of a microbatch's
//! activations kept until W). Its contract: it needs one-forward-one-backward pacing with whole
//! backwards, and it changes only the orders and the backwards fact. So `lazy_w(f1b(gpipe))`
//! and `lazy_w(vpp(f1b(gpipe), chunks=2))` compose, and `zero_bubble(lazy_w(f1b(gpipe)))` is
//! refused by the driver (backwards already split), just as the built-ins refuse each other out of
//! order. The driver verifies its output and would blame it by name if it broke a plan.
//!
//! Run: `cargo run --release --example custom_pass`.

use pipeweave::core_ir::TOLERANCE;
use pipeweave::prelude::*;
use pipeweave::{StageCostsSpec, StageMemory, StageMemorySpec};
use std::collections::VecDeque;
use std::process::ExitCode;

/// The schedules compared, one a line (`lazy_w.py` compares the same).
const EXPRESSIONS: &str = include_str!("lazy_w_expressions.txt");

/// Delays weight gradients within a per-rank memory bound.
struct LazyWeights {
    memory: Option<f64>,
}

impl LazyWeights {
    const NAME: &'static str = "lazy_w";
}

impl Pass for LazyWeights {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        // 1F1B pacing with whole backwards, on any layout, activations kept; it splits them.
        let requires = Requires::paced(&[Pacing::OneForwardOneBackward]).with_whole_backwards();
        Contract::new(requires, Changes::BACKWARDS)
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let overlapped = |t: &Task| matches!(t, Task::Overlapped { .. });
        if plan.orders().iter().flatten().any(overlapped) {
            return Err(TransformError::unmet(
                "no overlapped F&B tasks",
                "the plan overlaps forwards with backwards (a dual plan)",
            ));
        }
        // The argument, else the plan's declared limit, else unbounded.
        let bound = self.memory.or(plan.memory_limit()).unwrap_or(f64::INFINITY);
        let memory = plan.memory().stages().to_vec();
        let orders = plan
            .orders()
            .iter()
            .map(|order| lazy_order(order, &memory, bound))
            .collect();
        let facts = Facts {
            backwards: Backwards::Split,
            ..plan.facts()
        };
        plan.reshaped(None, orders, facts)
            .map_err(|e| TransformError::core(Self::NAME, e))
    }
}

/// One rank's order with every B split and its W delayed as long as `bound` allows.
fn lazy_order(order: &[Task], memory: &[StageMemory], bound: f64) -> Vec<Task> {
    let figures = |w: Work| memory[w.stage.index()];
    let mut held = 0.0;
    let mut queued: VecDeque<Work> = VecDeque::new();
    let mut out = Vec::with_capacity(order.len() * 2);
    for &task in order {
        match task {
            Task::Forward(w) => {
                while held + figures(w).total() > bound + TOLERANCE {
                    let Some(oldest) = queued.pop_front() else {
                        break;
                    };
                    held -= figures(oldest).weight_grad();
                    out.push(Task::WeightGrad(oldest));
                }
                held += figures(w).total();
                out.push(task);
            }
            Task::Backward(w) => {
                held -= figures(w).total() - figures(w).weight_grad();
                queued.push_back(w);
                out.push(Task::InputGrad(w));
            }
            other => out.push(other),
        }
    }
    out.extend(queued.into_iter().map(Task::WeightGrad));
    out
}

/// The registry with the built-ins and `lazy_w`.
fn registry() -> Result<Registry, TransformError> {
    let mut registry = Registry::builtin();
    registry.register(
        LazyWeights::NAME,
        Arity::Rewrite,
        Box::new(|args: &Arguments| {
            args.allow_only(&["memory"])?;
            let memory = args.number("memory")?;
            if let Some(m) = memory.filter(|m| !(m.is_finite() && *m > 0.0)) {
                let column = args.value("memory").map_or(args.column(), |(c, _)| c);
                return Err(args.bad("memory", column, &format!("{m} must be > 0")));
            }
            Ok(Box::new(LazyWeights { memory }) as Box<dyn Pass>)
        }),
    )?;
    Ok(registry)
}

fn main() -> ExitCode {
    let registry = match registry() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // Costs of the Zero Bubble paper's 1.5B model (F, I, W in its units) and activations of which
    // a third is held until W.
    let costs = StageCostsSpec::builder()
        .forward(18.0)
        .input_grad(18.0)
        .weight_grad(9.0)
        .build()
        .validate()
        .expect("the example's costs are valid");
    let memory = StageMemorySpec::builder()
        .total(1.0)
        .weight_grad(0.34)
        .build()
        .validate()
        .expect("the example's memory figures are valid");
    let config = PipelineConfig::new(4, 12)
        .and_then(|c| c.with_costs(costs, 0.0))
        .map(|c| c.with_memory(memory))
        .expect("the example's sizes are valid");
    println!("4 ranks, 12 microbatches, F=18 I=18 W=9, a third of the activations held until W\n");
    println!(
        "{:<44} {:>9} {:>8} {:>12}",
        "expression", "makespan", "bubble", "peak memory"
    );
    let mut failed = false;
    for expression in EXPRESSIONS.lines() {
        match build_plan_with(&registry, expression, &config)
            .and_then(|plan| Ok((simulate(&plan)?, plan)))
        {
            Ok((sim, _plan)) => {
                let peak = sim
                    .ranks()
                    .iter()
                    .map(|r| r.peak_activations)
                    .fold(0.0, f64::max);
                println!(
                    "{expression:<44} {:>9.1} {:>8.4} {:>12.2}",
                    sim.makespan(),
                    sim.bubble_rate(),
                    peak
                );
            }
            Err(e) if expression.starts_with("zero_bubble(lazy_w") => {
                println!("{expression:<44} refused: {e}");
            }
            Err(e) => {
                eprintln!("error: {expression}: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
