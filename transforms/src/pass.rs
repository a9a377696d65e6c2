//! What a pass is: a value with a name, a [`Contract`] (the facts it needs, what it may change),
//! and a rewrite in two steps: [`Pass::prepare`] checks the plan and computes what the rewrite
//! needs, [`Pass::apply`] consumes that and the plan.
//!
//! Users' passes implement [`Pass`] exactly as the built-ins do. The driver works on the
//! object-safe [`Transform`], which every `Pass` is.
//!
//! The built-ins keep the client's order `zero_bubble(dual(vpp(f1b(gpipe))))` through their
//! contracts alone: `gpipe` needs an unscheduled plan and leaves fill-drain pacing; `f1b` needs
//! fill-drain on the linear layout and leaves 1F1B pacing; `vpp` needs the linear layout and leaves
//! an interleaved one; `dual` needs 1F1B pacing on a linear or interleaved layout and leaves a dual
//! one; `zero_bubble` needs 1F1B pacing with whole backwards and leaves them split. So each runs at
//! most once and never out of order, and a user's pass slots in wherever its contract fits.

use crate::error::TransformError;
use pipeweave_core::{Facts, LayoutKind, Pacing, Plan};
use std::fmt::Write;

/// The facts a pass needs of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requires {
    /// Accepted pacings.
    pub pacing: &'static [Pacing],
    /// Accepted layouts.
    pub layout: &'static [LayoutKind],
    /// Whether every backward must be whole.
    pub whole_backwards: bool,
}

impl Requires {
    /// Any plan.
    pub const ANY: Requires = Requires {
        pacing: &[
            Pacing::Unscheduled,
            Pacing::FillDrain,
            Pacing::OneForwardOneBackward,
            Pacing::Custom,
        ],
        layout: LayoutKind::ALL,
        whole_backwards: false,
    };

    /// The first requirement `facts` break, as (what is needed, what the plan has), checking the
    /// pacing, then the backwards, then the layout.
    pub fn unmet(&self, facts: &Facts) -> Option<Unmet> {
        if !self.pacing.contains(&facts.pacing) {
            let needed = self
                .pacing
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(" or ");
            return Some(Unmet::Pacing {
                needs: format!("{needed} pacing"),
                found: format!("{} pacing", facts.pacing),
            });
        }
        if self.whole_backwards && facts.backwards != pipeweave_core::Backwards::Whole {
            return Some(Unmet::Pacing {
                needs: "whole backwards".to_string(),
                found: facts.backwards.to_string(),
            });
        }
        if !self.layout.contains(&facts.layout.kind()) {
            let mut needs = String::new();
            for (i, kind) in self.layout.iter().enumerate() {
                if i > 0 {
                    needs.push_str(" or ");
                }
                let _ = write!(needs, "{}", kind.describe());
            }
            return Some(Unmet::Layout {
                needs,
                found: format!("the {} layout", facts.layout),
            });
        }
        None
    }
}

/// A broken requirement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unmet {
    /// The pacing or the backwards: the pass comes at the wrong point of the pipeline.
    Pacing {
        /// What the pass needs.
        needs: String,
        /// What the plan has.
        found: String,
    },
    /// The layout.
    Layout {
        /// What the pass needs.
        needs: String,
        /// What the plan has.
        found: String,
    },
}

/// What a pass may change besides the orders (which every pass may rewrite). The driver rejects a
/// pass that changes anything else as broken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// The problem (stages, placement, routes, tied stages) and the cost and memory models.
    pub placement: bool,
    /// The layout fact.
    pub layout: bool,
    /// The pacing fact.
    pub pacing: bool,
    /// The backwards fact.
    pub backwards: bool,
    /// The declared memory limit.
    pub memory_limit: bool,
}

/// A pass's declarations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contract {
    /// The facts it needs.
    pub requires: Requires,
    /// What it may change.
    pub changes: Changes,
}

/// A schedule pass, as built-ins and users write it.
pub trait Pass: Send + Sync {
    /// What [`Pass::prepare`] hands to [`Pass::apply`].
    type Prepared;

    /// The pass's name, as written in expressions and blamed in errors.
    fn name(&self) -> &str;

    /// The facts it needs and what it may change.
    fn contract(&self) -> Contract;

    /// A one-line description with the pass's arguments, e.g. `vpp(chunks=2, layout=standard)`.
    fn describe(&self) -> String {
        self.name().to_string()
    }

    /// Checks the preconditions the pass states in its doc (beyond its contract, which the driver
    /// checks first) and computes what the rewrite needs.
    fn prepare(&self, plan: &Plan) -> Result<Self::Prepared, TransformError>;

    /// Rewrites the plan with what [`Pass::prepare`] computed for it.
    fn apply(&self, plan: Plan, prepared: Self::Prepared) -> Result<Plan, TransformError>;
}

/// A pass with its prepared value erased: what the driver runs.
pub trait Transform: Send + Sync {
    /// See [`Pass::name`].
    fn name(&self) -> &str;
    /// See [`Pass::contract`].
    fn contract(&self) -> Contract;
    /// See [`Pass::describe`].
    fn describe(&self) -> String;
    /// Prepares and applies.
    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError>;
}

impl<P: Pass> Transform for P {
    fn name(&self) -> &str {
        Pass::name(self)
    }
    fn contract(&self) -> Contract {
        Pass::contract(self)
    }
    fn describe(&self) -> String {
        Pass::describe(self)
    }
    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let prepared = self.prepare(&plan)?;
        self.apply(plan, prepared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::{Backwards, Layout};

    #[test]
    fn requirements_name_what_is_missing() {
        let requires = Requires {
            pacing: &[Pacing::FillDrain],
            layout: &[LayoutKind::Linear],
            whole_backwards: true,
        };
        let facts = |pacing, layout, backwards| Facts {
            layout,
            pacing,
            backwards,
        };
        assert_eq!(
            requires.unmet(&facts(Pacing::FillDrain, Layout::Linear, Backwards::Whole)),
            None
        );
        assert_eq!(
            requires.unmet(&facts(
                Pacing::Unscheduled,
                Layout::Linear,
                Backwards::Whole
            )),
            Some(Unmet::Pacing {
                needs: "fill-drain pacing".into(),
                found: "unscheduled pacing".into()
            })
        );
        assert!(matches!(
            requires.unmet(&facts(Pacing::FillDrain, Layout::Linear, Backwards::Split)),
            Some(Unmet::Pacing { .. })
        ));
        assert!(matches!(
            requires.unmet(&facts(Pacing::FillDrain, Layout::Custom, Backwards::Whole)),
            Some(Unmet::Layout { .. })
        ));
        assert_eq!(
            Requires::ANY.unmet(&facts(Pacing::Custom, Layout::Custom, Backwards::Split)),
            None
        );
    }
}
