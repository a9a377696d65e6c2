//! Typed facts about a plan: what kind of schedule it is, so that passes decide from facts, never
//! from the names of the passes that built it.
//!
//! - [`Layout`]: how stages sit on ranks — linear (stage `s` on rank `s`), interleaved chunks in the
//!   standard or the V placement, a bidirectional DualPipe / DualPipeV layout, or anything else
//!   (`Custom`, e.g. an imported schedule).
//! - [`Pacing`]: the rhythm of the orders — unscheduled, fill-drain (all forwards, then all
//!   backwards, as GPipe), one-forward-one-backward (1F1B and its refinements), or custom.
//! - [`Backwards`]: whether every backward is whole (`B`, or inside an overlapped F&B) or some are
//!   split into input- and weight-gradient halves (`I`, `W`).
//! - [`Residency`]: whether every forward's activations stay on the device until its backward, or
//!   some are dropped and recomputed, or offloaded to host memory and reloaded.
//!
//! A [`Layout`] is checked against the problem it describes ([`Layout::check`]): a plan cannot
//! claim the V placement while its stages sit elsewhere. [`Backwards::Whole`] is checked against
//! the orders by [`crate::Plan`]'s constructors, and so is [`Residency`], which must say exactly
//! what the orders hold. The pacing is a declaration of the pass that
//! wrote the orders; the verifier checks the orders themselves.
//!
//! This module is also the one home of the chunk placements' arithmetic
//! ([`ChunkPlacement::stage`]): chunk `c` of rank `r` is stage `c·P + r` in the standard placement,
//! stage `r` or `2P - 1 - r` in the V.

use crate::error::CoreError;
use crate::ir::ids::{RankId, StageId};
use crate::ir::op::Task;
use crate::ir::problem::Problem;
use std::fmt;

/// How a rank's chunks are placed when each rank holds several stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChunkPlacement {
    /// Chunk `c` of rank `r` is stage `c·P + r`: a microbatch loops over the ranks.
    Standard,
    /// Two chunks in a V: rank `r` holds stages `r` and `2P - 1 - r`.
    V,
}

impl ChunkPlacement {
    /// The global stage of local chunk `chunk` on `rank` of `ranks`.
    pub fn stage(self, ranks: u32, rank: u32, chunk: u32) -> StageId {
        StageId::new(match self {
            ChunkPlacement::Standard => chunk * ranks + rank,
            ChunkPlacement::V if chunk == 0 => rank,
            ChunkPlacement::V => 2 * ranks - 1 - rank,
        })
    }

    /// The name used in expressions (`layout=standard`, `layout=v`).
    pub fn name(self) -> &'static str {
        match self {
            ChunkPlacement::Standard => "standard",
            ChunkPlacement::V => "v",
        }
    }
}

/// Which bidirectional pipeline a dual plan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DualKind {
    /// DeepSeek's DualPipe: every stage mirrored on the opposite rank, two routes.
    DualPipe,
    /// DeepSeek's DualPipeV: the V placement, one route down and back up the ranks.
    DualPipeV,
}

/// How stages are placed on ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// One stage per rank, stage `s` on rank `s`, one route through all stages in order.
    Linear,
    /// Every rank holds `chunks` stages placed as `placement` says; one route through all stages.
    Interleaved {
        /// Stages per rank (at least 2).
        chunks: u32,
        /// Where each chunk sits.
        placement: ChunkPlacement,
    },
    /// A bidirectional pipeline.
    Dual(DualKind),
    /// Any other placement.
    Custom,
}

/// A [`Layout`] without its data: what a pass's requirements name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// [`Layout::Linear`].
    Linear,
    /// [`Layout::Interleaved`], either placement.
    Interleaved,
    /// [`Layout::Dual`], either kind.
    Dual,
    /// [`Layout::Custom`].
    Custom,
}

impl LayoutKind {
    /// Every kind.
    pub const ALL: &'static [LayoutKind] = &[
        LayoutKind::Linear,
        LayoutKind::Interleaved,
        LayoutKind::Dual,
        LayoutKind::Custom,
    ];

    /// What the kind means, as a constraint in an error message.
    pub fn describe(self) -> &'static str {
        match self {
            LayoutKind::Linear => "plain layout: one stage per rank, stage s on rank s, one route",
            LayoutKind::Interleaved => "interleaved chunks on every rank",
            LayoutKind::Dual => "a bidirectional (DualPipe or DualPipeV) layout",
            LayoutKind::Custom => "a custom layout",
        }
    }
}

impl Layout {
    /// The kind of layout.
    pub fn kind(self) -> LayoutKind {
        match self {
            Layout::Linear => LayoutKind::Linear,
            Layout::Interleaved { .. } => LayoutKind::Interleaved,
            Layout::Dual(_) => LayoutKind::Dual,
            Layout::Custom => LayoutKind::Custom,
        }
    }

    /// The layout a problem has on its own: `Linear` when it is the plain layout, else `Custom`.
    pub fn of_problem(problem: &Problem) -> Layout {
        if problem.is_linear() {
            Layout::Linear
        } else {
            Layout::Custom
        }
    }

    /// Checks that `problem` really has this layout.
    pub fn check(self, problem: &Problem) -> Result<(), CoreError> {
        let p = problem.ranks();
        let placed = |chunks: u32, placement: ChunkPlacement| {
            problem.stages() == chunks * p
                && (0..p).all(|rank| {
                    (0..chunks).all(|chunk| {
                        problem.rank_of(placement.stage(p, rank, chunk)) == Some(RankId::new(rank))
                    })
                })
        };
        let one_route_in_order = problem.routes().len() == 1
            && problem.tied_stages().is_empty()
            && problem.routes()[0]
                .stages()
                .iter()
                .enumerate()
                .all(|(i, s)| s.index() == i);
        let holds = match self {
            Layout::Linear => problem.is_linear(),
            Layout::Interleaved { chunks, placement } => {
                chunks >= 2
                    && (placement == ChunkPlacement::Standard || chunks == 2)
                    && placed(chunks, placement)
                    && one_route_in_order
            }
            Layout::Dual(DualKind::DualPipeV) => placed(2, ChunkPlacement::V) && one_route_in_order,
            Layout::Dual(DualKind::DualPipe) => is_dualpipe(problem),
            Layout::Custom => true,
        };
        if holds {
            Ok(())
        } else {
            Err(CoreError::InvalidProblem(format!(
                "the plan claims the {self} layout, but its {} stages on {p} ranks with {} route(s) are placed otherwise",
                problem.stages(),
                problem.routes().len()
            )))
        }
    }

    /// Stages per rank when every rank holds the same number in a known layout.
    pub fn chunks(self) -> Option<u32> {
        match self {
            Layout::Linear => Some(1),
            Layout::Interleaved { chunks, .. } => Some(chunks),
            Layout::Dual(_) => Some(2),
            Layout::Custom => None,
        }
    }

    /// Whether ranks hold their two stages in a V (rank `r`: stages `r` and `2P - 1 - r`) with
    /// one route down and back up: the interleaved V placement, DualPipeV, and the standard
    /// two-chunk placement of a single rank (where both coincide).
    pub fn is_v_shaped(self, ranks: u32) -> bool {
        match self {
            Layout::Interleaved {
                chunks: 2,
                placement,
            } => placement == ChunkPlacement::V || ranks == 1,
            Layout::Dual(DualKind::DualPipeV) => true,
            _ => false,
        }
    }
}

/// DualPipe: stage `i` on rank `i`, its mirror `P + i` on rank `P - 1 - i` with tied weights; the
/// first half of the microbatches through stages `0..P`, the rest through `P..2P`.
fn is_dualpipe(problem: &Problem) -> bool {
    let p = problem.ranks();
    let m = problem.microbatches();
    let routes = problem.routes();
    problem.stages() == 2 * p
        && (0..p).all(|i| {
            problem.rank_of(StageId::new(i)) == Some(RankId::new(i))
                && problem.rank_of(StageId::new(p + i)) == Some(RankId::new(p - 1 - i))
        })
        && routes.len() == 2
        && routes[0].first().get() == 0
        && routes[1].end().get() == m
        && routes[0]
            .stages()
            .iter()
            .enumerate()
            .all(|(i, s)| s.index() == i)
        && routes[1]
            .stages()
            .iter()
            .enumerate()
            .all(|(i, s)| s.index() == p as usize + i)
        && problem.tied_stages().len() == p as usize
        && problem
            .tied_stages()
            .iter()
            .enumerate()
            .all(|(i, g)| g.len() == 2 && g[0].index() == i && g[1].index() == p as usize + i)
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Linear => write!(f, "linear"),
            Layout::Interleaved { chunks, placement } => {
                write!(
                    f,
                    "interleaved ({chunks} chunks, {} placement)",
                    placement.name()
                )
            }
            Layout::Dual(DualKind::DualPipe) => write!(f, "DualPipe"),
            Layout::Dual(DualKind::DualPipeV) => write!(f, "DualPipeV"),
            Layout::Custom => write!(f, "custom"),
        }
    }
}

/// The rhythm of a plan's orders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pacing {
    /// No order yet: every rank's order is empty.
    Unscheduled,
    /// All forwards, then all backwards (GPipe, breadth-first interleaving).
    FillDrain,
    /// A warm-up of forwards, then forwards and backwards alternating, then a cool-down (1F1B,
    /// interleaved 1F1B, DualPipe, Zero Bubble's refinements).
    OneForwardOneBackward,
    /// Anything else (imported schedules, users' passes).
    Custom,
}

impl fmt::Display for Pacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Pacing::Unscheduled => "unscheduled",
            Pacing::FillDrain => "fill-drain",
            Pacing::OneForwardOneBackward => "one-forward-one-backward",
            Pacing::Custom => "custom",
        })
    }
}

/// Whether backwards are whole or split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backwards {
    /// Every backward runs whole (`B`, or inside an overlapped F&B).
    Whole,
    /// Backwards may run as separate input- and weight-gradient halves (`I` and `W` tasks).
    Split,
}

impl Backwards {
    /// What the orders hold: `Split` when any task is a lone I or W.
    pub fn of_orders(orders: &[Vec<Task>]) -> Backwards {
        let split = orders
            .iter()
            .flatten()
            .any(|t| matches!(t, Task::InputGrad(_) | Task::WeightGrad(_)));
        if split {
            Backwards::Split
        } else {
            Backwards::Whole
        }
    }
}

impl fmt::Display for Backwards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backwards::Whole => "whole backwards",
            Backwards::Split => "split backwards",
        })
    }
}

/// Where a plan keeps the forwards' activations until their backwards.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Residency {
    /// Some forwards' activations are dropped after the forward and recomputed (`R` tasks).
    pub recomputed: bool,
    /// Some forwards' activations are moved to host memory and back (`OFFLOAD`, `RELOAD`).
    pub offloaded: bool,
}

impl Residency {
    /// Every activation stays on the device from its forward to its backward.
    pub const KEPT: Residency = Residency {
        recomputed: false,
        offloaded: false,
    };

    /// What the orders hold.
    pub fn of_orders(orders: &[Vec<Task>]) -> Residency {
        let mut found = Residency::KEPT;
        for task in orders.iter().flatten() {
            match task {
                Task::Recompute(_) | Task::RecomputeWeightGrad(_) => found.recomputed = true,
                Task::Offload(_) | Task::Reload(_) => found.offloaded = true,
                _ => {}
            }
        }
        found
    }

    /// Whether every activation stays on the device.
    pub fn is_kept(self) -> bool {
        self == Residency::KEPT
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.recomputed, self.offloaded) {
            (false, false) => "activations kept",
            (true, false) => "recomputed activations",
            (false, true) => "offloaded activations",
            (true, true) => "recomputed and offloaded activations",
        })
    }
}

/// Everything a plan says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Facts {
    /// Placement of stages on ranks.
    pub layout: Layout,
    /// Rhythm of the orders.
    pub pacing: Pacing,
    /// Whole or split backwards.
    pub backwards: Backwards,
    /// Where activations live between forward and backward.
    pub residency: Residency,
}

impl fmt::Display for Facts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} layout, {} pacing, {}",
            self.layout, self.pacing, self.backwards
        )?;
        if !self.residency.is_kept() {
            write!(f, ", {}", self.residency)?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ir::problem::ProblemSpec;

    /// A problem of `ranks` ranks and 4 microbatches, stage `s` on rank `stage_to_rank[s]` (also
    /// the profile tests').
    pub(crate) fn placed(ranks: u32, stage_to_rank: Vec<u32>) -> Problem {
        ProblemSpec::builder()
            .ranks(ranks)
            .microbatches(4)
            .stage_to_rank(stage_to_rank)
            .build()
            .validate()
            .unwrap()
    }

    #[test]
    fn chunk_placements_place_stages() {
        assert_eq!(ChunkPlacement::Standard.stage(4, 1, 1), StageId::new(5));
        assert_eq!(ChunkPlacement::V.stage(4, 1, 0), StageId::new(1));
        assert_eq!(ChunkPlacement::V.stage(4, 1, 1), StageId::new(6));
    }

    #[test]
    fn layouts_are_checked_against_the_problem() {
        let standard = placed(2, vec![0, 1, 0, 1]);
        let v = placed(2, vec![0, 1, 1, 0]);
        let interleaved = |placement| Layout::Interleaved {
            chunks: 2,
            placement,
        };
        assert!(interleaved(ChunkPlacement::Standard)
            .check(&standard)
            .is_ok());
        assert!(interleaved(ChunkPlacement::V).check(&v).is_ok());
        assert!(Layout::Dual(DualKind::DualPipeV).check(&v).is_ok());
        let err = interleaved(ChunkPlacement::V).check(&standard).unwrap_err();
        assert!(
            err.to_string()
                .contains("claims the interleaved (2 chunks, v placement) layout"),
            "{err}"
        );
        assert!(Layout::Linear.check(&standard).is_err());
        assert!(Layout::Custom.check(&standard).is_ok());
        assert_eq!(Layout::of_problem(&standard), Layout::Custom);
        assert!(interleaved(ChunkPlacement::Standard).is_v_shaped(1));
        assert!(!interleaved(ChunkPlacement::Standard).is_v_shaped(2));
    }

    #[test]
    fn dualpipe_layout_needs_mirrors_routes_and_ties() {
        let dual = Layout::Dual(DualKind::DualPipe);
        assert!(dual
            .check(&ProblemSpec::dualpipe(2, 4).validate().unwrap())
            .is_ok());
        // The same placement without routes or ties is not DualPipe.
        assert!(dual.check(&placed(2, vec![0, 1, 1, 0])).is_err());
    }

    #[test]
    fn backwards_come_from_the_orders() {
        let whole: Vec<Vec<Task>> = vec![vec!["0F0".parse().unwrap(), "0B0".parse().unwrap()]];
        let split: Vec<Vec<Task>> = vec![vec!["0I0".parse().unwrap()]];
        assert_eq!(Backwards::of_orders(&whole), Backwards::Whole);
        assert_eq!(Backwards::of_orders(&split), Backwards::Split);
    }

    #[test]
    fn residency_comes_from_the_orders() {
        let orders = |cells: &[&str]| -> Vec<Vec<Task>> {
            vec![cells.iter().map(|c| c.parse().unwrap()).collect()]
        };
        assert!(Residency::of_orders(&orders(&["0F0", "0B0"])).is_kept());
        let both = Residency::of_orders(&orders(&["0F0", "0R0", "0F1", "0OFFLOAD1"]));
        assert_eq!(
            both,
            Residency {
                recomputed: true,
                offloaded: true
            }
        );
        assert_eq!(both.to_string(), "recomputed and offloaded activations");
    }
}
