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
///
/// Built with [`Requires::paced`] (the accepted pacings, any layout, whole or split backwards,
/// activations kept), then narrowed with [`Requires::on_layouts`] and
/// [`Requires::with_whole_backwards`] or widened with [`Requires::with_residency`] (see
/// [`Contract`]). The fields stay public for contracts built from data (a Python pass's
/// registration).
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

/// Some activations recomputed, none offloaded.
const RECOMPUTED: Residency = Residency {
    recomputed: true,
    offloaded: false,
};

/// Some activations offloaded, none recomputed.
const OFFLOADED: Residency = Residency {
    recomputed: false,
    offloaded: true,
};

impl Requires {
    /// Only plans that keep every activation on the device.
    pub const KEPT: &'static [Residency] = &[Residency::KEPT];

    /// Plans with no activation offloaded (kept, or some recomputed).
    pub const KEPT_OR_RECOMPUTED: &'static [Residency] = &[Residency::KEPT, RECOMPUTED];

    /// Plans with no activation recomputed (kept, or some offloaded).
    pub const KEPT_OR_OFFLOADED: &'static [Residency] = &[Residency::KEPT, OFFLOADED];

    /// Any residency.
    pub const ANY_RESIDENCY: &'static [Residency] = &[
        Residency::KEPT,
        RECOMPUTED,
        OFFLOADED,
        Residency {
            recomputed: true,
            offloaded: true,
        },
    ];

    /// Any pacing but unscheduled: plans that have orders.
    pub const SCHEDULED: &'static [Pacing] = &[
        Pacing::FillDrain,
        Pacing::OneForwardOneBackward,
        Pacing::Custom,
    ];

    /// Any plan.
    pub const ANY: Requires = Requires::paced(&[
        Pacing::Unscheduled,
        Pacing::FillDrain,
        Pacing::OneForwardOneBackward,
        Pacing::Custom,
    ])
    .with_residency(Requires::ANY_RESIDENCY);

    /// Plans of one of `pacing`, on any layout, with whole or split backwards, every activation
    /// kept ([`Requires::KEPT`]).
    pub const fn paced(pacing: &'static [Pacing]) -> Requires {
        Requires {
            pacing,
            layout: LayoutKind::ALL,
            whole_backwards: false,
            residency: Requires::KEPT,
        }
    }

    /// The same, on one of `layout` only.
    pub const fn on_layouts(self, layout: &'static [LayoutKind]) -> Requires {
        Requires { layout, ..self }
    }

    /// The same, with every backward whole.
    pub const fn with_whole_backwards(self) -> Requires {
        Requires {
            whole_backwards: true,
            ..self
        }
    }

    /// The same, accepting the activation residencies `residency` (in place of the current list).
    pub const fn with_residency(self, residency: &'static [Residency]) -> Requires {
        Requires { residency, ..self }
    }

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
///
/// Built from [`Changes::NONE`] and one constant per field, joined with [`Changes::and`]:
/// `Changes::PLACEMENT.and(Changes::LAYOUT)`. The fields stay public for changes read from data
/// (a Python pass's registration) or decided at run time (`Changes { backwards: flag,
/// ..Changes::NONE }`).
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

/// One field of [`Changes`], to build its constants.
#[derive(Clone, Copy)]
enum Field {
    Placement,
    Layout,
    Pacing,
    Backwards,
    MemoryLimit,
    Residency,
}

impl Changes {
    /// Nothing besides the orders (the same as [`Changes::default`]).
    pub const NONE: Changes = Changes {
        placement: false,
        layout: false,
        pacing: false,
        backwards: false,
        memory_limit: false,
        residency: false,
    };
    /// The problem and the models ([`Changes::placement`]).
    pub const PLACEMENT: Changes = Changes::NONE.with(Field::Placement);
    /// The layout fact ([`Changes::layout`]).
    pub const LAYOUT: Changes = Changes::NONE.with(Field::Layout);
    /// The pacing fact ([`Changes::pacing`]).
    pub const PACING: Changes = Changes::NONE.with(Field::Pacing);
    /// The backwards fact ([`Changes::backwards`]).
    pub const BACKWARDS: Changes = Changes::NONE.with(Field::Backwards);
    /// The declared memory limit ([`Changes::memory_limit`]).
    pub const MEMORY_LIMIT: Changes = Changes::NONE.with(Field::MemoryLimit);
    /// The residency fact ([`Changes::residency`]).
    pub const RESIDENCY: Changes = Changes::NONE.with(Field::Residency);

    /// What `self` or `other` may change.
    pub const fn and(self, other: Changes) -> Changes {
        Changes {
            placement: self.placement || other.placement,
            layout: self.layout || other.layout,
            pacing: self.pacing || other.pacing,
            backwards: self.backwards || other.backwards,
            memory_limit: self.memory_limit || other.memory_limit,
            residency: self.residency || other.residency,
        }
    }

    /// The same, and `field`.
    const fn with(mut self, field: Field) -> Changes {
        match field {
            Field::Placement => self.placement = true,
            Field::Layout => self.layout = true,
            Field::Pacing => self.pacing = true,
            Field::Backwards => self.backwards = true,
            Field::MemoryLimit => self.memory_limit = true,
            Field::Residency => self.residency = true,
        }
        self
    }
}

/// A pass's declarations.
///
/// `vpp`'s, for one: fill-drain or 1F1B pacing on the linear layout with whole backwards; it may
/// change the placement and the layout, and establishes an interleaved one.
/// ```
/// use pipeweave_core::{LayoutKind, Pacing};
/// use pipeweave_transforms::{Changes, Contract, Requires};
///
/// let contract = Contract::new(
///     Requires::paced(&[Pacing::FillDrain, Pacing::OneForwardOneBackward])
///         .on_layouts(&[LayoutKind::Linear])
///         .with_whole_backwards(),
///     Changes::PLACEMENT.and(Changes::LAYOUT),
/// )
/// .establishing(LayoutKind::Interleaved);
/// assert!(contract.requires.whole_backwards && !contract.changes.pacing);
/// ```
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
    pub const fn new(requires: Requires, changes: Changes) -> Contract {
        Contract {
            requires,
            changes,
            establishes: None,
        }
    }

    /// The same contract, establishing `layout`.
    pub const fn establishing(self, layout: LayoutKind) -> Contract {
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
        let requires = Requires::paced(&[Pacing::FillDrain])
            .on_layouts(&[LayoutKind::Linear])
            .with_whole_backwards();
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

    #[test]
    fn each_constant_sets_the_field_it_names() {
        let fields = |c: Changes| {
            [
                c.placement,
                c.layout,
                c.pacing,
                c.backwards,
                c.memory_limit,
                c.residency,
            ]
        };
        let singles = [
            Changes::PLACEMENT,
            Changes::LAYOUT,
            Changes::PACING,
            Changes::BACKWARDS,
            Changes::MEMORY_LIMIT,
            Changes::RESIDENCY,
        ];
        for (i, single) in singles.into_iter().enumerate() {
            let set: Vec<usize> = (0..6).filter(|&j| fields(single)[j]).collect();
            assert_eq!(set, [i], "{single:?}");
        }
        assert_eq!(Changes::NONE, Changes::default());
        assert_eq!(
            fields(Changes::BACKWARDS.and(Changes::MEMORY_LIMIT)),
            [false, false, false, true, true, false]
        );
        let any_pacing = [
            Pacing::Unscheduled,
            Pacing::FillDrain,
            Pacing::OneForwardOneBackward,
            Pacing::Custom,
        ];
        assert_eq!(Requires::ANY.pacing, any_pacing);
        let any = Requires::ANY;
        assert_eq!((any.layout, any.whole_backwards), (LayoutKind::ALL, false));
        assert_eq!(any.residency.len(), 4);
        assert_eq!(Requires::SCHEDULED, &any_pacing[1..]);
    }
}
