//! Check 7 of the verifier: every recompute and transfer names a pair of its rank, in the order
//! F, R or OFFLOAD and RELOAD, then the backward; and, for a pair whose backward is split, maybe
//! a second OFFLOAD and RELOAD between its input-gradient and its weight-gradient backward (what
//! the W keeps moved to the host and back) or an RW (what the W keeps dropped after the I and
//! rebuilt there). Each at most once per window; a pair is not both recomputed and offloaded in
//! one window.

use super::structure::{out_of_range, positions};
use super::{Report, Violation};
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::plan::Plan;

/// Where a pair's residency tasks sit in its rank's order (`NONE` for none), per window: before
/// the input-gradient backward (0: R, transfers), between it and the W (1: RW, transfers).
#[derive(Clone, Copy)]
struct PairTasks {
    recompute: [u32; 2],
    offload: [u32; 2],
    reload: [u32; 2],
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
            recompute: [NONE; 2],
            offload: [NONE; 2],
            reload: [NONE; 2],
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
            let at = at as u32;
            let pair = slots.pair(w.stage, w.microbatch).expect("the pair exists");
            let input = at_op(w, OpKind::InputGrad);
            let k = window_of(task, at, input, &pairs[pair]);
            let entry = &mut pairs[pair];
            let (slot, what) = match task {
                Task::Recompute(_) => (&mut entry.recompute[0], "recomputed"),
                Task::RecomputeWeightGrad(_) => (
                    &mut entry.recompute[1],
                    "recomputed for its weight gradient",
                ),
                Task::Offload(_) => (&mut entry.offload[k], "offloaded"),
                _ => (&mut entry.reload[k], "reloaded"),
            };
            if *slot != NONE {
                out.push(fault(format!("the pair is {what} a second time")));
                continue;
            }
            *slot = at;
            let forward = at_op(w, OpKind::Forward);
            let weight = at_op(w, OpKind::WeightGrad);
            if forward >= at {
                out.push(fault(format!(
                    "it comes before {}, the forward it follows",
                    w.op(OpKind::Forward)
                )));
            }
            let placed = if k == 0 {
                at < input
            } else {
                input < at && at < weight
            };
            let rebuilds_weight_grad = matches!(task, Task::RecomputeWeightGrad(_));
            if rebuilds_weight_grad && input == weight {
                out.push(fault(format!(
                    "{} runs as one backward: there is no weight gradient to wait for",
                    w.op(OpKind::InputGrad)
                )));
            } else if rebuilds_weight_grad && at < input {
                out.push(fault(format!(
                    "it comes before {}, the input-gradient backward it must follow",
                    w.op(OpKind::InputGrad)
                )));
            } else if !placed {
                let (op, what) = if k == 1 && input < weight {
                    (w.op(OpKind::WeightGrad), "weight-gradient backward")
                } else {
                    (w.op(OpKind::InputGrad), "backward")
                };
                out.push(fault(format!(
                    "it comes after {op}, the {what} it must precede"
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
            let at = at as u32;
            let input = slots
                .op(w.op(OpKind::InputGrad))
                .map_or(NONE, |slot| position[slot]);
            let k = window_of(task, at, input, &entry);
            let reason = match task {
                Task::Recompute(_) if entry.offload[0] != NONE => {
                    "the pair is both recomputed and offloaded"
                }
                Task::RecomputeWeightGrad(_) if entry.offload[1] != NONE => {
                    "what the pair's W keeps is both recomputed and offloaded"
                }
                Task::Offload(_) if entry.reload[k] == NONE => "the pair is never reloaded",
                Task::Reload(_) if entry.offload[k] == NONE => "the pair was never offloaded",
                Task::Reload(_) if entry.offload[k] > at => "it comes before the pair's offload",
                _ => continue,
            };
            if entry_at(task, entry, k) != at {
                continue; // a repeat, reported above
            }
            out.push(Violation::Residency {
                rank: RankId::new(r as u32),
                position: at as usize,
                task: *task,
                reason: reason.to_string(),
            });
        }
    }
}

/// The window of residency task `task` at position `at` of its pair (`input`: where its I runs;
/// `entry`: its tasks seen so far): an offload's by where it sits, a reload's that of the
/// offload before it, an R's the first, an RW's the second.
fn window_of(task: &Task, at: u32, input: u32, entry: &PairTasks) -> usize {
    match task {
        Task::Offload(_) => usize::from(input < at),
        Task::Reload(_) => usize::from(entry.offload[1] < at),
        Task::RecomputeWeightGrad(_) => 1,
        _ => 0,
    }
}

/// Where `pairs` recorded the first of `task`'s kind (a transfer's in window `k`).
fn entry_at(task: &Task, entry: PairTasks, k: usize) -> u32 {
    match task {
        Task::Recompute(_) => entry.recompute[0],
        Task::RecomputeWeightGrad(_) => entry.recompute[1],
        Task::Offload(_) => entry.offload[k],
        _ => entry.reload[k],
    }
}
