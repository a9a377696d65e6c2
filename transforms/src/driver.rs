//! The pass driver: runs a list of passes, checks each pass's contract, verifies after every pass,
//! blames a failing pass by name, and lets a caller observe each intermediate plan.
//!
//! For every pass, in order:
//! 1. **Requirements.** The plan's facts must meet the pass's [`Requires`]. A pacing or backwards
//!    mismatch, or a layout another pass of the list set, means the pass comes at the wrong point
//!    ([`TransformError::OutOfOrder`]); a layout the plan started with is a precondition
//!    ([`TransformError::Precondition`]).
//! 2. **Rewrite.** [`crate::pass::Pass::rewrite`], once.
//! 3. **Changes.** Whatever the pass's [`Changes`] does not declare must be as before: the problem
//!    and models, each fact, the memory limit ([`TransformError::UndeclaredChange`], a bug).
//! 4. **Verification.** The result is verified before the next pass sees it (the declared memory
//!    bound on the final plan only: intermediate plans never run, and the passes that rework
//!    memory come last). A plan that breaks only the memory bound is the user's limit being too
//!    tight ([`TransformError::MemoryLimit`]); any other violation is a bug in the pass
//!    ([`TransformError::PassBroke`]).
//!
//!
//! **Where a declared memory limit binds.** When the list ends with passes that change where
//! activations live (`recompute`, `offload`: [`Changes::residency`]), the declared limit binds
//! from the first of them on: the passes before it build the schedule as they would without it,
//! and the residency passes fit it (so `offload(zero_bubble(...), memory=N)` under
//! `--memory-limit N` moves activations of the zero-bubble schedule, rather than finding a
//! zero-bubble schedule that already fits and nothing to move). Without such a tail every pass
//! sees it.
//!
//! [`PassList::run_beside`] gives the same result and the same first error, with the verifications
//! on a second thread: each intermediate plan's (on a copy) while the next passes run, then the
//! final plan's, while the caller's own work on the final plan (the simulation, say) runs. Its
//! result is returned only once every verification passed; the earliest failure in pass order is
//! the error, as if the steps had run one after the other.

use crate::error::TransformError;
use crate::pass::{Changes, Pass, Requires, Unmet};
use pipeweave_core::{verify, verify_schedule, CostModel, Facts, MemoryModel, Plan, Problem};

/// An ordered list of passes.
pub struct PassList {
    passes: Vec<Box<dyn Pass>>,
}

impl std::fmt::Debug for PassList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.passes.iter().map(|p| p.describe()))
            .finish()
    }
}

/// What a pass saw before it ran, to compare its result with its declared changes.
struct Before {
    problem: Problem,
    costs: CostModel,
    memory: MemoryModel,
    facts: Facts,
    memory_limit: Option<f64>,
}

impl Before {
    fn of(plan: &Plan) -> Before {
        Before {
            problem: plan.problem().clone(),
            costs: plan.costs().clone(),
            memory: plan.memory().clone(),
            facts: plan.facts(),
            memory_limit: plan.memory_limit(),
        }
    }

    /// The first thing `after` changed that `changes` does not allow.
    fn undeclared(&self, after: &Plan, changes: Changes) -> Option<&'static str> {
        let facts = after.facts();
        if !changes.placement
            && (self.problem != *after.problem()
                || self.costs != *after.costs()
                || self.memory != *after.memory())
        {
            return Some("the problem or its cost and memory models");
        }
        if !changes.layout && self.facts.layout != facts.layout {
            return Some("the layout fact");
        }
        if !changes.pacing && self.facts.pacing != facts.pacing {
            return Some("the pacing fact");
        }
        if !changes.backwards && self.facts.backwards != facts.backwards {
            return Some("the backwards fact");
        }
        if !changes.memory_limit && self.memory_limit != after.memory_limit() {
            return Some("the declared memory limit");
        }
        if !changes.residency && self.facts.residency != facts.residency {
            return Some("the residency fact (recomputes or transfers)");
        }
        None
    }
}

impl PassList {
    /// The passes, in the order they run.
    pub fn new(passes: Vec<Box<dyn Pass>>) -> PassList {
        PassList { passes }
    }

    /// The passes' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// The passes themselves.
    pub fn passes(&self) -> &[Box<dyn Pass>] {
        &self.passes
    }

    /// Runs every pass on `plan`, verifying after each.
    pub fn run(&self, plan: Plan) -> Result<Plan, TransformError> {
        self.run_observed(plan, &mut |_, _| {})
    }

    /// Runs every pass on `plan`, verifying after each and calling `observer` with the pass's name
    /// and the verified plan it produced.
    pub fn run_observed(
        &self,
        mut plan: Plan,
        observer: &mut dyn FnMut(&str, &Plan),
    ) -> Result<Plan, TransformError> {
        let declared = plan.memory_limit();
        for (index, pass) in self.passes.iter().enumerate() {
            plan = self.rewrite_one(index, plan, declared)?;
            verify_after(pass.name(), &plan, index + 1 == self.passes.len())?;
            observer(pass.name(), &plan);
        }
        Ok(plan)
    }

    /// [`PassList::run`] with the verifications on a second thread, and `beside` run on the final
    /// plan while the verifications still run (see the module doc). `beside` must take any plan
    /// without harm (a simulation reports a plan that cannot run as an error); its result is
    /// returned only when every verification passed.
    pub fn run_beside<T>(
        &self,
        plan: Plan,
        beside: impl FnOnce(&Plan) -> T,
    ) -> Result<(Plan, T), TransformError> {
        let Some((last, earlier)) = self.passes.split_last() else {
            let result = beside(&plan);
            return Ok((plan, result));
        };
        let declared = plan.memory_limit();
        std::thread::scope(|scope| {
            let (sender, receiver) = std::sync::mpsc::channel::<(&str, Plan)>();
            let intermediate = scope.spawn(move || {
                receiver
                    .iter()
                    .try_for_each(|(pass, plan)| verify_after(pass, &plan, false))
            });
            let rewrite_all = || {
                let mut plan = plan;
                for (index, pass) in earlier.iter().enumerate() {
                    plan = self.rewrite_one(index, plan, declared)?;
                    // The verifier stops early only on a failure, which is reported first.
                    let _ = sender.send((pass.name(), plan.clone()));
                }
                self.rewrite_one(earlier.len(), plan, declared)
            };
            let rewritten = std::panic::catch_unwind(std::panic::AssertUnwindSafe(rewrite_all));
            drop(sender);
            let plan = match rewritten {
                Ok(Ok(plan)) => plan,
                // A pass that failed or panicked on a plan an earlier pass broke: the earlier pass
                // is to blame, as when each plan is verified before the next pass sees it.
                Ok(Err(failed)) => {
                    joined(intermediate)?;
                    return Err(failed);
                }
                Err(panic) => {
                    joined(intermediate)?;
                    std::panic::resume_unwind(panic)
                }
            };
            let result = std::thread::scope(|inner| {
                let verified = inner.spawn(|| {
                    joined(intermediate)?;
                    verify_after(last.name(), &plan, true)
                });
                let result = beside(&plan);
                joined(verified).map(|()| result)
            })?;
            Ok((plan, result))
        })
    }

    /// The index of the first pass the declared memory limit binds (see the module doc): the
    /// first of the trailing passes that change residency, else 0.
    fn limit_binds_from(&self) -> usize {
        let trailing = self
            .passes
            .iter()
            .rev()
            .take_while(|p| p.contract().changes.residency)
            .count();
        if trailing == 0 {
            0
        } else {
            self.passes.len() - trailing
        }
    }

    /// Steps 1 to 3 of the module doc for the pass at `index`, on `plan` with the list's
    /// `declared` memory limit withheld or restored as the pass's place says.
    fn rewrite_one(
        &self,
        index: usize,
        plan: Plan,
        declared: Option<f64>,
    ) -> Result<Plan, TransformError> {
        let binds_from = self.limit_binds_from();
        let plan = match index {
            0 if binds_from > 0 => plan.with_memory_limit(None),
            i if i == binds_from && i > 0 => plan.with_memory_limit(declared),
            _ => Ok(plan),
        }
        .map_err(|e| TransformError::core("the declared memory limit", e))?;
        let pass = &self.passes[index];
        check_requirements(pass.as_ref(), &self.passes[..index], &plan)?;
        let before = Before::of(&plan);
        let plan = pass
            .rewrite(plan)
            .map_err(|e| e.of_pass(pass.name()))?
            .record_pass(pass.name());
        if let Some(what) = before.undeclared(&plan, pass.contract().changes) {
            return Err(TransformError::UndeclaredChange {
                pass: pass.name().to_string(),
                what,
            });
        }
        Ok(plan)
    }
}

/// The result of a scoped thread; its panic goes on in the caller.
fn joined<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Step 1 of the module doc.
fn check_requirements(
    pass: &dyn Pass,
    earlier: &[Box<dyn Pass>],
    plan: &Plan,
) -> Result<(), TransformError> {
    let requires: Requires = pass.contract().requires;
    // A layout an earlier pass establishes holds even where that pass left the plan unchanged.
    let established = earlier.iter().rev().find_map(|p| {
        p.contract()
            .establishes
            .filter(|kind| !requires.layout.contains(kind))
            .map(|kind| (p.name(), kind))
    });
    let unmet = match (requires.unmet(&plan.facts()), established) {
        (Some(unmet), _) => unmet,
        (None, Some((by, kind))) => Unmet::Layout {
            needs: requires.layouts(),
            found: format!("{} (which `{by}` establishes)", kind.describe()),
        },
        (None, None) => return Ok(()),
    };
    let after = earlier.last().map_or_else(
        || "nothing (the innermost schedule must be gpipe)".to_string(),
        |p| p.name().to_string(),
    );
    let layout_set_by_a_pass = earlier.iter().any(|p| p.contract().changes.layout);
    Err(match unmet {
        Unmet::Pacing { needs, found } => TransformError::OutOfOrder {
            pass: pass.name().to_string(),
            after,
            needs,
            found,
        },
        Unmet::Layout { needs, found } if layout_set_by_a_pass => TransformError::OutOfOrder {
            pass: pass.name().to_string(),
            after,
            needs,
            found,
        },
        Unmet::Layout { needs, .. } => {
            let problem = plan.problem();
            TransformError::precondition(
                pass.name(),
                &needs,
                format!(
                    "the problem has {} stages on {} ranks with {} route(s)",
                    problem.stages(),
                    problem.ranks(),
                    problem.routes().len()
                ),
            )
        }
    })
}

/// Step 4 of the module doc.
fn verify_after(pass: &str, plan: &Plan, last: bool) -> Result<(), TransformError> {
    let checked = if last {
        verify(plan)
    } else {
        verify_schedule(plan)
    };
    checked.map_err(|violations| {
        if violations.only_memory() {
            TransformError::MemoryLimit {
                pass: pass.to_string(),
                violations,
            }
        } else {
            TransformError::PassBroke {
                pass: pass.to_string(),
                violations,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pass::{Contract, Pass};
    use crate::testing::tasks;
    use pipeweave_core::{LayoutKind, Pacing, StageCosts, Task};

    /// A test pass: a contract and a rewrite given as a closure.
    struct Probe {
        name: &'static str,
        contract: Contract,
        rewrite: fn(Plan) -> Plan,
    }

    impl Pass for Probe {
        fn name(&self) -> &str {
            self.name
        }
        fn contract(&self) -> Contract {
            self.contract
        }
        fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
            Ok((self.rewrite)(plan))
        }
    }

    fn unscheduled() -> Plan {
        crate::testing::unscheduled(2, 2, StageCosts::default())
    }

    fn probe(requires: Requires, changes: Changes, rewrite: fn(Plan) -> Plan) -> Box<dyn Pass> {
        Box::new(Probe {
            name: "probe",
            contract: Contract::new(requires, changes),
            rewrite,
        })
    }

    #[test]
    fn a_declared_limit_binds_from_the_outermost_residency_passes() {
        let run = |expression: &str| {
            let passes = crate::builtins::compile_expression(expression).unwrap();
            let plan = crate::testing::unscheduled(4, 12, StageCosts::default())
                .with_memory_limit(Some(3.0))
                .unwrap();
            let mut seen = Vec::new();
            let plan = passes
                .run_observed(plan, &mut |name, p| {
                    seen.push((
                        name.to_string(),
                        p.memory_limit(),
                        pipeweave_core::max_peak(p),
                    ))
                })
                .unwrap();
            (plan, seen)
        };
        // Under offload, zero bubble builds its schedule as without the limit (ZB-V holds 4) and
        // offload fits it.
        let (plan, seen) =
            run("offload(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), memory=3)");
        let inner = seen
            .iter()
            .find(|(name, ..)| name == "zero_bubble")
            .unwrap();
        assert_eq!(inner.2, 4.0);
        assert_ne!(inner.1, Some(3.0));
        assert_eq!(plan.memory_limit(), Some(3.0));
        assert!(pipeweave_core::max_peak(&plan) <= 3.0 + 1e-9);
        assert!(plan.facts().residency.offloaded);
        // Without a residency pass outermost, every pass sees it: zero bubble fits 3 alone.
        let (plan, seen) = run("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))");
        assert!(seen.iter().all(|(_, limit, _)| *limit == Some(3.0)));
        assert!(pipeweave_core::max_peak(&plan) <= 3.0 + 1e-9);
    }

    #[test]
    fn unmet_requirements_are_order_or_precondition_errors() {
        let needs_fill_drain = Requires {
            pacing: &[Pacing::FillDrain],
            layout: LayoutKind::ALL,
            whole_backwards: false,
            residency: Requires::KEPT,
        };
        let err = PassList::new(vec![probe(needs_fill_drain, Changes::default(), |p| p)])
            .run(unscheduled())
            .unwrap_err();
        assert!(
            matches!(err, TransformError::OutOfOrder { ref after, .. } if after.contains("nothing")),
            "{err}"
        );
        let needs_dual = Requires {
            pacing: Requires::ANY.pacing,
            layout: &[LayoutKind::Dual],
            whole_backwards: false,
            residency: Requires::KEPT,
        };
        let err = PassList::new(vec![probe(needs_dual, Changes::default(), |p| p)])
            .run(unscheduled())
            .unwrap_err();
        assert!(matches!(err, TransformError::Precondition { .. }), "{err}");
    }

    #[test]
    fn undeclared_changes_are_blamed_on_the_pass() {
        let err = PassList::new(vec![probe(Requires::ANY, Changes::default(), complete)])
            .run(unscheduled())
            .unwrap_err();
        assert_eq!(
            err,
            TransformError::UndeclaredChange {
                pass: "probe".into(),
                what: "the pacing fact"
            }
        );
        assert!(err.is_pass_bug());
        let plan = PassList::new(vec![pacing(complete)])
            .run(unscheduled())
            .unwrap();
        assert_eq!(plan.passes(), ["probe"]);
    }

    #[test]
    fn a_plan_that_fails_verification_is_a_broken_pass() {
        let err = PassList::new(vec![pacing(half)])
            .run(unscheduled())
            .unwrap_err();
        assert!(matches!(err, TransformError::PassBroke { .. }), "{err}");
    }

    /// `plan` with `orders` of custom pacing.
    fn custom(plan: Plan, orders: Vec<Vec<Task>>) -> Plan {
        let facts = Facts {
            pacing: Pacing::Custom,
            ..plan.facts()
        };
        plan.reshaped(None, orders, facts).unwrap()
    }

    /// Both ranks' four tasks: a complete plan.
    fn complete(plan: Plan) -> Plan {
        custom(
            plan,
            vec![tasks("0F0 0F1 0B0 0B1"), tasks("1F0 1F1 1B0 1B1")],
        )
    }

    /// Rank 1's order left empty: a plan that fails verification.
    fn half(plan: Plan) -> Plan {
        custom(plan, vec![tasks("0F0"), vec![]])
    }

    /// A pass that rewrites the pacing, declaring it.
    fn pacing(rewrite: fn(Plan) -> Plan) -> Box<dyn Pass> {
        let declared = Changes {
            pacing: true,
            ..Changes::default()
        };
        probe(Requires::ANY, declared, rewrite)
    }

    #[test]
    fn verifying_beside_gives_the_same_plan_and_the_same_first_error() {
        let identity = || probe(Requires::ANY, Changes::default(), |p| p);
        let (plan, tasks) = PassList::new(vec![pacing(complete), identity(), identity()])
            .run_beside(unscheduled(), |plan| plan.orders()[1].len())
            .unwrap();
        assert_eq!(plan.passes(), ["probe", "probe", "probe"]);
        assert_eq!(tasks, 4, "beside sees the final plan");
        let (_, ran) = PassList::new(vec![])
            .run_beside(unscheduled(), |_| true)
            .unwrap();
        assert!(ran);

        // An earlier pass broke the plan and a later one failed on it: the earlier one is blamed,
        // as in the sequential driver.
        let needs_dual = Requires {
            pacing: Requires::ANY.pacing,
            layout: &[LayoutKind::Dual],
            whole_backwards: false,
            residency: Requires::KEPT,
        };
        let list = PassList::new(vec![
            pacing(half),
            probe(needs_dual, Changes::default(), |p| p),
            identity(),
        ]);
        let sequential = list.run(unscheduled()).unwrap_err();
        let beside = list.run_beside(unscheduled(), |_| ()).unwrap_err();
        assert!(
            matches!(beside, TransformError::PassBroke { .. }),
            "{beside}"
        );
        assert_eq!(beside, sequential);

        // The last pass broke it: beside ran, but its result is not returned.
        let list = PassList::new(vec![pacing(complete), pacing(half)]);
        let beside = list.run_beside(unscheduled(), |_| ()).unwrap_err();
        assert_eq!(beside, list.run(unscheduled()).unwrap_err());
    }

    #[test]
    fn a_pass_that_panics_on_a_broken_plan_blames_the_pass_that_broke_it() {
        let panicking = probe(Requires::ANY, Changes::default(), |_| {
            panic!("a pass that trusted its input")
        });
        let list = PassList::new(vec![
            pacing(half),
            panicking,
            probe(Requires::ANY, Changes::default(), |p| p),
        ]);
        let error = list.run_beside(unscheduled(), |_| ()).unwrap_err();
        assert!(matches!(error, TransformError::PassBroke { .. }), "{error}");
    }
}
