//! Checks 1 to 4 of the verifier: every op in range and on its stage's rank, every op exactly
//! once, and (to explain a failed replay) every dependency on a rank before what needs it.

use super::{Report, Violation};
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, OpKind, Task, Work};
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use std::ops::ControlFlow;

/// Which rank each op was seen on (`NOT_SEEN` for none; ranks are fewer than
/// [`crate::ir::problem::MAX_RANKS`], so a `u16` holds one), and how many distinct ops were.
pub(super) struct Seen {
    rank: Vec<u16>,
    distinct: usize,
}

/// Marks an op no order holds, in [`Seen`].
const NOT_SEEN: u16 = u16::MAX;

pub(super) fn check_structure(plan: &Plan, links: &Links, out: &mut Report) -> Seen {
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
pub(super) fn out_of_range(problem: &Problem, rank: RankId, position: usize, op: Op) -> Violation {
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

/// Invariant 4 (run only to explain a failed replay, see the module doc of [`super`]).
pub(super) fn check_local_order(plan: &Plan, links: &Links, seen: &Seen, out: &mut Report) {
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
pub(super) fn positions(plan: &Plan, links: &Links) -> Vec<u32> {
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
