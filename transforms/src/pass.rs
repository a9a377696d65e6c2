//! What a pass is: a value with a name, a [`Contract`] (the facts it needs, what it may change,
//! the layout it establishes) and one rewrite, [`Pass::rewrite`], `Plan -> Plan`.
//!
//! Users' passes implement [`Pass`] exactly as the built-ins do, and the driver runs them as
//! `dyn Pass`. A pass's name is [`Pass::name`] alone: the registry checks that a pass built for a
//! name gives that name, and the driver puts the name on the errors a rewrite returns (a pass
//! writes [`TransformError::unmet`] without it).
//!
//! The rewrite is one call. An earlier version had two, a `prepare` that checked the plan and an
//! `apply` that used what it computed. The driver always called them back to back, and no
//! caller ever needed one without the other, so a pass now splits its work however it likes
//! inside `rewrite` (`zero_bubble` keeps private `prepare` and `apply` steps, `vpp` a private
//! `check`).
//!
//! The built-ins keep the client's order `zero_bubble(dual(vpp(f1b(gpipe))))` through their
//! contracts alone: `gpipe` needs an unscheduled plan and leaves fill-drain pacing; `f1b` needs
//! fill-drain on the linear layout and leaves 1F1B pacing; `vpp` needs the linear layout and
//! establishes an interleaved one; `dual` needs 1F1B pacing on a linear or interleaved layout and
//! establishes a dual one; `zero_bubble` needs 1F1B pacing with whole backwards and leaves them
//! split. A layout a pass establishes ([`Contract::establishes`]) counts even where the pass
//! leaves the plan unchanged (`dual` at one microbatch stays 1F1B on the linear layout): later
//! passes are held to it as to the plan's own facts. So each built-in runs at most once and never
//! out of order, at every size. A user's pass slots in wherever its contract fits.

use crate::error::TransformError;
use pipeweave_core::{Facts, LayoutKind, Pacing, Plan, Residency};

/// The facts a pass needs of its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Requires {
    /// Accepted pacings.
    pub pacing: &'static [Pacing],
    /// Accepted layouts.
    pub layout: &'static [LayoutKind],
    /// Whether every backward must be whole.
    pub whole_backwards: bool,
    /// Accepted activation residencies: a pass that reorders computes takes plans whose
    /// activations are all kept ([`Requires::KEPT`]), since it would move a recompute or a
    /// transfer away from the ops it serves.
    pub residency: &'static [Residency],
}

impl Requires {
    /// Only plans that keep every activation on the device.
    pub const KEPT: &'static [Residency] = &[Residency::KEPT];

    /// Any residency.
    pub const ANY_RESIDENCY: &'static [Residency] = &[
        Residency::KEPT,
        Residency {
            recomputed: true,
            offloaded: false,
        },
        Residency {
            recomputed: false,
            offloaded: true,
        },
        Residency {
            recomputed: true,
            offloaded: true,
        },
    ];

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
        residency: Requires::ANY_RESIDENCY,
    };

    /// The accepted layouts, as errors name them (`... or ...`).
    pub fn layouts(&self) -> String {
        or_list(self.layout, |kind| kind.describe().to_string())
    }

    /// The first requirement `facts` break, as (what is needed, what the plan has), checking the
    /// pacing, then the backwards, then the residency, then the layout.
    pub fn unmet(&self, facts: &Facts) -> Option<Unmet> {
        if !self.pacing.contains(&facts.pacing) {
            let needed = or_list(self.pacing, Pacing::to_string);
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
        if !self.residency.contains(&facts.residency) {
            return Some(Unmet::Pacing {
                needs: or_list(self.residency, Residency::to_string),
                found: facts.residency.to_string(),
            });
        }
        if !self.layout.contains(&facts.layout.kind()) {
            return Some(Unmet::Layout {
                needs: self.layouts(),
                found: format!("the {} layout", facts.layout),
            });
        }
        None
    }
}

/// `items` named by `name`, joined by ` or `.
fn or_list<T>(items: &[T], name: impl Fn(&T) -> String) -> String {
    items.iter().map(name).collect::<Vec<_>>().join(" or ")
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
    /// The residency fact (the pass adds recomputes or transfers).
    pub residency: bool,
}

/// A pass's declarations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Contract {
    /// The facts it needs.
    pub requires: Requires,
    /// What it may change.
    pub changes: Changes,
    /// The layout kind the pass establishes, whether or not it changes the plan at a given size:
    /// later passes' requirements are checked against it as well as against the plan's facts.
    pub establishes: Option<LayoutKind>,
}

impl Contract {
    /// A contract that establishes no layout.
    pub fn new(requires: Requires, changes: Changes) -> Contract {
        Contract {
            requires,
            changes,
            establishes: None,
        }
    }

    /// The same contract, establishing `layout`.
    pub fn establishing(self, layout: LayoutKind) -> Contract {
        Contract {
            establishes: Some(layout),
            ..self
        }
    }
}

/// A schedule pass, as built-ins and users write it.
pub trait Pass: Send + Sync {
    /// The pass's name, as written in expressions and blamed in errors: its one home.
    fn name(&self) -> &str;

    /// The facts it needs, what it may change, the layout it establishes.
    fn contract(&self) -> Contract;

    /// A one-line description with the pass's arguments, e.g. `vpp(chunks=2, layout=standard)`.
    fn describe(&self) -> String {
        self.name().to_string()
    }

    /// Checks the preconditions the pass states in its doc (beyond its contract, which the driver
    /// checks first) and rewrites the plan.
    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError>;
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
            residency: Requires::KEPT,
        };
        let facts = |pacing, layout, backwards| Facts {
            layout,
            pacing,
            backwards,
            residency: Residency::KEPT,
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
