//! What the verifier finds: one broken invariant ([`Violation`], naming where it broke) and the
//! report of a plan ([`Violations`], an error of its own), as they are shown.

use crate::analysis::replay::{Blocked, ReplayError};
use crate::ir::ids::RankId;
use crate::ir::op::{Op, Task, Work};
use std::fmt;

/// One broken invariant, naming where it broke.
#[derive(Clone, Debug, PartialEq)]
pub enum Violation {
    /// An op's stage or microbatch is out of range, or the stage is not on the microbatch's route.
    OutOfRange {
        /// The rank whose order holds it.
        rank: RankId,
        /// Index in that order.
        position: usize,
        /// The op.
        op: Op,
        /// Why.
        reason: String,
    },
    /// An overlapped F&B pairs a backward with its own forward, which it depends on.
    SelfOverlap {
        /// The rank.
        rank: RankId,
        /// Index in its order.
        position: usize,
        /// The work (stage, microbatch).
        work: Work,
    },
    /// An op runs on a rank that does not own its stage.
    WrongRank {
        /// The op.
        op: Op,
        /// Where it was placed.
        placed_on: RankId,
        /// Who owns its stage.
        owner: RankId,
    },
    /// An op appears more than once.
    Duplicate {
        /// The op.
        op: Op,
        /// Rank of the repeated occurrence.
        rank: RankId,
        /// Rank of the first occurrence.
        first_on: RankId,
    },
    /// An op appears nowhere.
    Missing {
        /// The op.
        op: Op,
        /// The rank that owns its stage.
        owner: RankId,
    },
    /// A dependency on the same rank comes later in its order.
    DependencyOrder {
        /// The rank.
        rank: RankId,
        /// The op that runs too early.
        op: Op,
        /// The op it needs, which comes later.
        needs: Op,
    },
    /// The orders and dependencies form a cycle: each rank waits for an op of the next.
    Cycle(Vec<Blocked>),
    /// More violations were found than a report lists (a plan missing almost everything); only
    /// their number is kept.
    Omitted {
        /// How many.
        count: usize,
    },
    /// A rank's activation memory exceeds the declared bound.
    MemoryBound {
        /// The rank.
        rank: RankId,
        /// Its peak.
        peak: f64,
        /// The bound.
        limit: f64,
        /// The task at which the peak is first reached.
        at: Task,
    },
    /// A recompute or transfer is misplaced (invariant 7).
    Residency {
        /// The rank whose order holds it.
        rank: RankId,
        /// Index in that order.
        position: usize,
        /// The task.
        task: Task,
        /// What is wrong.
        reason: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::OutOfRange { rank, position, op, reason } => write!(
                f,
                "op {op} at position {position} on rank {rank}: {reason}"
            ),
            Violation::WrongRank { op, placed_on, owner } => write!(
                f,
                "op {op} runs on rank {placed_on}, but stage {} is placed on rank {owner}",
                op.stage
            ),
            Violation::Duplicate { op, rank, first_on } => write!(
                f,
                "op {op} (stage {}, microbatch {}) runs twice: on rank {first_on} and again on rank {rank}",
                op.stage, op.microbatch
            ),
            Violation::Missing { op, owner } => write!(
                f,
                "op {op} (stage {}, microbatch {}) is missing from rank {owner}",
                op.stage, op.microbatch
            ),
            Violation::DependencyOrder { rank, op, needs } => write!(
                f,
                "on rank {rank}, op {op} (stage {}) runs before {needs}, which it depends on",
                op.stage
            ),
            Violation::Cycle(waits) => {
                write!(f, "deadlock: ")?;
                for (i, w) in waits.iter().enumerate() {
                    if i > 0 {
                        write!(f, "; ")?;
                    }
                    write!(f, "{w}")?;
                }
                Ok(())
            }
            Violation::SelfOverlap { rank, position, work } => write!(
                f,
                "task {position} on rank {rank} overlaps the backward of stage {} microbatch {} with its own forward",
                work.stage, work.microbatch
            ),
            Violation::Omitted { count } => {
                write!(f, "{count} more violation(s) of the same checks, not listed")
            }
            Violation::MemoryBound { rank, peak, limit, at } => write!(
                f,
                "rank {rank} holds {peak:.4} activations after {at} (stage {}), above the limit {limit}",
                at.work().stage
            ),
            Violation::Residency { rank, position, task, reason } => write!(
                f,
                "task {task} at position {position} on rank {rank}: {reason}"
            ),
        }
    }
}

/// Every violation found in one plan: the verifier's report, an error of its own (after a pass,
/// always a bug in that pass; on an imported schedule, a fault of the file).
#[derive(Clone, Debug, PartialEq)]
pub struct Violations(pub Vec<Violation>);

impl std::error::Error for Violations {}

impl Violations {
    /// Whether every violation is of the declared memory bound (the plan is otherwise sound).
    pub fn only_memory(&self) -> bool {
        !self.0.is_empty()
            && self
                .0
                .iter()
                .all(|v| matches!(v, Violation::MemoryBound { .. }))
    }
}

/// How many violations [`Violations`]'s `Display` lists before summarising the rest.
const SHOWN: usize = 12;

impl fmt::Display for Violations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} violation(s)", self.0.len())?;
        for v in self.0.iter().take(SHOWN) {
            write!(f, "\n  - {v}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, "\n  ... and {} more", self.0.len() - SHOWN)?;
        }
        Ok(())
    }
}

impl From<ReplayError> for Violation {
    /// What the replay engine found, in the verifier's terms.
    fn from(stuck: ReplayError) -> Violation {
        match stuck {
            ReplayError::Deadlock(waits) => Violation::Cycle(waits),
            ReplayError::OutOfRange(rank, position, op) => Violation::OutOfRange {
                rank,
                position,
                op,
                reason: "out of range".to_string(),
            },
            ReplayError::RunsTwice(rank, _, op) => Violation::Duplicate {
                op,
                rank,
                first_on: rank,
            },
        }
    }
}
