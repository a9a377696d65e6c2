//! The plan verifier. Running it on a plan produced by a pass is always cheap enough to do after
//! every pass; a failure there is a bug in the pass, never a user error.
//!
//! Invariants, in the order they are checked (every violation is collected, not just the first):
//!
//! 1. **Ranges.** Every op's stage is below the stage count and its microbatch below the microbatch
//!    count, and the stage lies on that microbatch's route.
//! 2. **Placement.** Every op runs on the rank that owns its stage, and an overlapped F&B pairs
//!    work of different (stage, microbatch) pairs (a backward cannot overlap its own forward).
//! 3. **Exactly once.** Every op (F, I and W of every (stage, microbatch) pair on a route) appears
//!    exactly once over all orders; none is missing, none is repeated.
//! 4. **Dependency order on a rank.** When an op and an op it depends on (F along the route, I back
//!    along it, W after its I) run on the same rank, the dependency comes first in that rank's order.
//! 5. **Acyclic.** The per-rank orders together with the dependencies admit an execution: replaying
//!    them as early as possible finishes every rank. Otherwise the cycle of waiting ranks is reported.
//! 6. **Memory bound.** When the plan declares a per-rank activation-memory limit, no rank's held
//!    activations on the device ([`crate::analysis::peak`]: F adds `total`, I frees
//!    `total - weight_grad`, W frees `weight_grad`, with the residency tasks' moves) exceed it.
//! 7. **Residency.** Every recompute and transfer names an existing (stage, microbatch) pair and
//!    runs on the rank of its stage; a pair is recomputed at most once, offloaded and reloaded at
//!    most once each, never both recomputed and offloaded, and an offload has its reload; on the
//!    rank, the pair's F comes before its R, and the R before the task running its I; F before
//!    OFFLOAD, OFFLOAD before RELOAD, RELOAD before the I.
//!
//! Check 7 runs right after 1 to 3 (the replay of check 5 relies on it); checks 4 to 7 run only
//! when 1 to 3 hold, because they are meaningless on an incomplete plan.
//!
//! Shortcuts keep a sound plan cheap and leave every report as it is. Check 3 counts the ops it
//! sees and looks for missing ones only when the count falls short. The replay of check 5 runs
//! before check 4's pass: a plan it runs to the end respects 4 (an op needing a later op of its
//! own rank blocks that rank on itself; inside one task, every task kind runs an op's
//! dependencies before it), so check 4's pass runs only after a failed replay, whose cycle is
//! reported when check 4 finds nothing.

use crate::analysis::peak::peak_per_rank;
use crate::analysis::replay::{replay_linked, Blocked, ReplayError};
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, OpKind, Task, Work};
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use std::fmt;
use std::ops::ControlFlow;

/// Tolerance on the memory bound (floating-point sums of fractions).
const MEMORY_EPSILON: f64 = 1e-9;

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

/// Checks every invariant of the module doc; `Ok` or the full list of violations.
pub fn verify(plan: &Plan) -> Result<(), Violations> {
    into_result(violations(plan))
}

/// Checks invariants 1 to 5 and leaves out the memory bound: the check for intermediate plans of
/// a pass pipeline, whose memory only the final plan must respect.
pub fn verify_schedule(plan: &Plan) -> Result<(), Violations> {
    into_result(collect(plan, false))
}

fn into_result(violations: Vec<Violation>) -> Result<(), Violations> {
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Violations(violations))
    }
}

/// Which rank each op was seen on (`NOT_SEEN` for none; ranks are fewer than
/// [`crate::ir::problem::MAX_RANKS`], so a `u16` holds one), and how many distinct ops were.
struct Seen {
    rank: Vec<u16>,
    distinct: usize,
}

/// Marks an op no order holds, in [`Seen`].
const NOT_SEEN: u16 = u16::MAX;

/// Every violation of `plan` (empty when it is sound).
pub fn violations(plan: &Plan) -> Vec<Violation> {
    collect(plan, true)
}

/// Most violations one report holds; the rest are counted in [`Violation::Omitted`], so a plan
/// that misses almost everything costs no memory beyond its tables.
pub const MAX_LISTED: usize = 10_000;

fn collect(plan: &Plan, with_memory: bool) -> Vec<Violation> {
    let mut out = Report::default();
    let links = Links::of(plan.problem());
    let seen = check_structure(plan, &links, &mut out);
    if !out.is_empty() {
        return out.finish();
    }
    if plan.manages_residency() {
        check_residency(plan, &links, &mut out);
        if !out.is_empty() {
            return out.finish();
        }
    }
    // Check 5's replay before check 4's pass (see the module doc).
    if let Err(stuck) = replay_linked(plan, &links, |_: &Task| 1.0, 0.0, false) {
        check_local_order(plan, &links, &seen, &mut out);
        if out.is_empty() {
            out.push(stuck.into());
        }
    }
    if with_memory {
        check_memory(plan, &mut out);
    }
    out.finish()
}

/// The violations found so far: the first [`MAX_LISTED`], and how many more.
#[derive(Default)]
struct Report {
    list: Vec<Violation>,
    omitted: usize,
}

impl Report {
    fn push(&mut self, violation: Violation) {
        if self.list.len() < MAX_LISTED {
            self.list.push(violation);
        } else {
            self.omitted += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn finish(mut self) -> Vec<Violation> {
        if self.omitted > 0 {
            self.list.push(Violation::Omitted {
                count: self.omitted,
            });
        }
        self.list
    }
}

fn check_structure(plan: &Plan, links: &Links, out: &mut Report) -> Seen {
    let mut seen = Seen {
        rank: vec![NOT_SEEN; links.slots().len()],
        distinct: 0,
    };
    for (r, order) in plan.orders().iter().enumerate() {
        let rank = RankId::new(r as u32);
        for (position, task) in order.iter().enumerate() {
            if let Task::Overlapped { forward, backward } = *task {
                if forward == backward {
                    out.push(Violation::SelfOverlap {
                        rank,
                        position,
                        work: forward,
                    });
                }
            }
            let _ = task.try_for_each_op(|op| {
                check_op(plan, links, (rank, position), op, &mut seen, out);
                ControlFlow::<()>::Continue(())
            });
        }
    }
    if seen.distinct < plan.problem().work_count() * 3 {
        check_complete(plan, links, &seen, out);
    }
    seen
}

/// Invariants 1 to 3 for one op of the task at `position` on `rank`.
fn check_op(
    plan: &Plan,
    links: &Links,
    (rank, position): (RankId, usize),
    op: Op,
    seen: &mut Seen,
    out: &mut Report,
) {
    let Some(slot) = links.slot(op) else {
        out.push(out_of_range(plan.problem(), rank, position, op));
        return;
    };
    let owner = links.owner(op.stage).expect("stage checked in range above");
    if owner != rank {
        out.push(Violation::WrongRank {
            op,
            placed_on: rank,
            owner,
        });
    }
    let first = seen.rank[slot];
    if first != NOT_SEEN {
        out.push(Violation::Duplicate {
            op,
            rank,
            first_on: RankId::new(first.into()),
        });
        return;
    }
    seen.rank[slot] = rank.get() as u16;
    seen.distinct += 1;
}

/// The violation of an op whose (stage, microbatch) pair does not exist, saying why.
fn out_of_range(problem: &Problem, rank: RankId, position: usize, op: Op) -> Violation {
    let reason = if op.stage.get() >= problem.stages() {
        format!(
            "stage {} is out of range (the plan has {} stages)",
            op.stage,
            problem.stages()
        )
    } else if op.microbatch.get() >= problem.microbatches() {
        format!(
            "microbatch {} is out of range (the plan has {} microbatches)",
            op.microbatch,
            problem.microbatches()
        )
    } else {
        format!(
            "stage {} is not on the route of microbatch {}",
            op.stage, op.microbatch
        )
    };
    Violation::OutOfRange {
        rank,
        position,
        op,
        reason,
    }
}

/// Invariant 3's other half: every op of every pair on a route was seen (only ops of such pairs
/// are counted as seen, so a full count means none is missing).
fn check_complete(plan: &Plan, links: &Links, seen: &Seen, out: &mut Report) {
    let problem = plan.problem();
    let slots = links.slots();
    for route in problem.routes() {
        for mb in route.first().get()..route.end().get() {
            for &stage in route.stages() {
                for kind in OpKind::ALL {
                    let op = Work {
                        stage,
                        microbatch: mb.into(),
                    }
                    .op(kind);
                    let slot = slots
                        .op(op)
                        .expect("route stages and microbatches are in range");
                    if seen.rank[slot] == NOT_SEEN {
                        let owner = links.owner(stage).expect("route stages are in range");
                        out.push(Violation::Missing { op, owner });
                    }
                }
            }
        }
    }
}

/// Invariant 4 (run only to explain a failed replay, see the module doc).
fn check_local_order(plan: &Plan, links: &Links, seen: &Seen, out: &mut Report) {
    let position = positions(plan, links);
    for (r, order) in plan.orders().iter().enumerate() {
        for (at, task) in order.iter().enumerate() {
            let (ops, count) = task.op_array();
            let ops = &ops[..count];
            for (i, &op) in ops.iter().enumerate() {
                let located = links.locate(op).expect("structure checked first");
                for &(dep, slot) in &located.deps {
                    if usize::from(seen.rank[slot]) != r {
                        continue;
                    }
                    let dep_at = position[slot] as usize;
                    let inside_before = dep_at == at && ops[..i].contains(&dep);
                    if dep_at > at || (dep_at == at && !inside_before) {
                        out.push(Violation::DependencyOrder {
                            rank: RankId::new(r as u32),
                            op,
                            needs: dep,
                        });
                    }
                }
            }
        }
    }
}

/// Each op's position in its rank's order (of a plan whose every op appears once).
fn positions(plan: &Plan, links: &Links) -> Vec<u32> {
    let mut position = vec![u32::MAX; links.slots().len()];
    for order in plan.orders() {
        for (at, task) in order.iter().enumerate() {
            let (ops, count) = task.op_array();
            for &op in &ops[..count] {
                if let Some(slot) = links.slot(op) {
                    position[slot] = at as u32;
                }
            }
        }
    }
    position
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

/// Where a pair's residency tasks sit in its rank's order (`NONE` for none).
#[derive(Clone, Copy)]
struct PairTasks {
    recompute: u32,
    offload: u32,
    reload: u32,
}

const NONE: u32 = u32::MAX;

/// Invariant 7 (on a plan whose every op appears once on its stage's rank).
fn check_residency(plan: &Plan, links: &Links, out: &mut Report) {
    let slots = links.slots();
    let position = positions(plan, links);
    let at_op = |w: Work, kind: OpKind| {
        let slot = slots
            .op(w.op(kind))
            .expect("pairs are checked in range first");
        position[slot]
    };
    let mut pairs = vec![
        PairTasks {
            recompute: NONE,
            offload: NONE,
            reload: NONE,
        };
        slots.pairs()
    ];
    for (r, order) in plan.orders().iter().enumerate() {
        let rank = RankId::new(r as u32);
        for (at, task) in order.iter().enumerate() {
            if !task.is_residency() {
                continue;
            }
            let fault = |reason: String| Violation::Residency {
                rank,
                position: at,
                task: *task,
                reason,
            };
            let w = task.work();
            if !links.has_work(w.stage, w.microbatch) {
                let why = out_of_range(plan.problem(), rank, at, w.op(OpKind::Forward));
                if let Violation::OutOfRange { reason, .. } = why {
                    out.push(fault(reason));
                }
                continue;
            }
            let owner = links.owner(w.stage).expect("the pair exists");
            if owner != rank {
                out.push(fault(format!(
                    "stage {} is placed on rank {owner}",
                    w.stage
                )));
                continue;
            }
            let pair = slots.pair(w.stage, w.microbatch).expect("the pair exists");
            let entry = &mut pairs[pair];
            let (slot, what) = match task {
                Task::Recompute(_) => (&mut entry.recompute, "recomputed"),
                Task::Offload(_) => (&mut entry.offload, "offloaded"),
                _ => (&mut entry.reload, "reloaded"),
            };
            if *slot != NONE {
                out.push(fault(format!("the pair is {what} a second time")));
                continue;
            }
            *slot = at as u32;
            let forward = at_op(w, OpKind::Forward);
            let backward = at_op(w, OpKind::InputGrad);
            if forward >= at as u32 {
                out.push(fault(format!(
                    "it comes before {}, the forward it follows",
                    w.op(OpKind::Forward)
                )));
            }
            if backward <= at as u32 {
                out.push(fault(format!(
                    "it comes after {}, the backward it must precede",
                    w.op(OpKind::InputGrad)
                )));
            }
        }
    }
    for (r, order) in plan.orders().iter().enumerate() {
        for (at, task) in order.iter().enumerate() {
            let w = task.work();
            let Some(pair) = slots.pair(w.stage, w.microbatch) else {
                continue;
            };
            let entry = pairs[pair];
            let reason = match task {
                Task::Recompute(_) if entry.offload != NONE => {
                    "the pair is both recomputed and offloaded"
                }
                Task::Offload(_) if entry.reload == NONE => "the pair is never reloaded",
                Task::Reload(_) if entry.offload == NONE => "the pair was never offloaded",
                Task::Reload(_) if entry.offload > at as u32 => {
                    "it comes before the pair's offload"
                }
                _ => continue,
            };
            if entry_at(task, entry) != at as u32 {
                continue; // a repeat, reported above
            }
            out.push(Violation::Residency {
                rank: RankId::new(r as u32),
                position: at,
                task: *task,
                reason: reason.to_string(),
            });
        }
    }
}

/// Where `pairs` recorded the first of `task`'s kind.
fn entry_at(task: &Task, entry: PairTasks) -> u32 {
    match task {
        Task::Recompute(_) => entry.recompute,
        Task::Offload(_) => entry.offload,
        _ => entry.reload,
    }
}

fn check_memory(plan: &Plan, out: &mut Report) {
    let Some(limit) = plan.memory_limit() else {
        return;
    };
    for peak in peak_per_rank(plan) {
        if peak.peak > limit + MEMORY_EPSILON {
            out.push(Violation::MemoryBound {
                rank: peak.rank,
                peak: peak.peak,
                limit,
                at: peak.at.expect("a positive peak is reached at some task"),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(orders: [&str; 2]) -> Plan {
        crate::testing::plan(2, &orders)
    }

    fn check(orders: [&str; 2], expected: &[&str]) {
        let found: Vec<String> = violations(&plan(orders))
            .iter()
            .map(|v| v.to_string())
            .collect();
        assert_eq!(found, expected, "{orders:?}");
    }

    #[test]
    fn each_invariant_is_reported_where_it_breaks() {
        check(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], &[]);
        check(
            ["0F0 0F1 0B0 0B1 0F7", "1F0 1B0 1F1 1B1"],
            &["op 0F7 at position 4 on rank 0: microbatch 7 is out of range (the plan has 2 microbatches)"],
        );
        check(
            ["0F0 0F1 0B0 0B1 1F0", "1B0 1F1 1B1"],
            &["op 1F0 runs on rank 0, but stage 1 is placed on rank 1"],
        );
        check(
            ["0F0 0F1 0B0 0B1 0F1", "1F0 1B0 1F1 1B1"],
            &["op 0F1 (stage 0, microbatch 1) runs twice: on rank 0 and again on rank 0"],
        );
        check(
            ["0F0 0F1 0B0", "1F0 1B0 1F1 1B1"],
            &[
                "op 0I1 (stage 0, microbatch 1) is missing from rank 0",
                "op 0W1 (stage 0, microbatch 1) is missing from rank 0",
            ],
        );
        check(
            ["0F0 0F1 0W0 0I0 0B1", "1F0 1B0 1F1 1B1"],
            &["on rank 0, op 0W0 (stage 0) runs before 0I0, which it depends on"],
        );
        check(
            ["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"],
            &["deadlock: rank 0 waits at task 1 (0B0) for 1I0 (stage 1, microbatch 0); rank 1 waits at task 0 (1F1) for 0F1 (stage 0, microbatch 1)"],
        );
    }

    #[test]
    fn a_backward_overlapped_with_its_own_forward_is_rejected() {
        use crate::ir::op::{Task, Work};
        let plan = plan(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
        let mut orders = plan.orders().to_vec();
        let w = Work::new(1, 0);
        orders[1].splice(
            0..2,
            [Task::Overlapped {
                forward: w,
                backward: w,
            }],
        );
        let found = violations(&plan.with_orders(orders).unwrap());
        assert_eq!(
            found[0].to_string(),
            "task 0 on rank 1 overlaps the backward of stage 1 microbatch 0 with its own forward"
        );
    }

    #[test]
    fn the_memory_bound_is_checked_by_verify_only() {
        let bounded = plan(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"])
            .with_memory_limit(Some(1.5))
            .unwrap();
        assert!(verify_schedule(&bounded).is_ok());
        let err = verify(&bounded).unwrap_err();
        assert!(err.only_memory());
        assert_eq!(
            err.to_string(),
            "1 violation(s)\n  - rank 0 holds 2.0000 activations after 0F1 (stage 0), above the limit 1.5"
        );
    }

    #[test]
    fn misplaced_recomputes_and_transfers_are_named() {
        let sound = ["0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1B0 1F1 1R1 1B1"];
        check(sound, &[]);
        check(
            ["0F0 0OFFLOAD0 0F1 0B0 0RELOAD0 0B1", "1F0 1B0 1F1 1B1"],
            &["task 0RELOAD0 at position 4 on rank 0: it comes after 0I0, the backward it must precede"],
        );
        check(
            ["0R0 0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"],
            &["task 0R0 at position 0 on rank 0: it comes before 0F0, the forward it follows"],
        );
        check(
            ["0F0 0OFFLOAD0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1 1R5 0R0"],
            &[
                "task 1R5 at position 4 on rank 1: microbatch 5 is out of range (the plan has 2 microbatches)",
                "task 0R0 at position 5 on rank 1: stage 0 is placed on rank 0",
                "task 0OFFLOAD0 at position 1 on rank 0: the pair is never reloaded",
            ],
        );
        check(
            [
                "0F0 0R0 0OFFLOAD0 0RELOAD0 0R0 0B0 0F1 0B1",
                "1F0 1B0 1F1 1B1",
            ],
            &[
                "task 0R0 at position 4 on rank 0: the pair is recomputed a second time",
                "task 0R0 at position 1 on rank 0: the pair is both recomputed and offloaded",
            ],
        );
        check(
            ["0F0 0RELOAD0 0OFFLOAD0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"],
            &["task 0RELOAD0 at position 1 on rank 0: it comes before the pair's offload"],
        );
    }

    #[test]
    fn a_plan_missing_almost_everything_lists_a_bounded_report() {
        let problem = crate::ir::problem::ProblemSpec::builder()
            .ranks(1)
            .microbatches(4000)
            .build()
            .validate()
            .unwrap();
        let plan = Plan::new(
            problem,
            crate::ir::cost::CostModel::uniform(1, Default::default(), 0.0).unwrap(),
            crate::ir::memory::MemoryModel::uniform(1, Default::default()),
            vec![vec!["0F0".parse().unwrap()]],
        )
        .unwrap();
        let found = violations(&plan);
        assert_eq!(found.len(), MAX_LISTED + 1);
        assert_eq!(
            found[MAX_LISTED],
            Violation::Omitted {
                count: 4000 * 3 - 1 - MAX_LISTED
            }
        );
    }

    #[test]
    fn long_reports_are_summarised() {
        let many = Violations(
            (0..20)
                .map(|m| Violation::Missing {
                    op: Op::new(OpKind::Forward, 0.into(), m.into()),
                    owner: RankId::new(0),
                })
                .collect(),
        );
        assert!(many.to_string().ends_with("... and 8 more"));
        assert!(!many.only_memory());
    }
}
