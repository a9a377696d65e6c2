//! The pass driver: runs a list of passes, verifies after every pass, blames a failing pass by name,
//! and lets a caller observe each intermediate plan.
//!
//! The driver owns the rules that hold for every pass: passes come in the client's order, each at
//! most once ([`Position`]); a pass's preconditions are checked before it runs; its result is
//! verified before the next pass sees it (the declared memory bound is checked on the final plan
//! only: intermediate plans never run, and the passes that rework memory come last). A plan that breaks only the declared memory bound is the
//! user's limit being too tight for that pass ([`TransformError::MemoryLimit`]); any other
//! violation is a bug in the pass ([`TransformError::PassBroke`]).

use crate::error::TransformError;
use crate::transform::{Position, Transform};
use pipeweave_core::{verify, verify_schedule, CoreError, Plan, Violation};

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

impl PassList {
    /// The passes, in the order they run.
    pub fn new(passes: Vec<Box<dyn Transform>>) -> PassList {
        PassList { passes }
    }

    /// The passes' names, in order.
    pub fn names(&self) -> Vec<&'static str> {
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
        let mut previous: Option<(Position, &'static str)> = None;
        for (index, pass) in self.passes.iter().enumerate() {
            if let Some((position, name)) = previous {
                if pass.position() <= position {
                    return Err(TransformError::OutOfOrder {
                        pass: pass.name().to_string(),
                        after: name.to_string(),
                    });
                }
            } else if pass.position() != Position::Baseline {
                return Err(TransformError::OutOfOrder {
                    pass: pass.name().to_string(),
                    after: "nothing (the innermost schedule must be gpipe)".to_string(),
                });
            }
            pass.check(&plan)?;
            plan = pass.apply(plan)?.record_pass(pass.name());
            let checked = if index + 1 == self.passes.len() {
                verify(&plan)
            } else {
                verify_schedule(&plan)
            };
            checked.map_err(|e| match e {
                CoreError::Verification(violations)
                    if violations
                        .0
                        .iter()
                        .all(|v| matches!(v, Violation::MemoryBound { .. })) =>
                {
                    TransformError::MemoryLimit {
                        pass: pass.name().to_string(),
                        violations,
                    }
                }
                CoreError::Verification(violations) => TransformError::PassBroke {
                    pass: pass.name().to_string(),
                    violations,
                },
                other => TransformError::core(format!("verifying after `{}`", pass.name()), other),
            })?;
            observer(pass.name(), &plan);
            previous = Some((pass.position(), pass.name()));
        }
        Ok(plan)
    }
}
