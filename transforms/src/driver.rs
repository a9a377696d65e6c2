//! The pass driver: runs a list of passes, checks each pass's contract, verifies after every pass,
//! blames a failing pass by name, and lets a caller observe each intermediate plan.
//!
//! For every pass, in order:
//! 1. **Requirements.** The plan's facts must meet the pass's [`Requires`]. A pacing or backwards
//!    mismatch, or a layout another pass of the list set, means the pass comes at the wrong point
//!    ([`TransformError::OutOfOrder`]); a layout the plan started with is a precondition
//!    ([`TransformError::Precondition`]).
//! 2. **Rewrite.** [`crate::pass::Pass::prepare`] then [`crate::pass::Pass::apply`].
//! 3. **Changes.** Whatever the pass's [`Changes`] does not declare must be as before: the problem
//!    and models, each fact, the memory limit ([`TransformError::UndeclaredChange`], a bug).
//! 4. **Verification.** The result is verified before the next pass sees it (the declared memory
//!    bound on the final plan only: intermediate plans never run, and the passes that rework
//!    memory come last). A plan that breaks only the memory bound is the user's limit being too
//!    tight ([`TransformError::MemoryLimit`]); any other violation is a bug in the pass
//!    ([`TransformError::PassBroke`]).

use crate::error::TransformError;
use crate::pass::{Changes, Requires, Transform, Unmet};
use pipeweave_core::{verify, verify_schedule, CostModel, Facts, MemoryModel, Plan, Problem};

/// An ordered list of passes.
pub struct PassList {
    passes: Vec<Box<dyn Transform>>,
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
        None
    }
}

impl PassList {
    /// The passes, in the order they run.
    pub fn new(passes: Vec<Box<dyn Transform>>) -> PassList {
        PassList { passes }
    }

    /// The passes' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.passes.iter().map(|p| p.name()).collect()
    }

    /// The passes themselves.
    pub fn passes(&self) -> &[Box<dyn Transform>] {
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
        for (index, pass) in self.passes.iter().enumerate() {
            let earlier = &self.passes[..index];
            check_requirements(pass.as_ref(), earlier, &plan)?;
            let before = Before::of(&plan);
            plan = pass.rewrite(plan)?.record_pass(pass.name());
            if let Some(what) = before.undeclared(&plan, pass.contract().changes) {
                return Err(TransformError::UndeclaredChange {
                    pass: pass.name().to_string(),
                    what,
                });
            }
            verify_after(pass.name(), &plan, index + 1 == self.passes.len())?;
            observer(pass.name(), &plan);
        }
        Ok(plan)
    }
}

/// Step 1 of the module doc.
fn check_requirements(
    pass: &dyn Transform,
    earlier: &[Box<dyn Transform>],
    plan: &Plan,
) -> Result<(), TransformError> {
    let requires: Requires = pass.contract().requires;
    let Some(unmet) = requires.unmet(&plan.facts()) else {
        return Ok(());
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
    use pipeweave_core::{LayoutKind, Pacing, StageCosts};

    /// A test pass: a contract and a rewrite given as a closure.
    struct Probe {
        name: &'static str,
        contract: Contract,
        rewrite: fn(Plan) -> Plan,
    }

    impl Pass for Probe {
        type Prepared = ();
        fn name(&self) -> &str {
            self.name
        }
        fn contract(&self) -> Contract {
            self.contract
        }
        fn prepare(&self, _: &Plan) -> Result<(), TransformError> {
            Ok(())
        }
        fn apply(&self, plan: Plan, (): ()) -> Result<Plan, TransformError> {
            Ok((self.rewrite)(plan))
        }
    }

    fn unscheduled() -> Plan {
        let problem = pipeweave_core::ProblemSpec::builder()
            .ranks(2)
            .microbatches(2)
            .build()
            .validate()
            .unwrap();
        Plan::unscheduled(
            problem,
            CostModel::uniform(2, StageCosts::default(), 0.0).unwrap(),
            MemoryModel::uniform(2, Default::default()),
        )
        .unwrap()
    }

    fn probe(
        requires: Requires,
        changes: Changes,
        rewrite: fn(Plan) -> Plan,
    ) -> Box<dyn Transform> {
        Box::new(Probe {
            name: "probe",
            contract: Contract { requires, changes },
            rewrite,
        })
    }

    #[test]
    fn unmet_requirements_are_order_or_precondition_errors() {
        let needs_fill_drain = Requires {
            pacing: &[Pacing::FillDrain],
            layout: LayoutKind::ALL,
            whole_backwards: false,
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
        };
        let err = PassList::new(vec![probe(needs_dual, Changes::default(), |p| p)])
            .run(unscheduled())
            .unwrap_err();
        assert!(matches!(err, TransformError::Precondition { .. }), "{err}");
    }

    #[test]
    fn undeclared_changes_are_blamed_on_the_pass() {
        let schedule = |plan: Plan| {
            let orders = (0..2)
                .map(|r| {
                    [
                        format!("{r}F0"),
                        format!("{r}F1"),
                        format!("{r}B0"),
                        format!("{r}B1"),
                    ]
                    .iter()
                    .map(|t| t.parse().unwrap())
                    .collect()
                })
                .collect();
            let facts = Facts {
                pacing: Pacing::Custom,
                ..plan.facts()
            };
            plan.reshaped(None, orders, facts).unwrap()
        };
        let err = PassList::new(vec![probe(Requires::ANY, Changes::default(), schedule)])
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
        let declared = Changes {
            pacing: true,
            ..Changes::default()
        };
        let plan = PassList::new(vec![probe(Requires::ANY, declared, schedule)])
            .run(unscheduled())
            .unwrap();
        assert_eq!(plan.passes(), ["probe"]);
    }

    #[test]
    fn a_plan_that_fails_verification_is_a_broken_pass() {
        let declared = Changes {
            pacing: true,
            ..Changes::default()
        };
        let half = |plan: Plan| {
            let orders = vec![vec!["0F0".parse().unwrap()], vec![]];
            let facts = Facts {
                pacing: Pacing::Custom,
                ..plan.facts()
            };
            plan.reshaped(None, orders, facts).unwrap()
        };
        let err = PassList::new(vec![probe(Requires::ANY, declared, half)])
            .run(unscheduled())
            .unwrap_err();
        assert!(matches!(err, TransformError::PassBroke { .. }), "{err}");
    }
}
