//! Check 7 of the verifier: every recompute and transfer names a pair of its rank, at most once
//! of each kind, in the order F, R or OFFLOAD and RELOAD, then the backward.

use super::structure::{out_of_range, positions};
use super::{Report, Violation};
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::plan::Plan;

/// Where a pair's residency tasks sit in its rank's order (`NONE` for none).
#[derive(Clone, Copy)]
struct PairTasks {
    recompute: u32,
    offload: u32,
    reload: u32,
}

const NONE: u32 = u32::MAX;

/// Invariant 7 (on a plan whose every op appears once on its stage's rank).
pub(super) fn check_residency(plan: &Plan, links: &Links, out: &mut Report) {
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
