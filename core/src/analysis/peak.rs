//! The per-rank activation-memory replay: how much each rank holds at its peak, on the device and,
//! where the plan offloads, in host memory.
//!
//! Independent of timing: memory depends only on the order of a rank's own tasks (see
//! [`crate::ir::memory`]):
//! - F adds `total`; I frees `total - weight_grad`; W frees `weight_grad` (B both);
//! - the forward of a recomputed pair (one with an `R` task) frees `total - checkpoint` right after
//!   it (the peak counts the forward's activations while it runs); its `R` holds them again;
//! - the I of a pair recomputed for its W (one with an `RW` task) frees what the W keeps beyond
//!   its own checkpoint (`weight_grad - weight_grad_checkpoint`) right after it; its `RW` holds
//!   the whole forward's activations while it runs (`total`, over that checkpoint) and leaves
//!   what the W keeps;
//! - `OFFLOAD` moves what the pair holds from the device to the host (its `total` before its
//!   input-gradient backward, its `weight_grad` part between that and its W), `RELOAD` moves it
//!   back.
//!
//! A mixture of experts' part of the activations ([`StageMemory::experts`]) is counted apart by
//! the same rules on its own figures ([`StageMemory::experts_part`]): a rank's peak gives how much
//! of it the experts keep ([`RankPeak::experts`]).
//!
//! The order is exact about time as well, by the rule the replay engine keeps
//! ([`crate::analysis::replay`]): a task that allocates on the device (a forward, a recompute, a
//! reload) never starts before every offload earlier in its rank's order has finished, so the
//! memory an offload frees at its place in the order is free by the time anything after it needs it.

use crate::ir::ids::RankId;
use crate::ir::memory::StageMemory;
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::plan::Plan;
use std::collections::HashSet;
use std::ops::ControlFlow;

/// Peak held activation memory of one rank and the task at which it is first reached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankPeak {
    /// The rank.
    pub rank: RankId,
    /// Peak device memory, in units of one microbatch of the rank's share.
    pub peak: f64,
    /// The task after which (or, for a task that allocates and frees, while which) the peak is
    /// first reached (None for a rank that holds nothing).
    pub at: Option<Task>,
    /// Peak host memory the rank's offloads hold (0 without offload).
    pub host_peak: f64,
    /// The part of `peak` the experts of a mixture keep (0 where no stage's experts keep
    /// memory of their own).
    pub experts: f64,
}

/// The pairs a rank's order recomputes: their forwards (`R`) and what their Ws keep (`RW`) are
/// dropped after they run. A rank's memory depends on its own order alone (a recompute runs on
/// its pair's rank).
fn dropped_in(order: &[Task]) -> (HashSet<Work>, HashSet<Work>) {
    let (mut forwards, mut weight_grads) = (HashSet::new(), HashSet::new());
    for task in order {
        match task {
            Task::Recompute(w) => {
                forwards.insert(*w);
            }
            Task::RecomputeWeightGrad(w) => {
                weight_grads.insert(*w);
            }
            _ => {}
        }
    }
    (forwards, weight_grads)
}

/// Walks one rank's order, calling `visit(task, held)` with the most device memory held while
/// the task runs (a forward's activations included before a drop), and returns the host
/// memory's peak. Tasks whose stage is out of range hold nothing (the verifier reports them).
/// `part` gives the figures counted of each stage's (the whole, or its experts' part).
fn walk(
    plan: &Plan,
    order: &[Task],
    part: fn(&StageMemory) -> StageMemory,
    mut visit: impl FnMut(&Task, f64),
) -> f64 {
    let memory = plan.memory();
    let figures = |w: Work| memory.of(w.stage, w.microbatch).map(|m| part(&m));
    let (dropped, weight_dropped) = dropped_in(order);
    let (mut held, mut host, mut host_peak) = (0.0f64, 0.0f64, 0.0f64);
    // With transfers: the pairs whose input gradient ran (an offload after it moves the W's part).
    let transfers = order.iter().any(Task::on_link);
    let mut backed: HashSet<Work> = HashSet::new();
    for task in order {
        let work = task.work();
        let Some(m) = figures(work) else {
            visit(task, held);
            continue;
        };
        let mut during = held;
        match *task {
            Task::Recompute(_) => {
                held += m.dropped();
                during = held;
            }
            Task::RecomputeWeightGrad(_) => {
                let kept = m.weight_grad_checkpoint();
                during = held - kept + m.total();
                held += m.weight_grad() - kept;
            }
            Task::Offload(w) => {
                let moved = moved_by(plan, &m, backed.contains(&w));
                held -= moved;
                host += moved;
                host_peak = host_peak.max(host);
            }
            Task::Reload(w) => {
                let moved = moved_by(plan, &m, backed.contains(&w));
                held += moved;
                host -= moved;
                during = held;
            }
            _ => {
                let _ = task.try_for_each_op(|op| {
                    let work = Work {
                        stage: op.stage,
                        microbatch: op.microbatch,
                    };
                    let Some(m) = figures(work) else {
                        return ControlFlow::<()>::Continue(());
                    };
                    held += m.delta(op.kind);
                    during = during.max(held);
                    if op.kind == OpKind::Forward && !dropped.is_empty() && dropped.contains(&work)
                    {
                        held -= m.dropped();
                    }
                    if op.kind == OpKind::InputGrad && weight_dropped.contains(&work) {
                        held -= m.weight_grad() - m.weight_grad_checkpoint();
                    }
                    if transfers && op.kind == OpKind::InputGrad {
                        backed.insert(work);
                    }
                    ControlFlow::Continue(())
                });
            }
        }
        visit(task, during);
    }
    host_peak
}

/// What a transfer of a pair on a stage with figures `m` of `plan` moves: all its activations
/// (of a sequence chunk all but its checkpoint: the keys and values the later chunks read stay
/// on the device), or after its input-gradient backward (`backed`) the part kept for its weight
/// gradient. The one home of this rule, for the replay here and the `offload` pass.
pub fn moved_by(plan: &Plan, m: &crate::ir::memory::StageMemory, backed: bool) -> f64 {
    if backed {
        m.weight_grad()
    } else if plan.problem().is_seq_split() {
        m.dropped()
    } else {
        m.total()
    }
}

/// Per rank, per task of its order, the most device memory held while the task runs: where a
/// memory bound breaks, for passes that place recomputes and transfers.
pub fn held_per_task(plan: &Plan) -> Vec<Vec<f64>> {
    (0..plan.orders().len())
        .map(|r| held_during(plan, RankId::new(r as u32)))
        .collect()
}

/// [`held_per_task`] of one rank (empty for a rank out of range).
pub fn held_during(plan: &Plan, rank: RankId) -> Vec<f64> {
    held_along(plan, plan.order(rank))
}

/// Per task of `order` (an order of one of `plan`'s ranks, maybe not the plan's own), the most
/// device memory held while it runs: [`held_during`] of a rank whose order a pass is editing.
pub fn held_along(plan: &Plan, order: &[Task]) -> Vec<f64> {
    let mut held = Vec::with_capacity(order.len());
    walk(plan, order, StageMemory::clone, |_, during| {
        held.push(during)
    });
    held
}

/// Replays each rank's order and returns its memory peaks.
pub fn peak_per_rank(plan: &Plan) -> Vec<RankPeak> {
    plan.orders()
        .iter()
        .enumerate()
        .map(|(r, order)| {
            let mut best = RankPeak {
                rank: RankId::new(r as u32),
                peak: 0.0,
                at: None,
                host_peak: 0.0,
                experts: 0.0,
            };
            // The task (by position) where the peak is first reached.
            let (mut position, mut at) = (0, None);
            best.host_peak = walk(plan, order, StageMemory::clone, |task, during| {
                if during > best.peak + 1e-12 {
                    best.peak = during;
                    best.at = Some(*task);
                    at = Some(position);
                }
                position += 1;
            });
            if let Some(at) = at.filter(|_| plan.memory().has_experts()) {
                let mut position = 0;
                walk(plan, order, StageMemory::experts_part, |_, during| {
                    if position == at {
                        best.experts = during;
                    }
                    position += 1;
                });
            }
            best
        })
        .collect()
}

/// The largest device peak over all ranks.
pub fn max_peak(plan: &Plan) -> f64 {
    peak_per_rank(plan)
        .iter()
        .map(|p| p.peak)
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::cost::StageCosts;
    use crate::ir::memory::StageMemorySpec;
    use crate::testing::{plan_on, problem};

    /// A plan of one rank running `order` (its tasks separated by spaces) on three microbatches.
    fn one_rank(order: &str, weight_grad: f64, checkpoint: f64) -> Plan {
        let memory = StageMemorySpec::builder()
            .total(1.0)
            .weight_grad(weight_grad)
            .checkpoint(checkpoint)
            .build()
            .validate()
            .unwrap();
        plan_on(problem(1, 3), StageCosts::default(), memory, &[order])
    }

    #[test]
    fn peaks_follow_each_ranks_order() {
        let plan = one_rank("0F0 0F1 0I0 0W0 0I1 0W1", 0.25, 0.0);
        let peaks = peak_per_rank(&plan);
        assert_eq!(peaks[0].peak, 2.0);
        assert_eq!(peaks[0].at.unwrap().to_string(), "0F1");
        assert_eq!(peaks[0].host_peak, 0.0);
        assert_eq!(max_peak(&plan), 2.0);
    }

    #[test]
    fn held_per_task_is_the_most_held_while_each_task_runs() {
        let plan = one_rank("0F0 0F1 0R0 0B0 0B1", 1.0, 0.0);
        // 0F0 peaks at 1 and is dropped; 0F1 holds 1; 0R0 brings 0F0 back: 2, which 0B0
        // holds when it starts.
        assert_eq!(held_per_task(&plan), vec![vec![1.0, 1.0, 2.0, 2.0, 1.0]]);
    }

    #[test]
    fn a_recomputed_forward_keeps_its_checkpoint_until_its_recompute() {
        // 0F0 and 0F1 dropped (each keeps 0.125); the peak is 0F2 over two checkpoints, then
        // the recomputes of 0 and 1 each hold 0.875 again while 0F2 is held.
        let order = "0F0 0F1 0F2 0B2 0R1 0B1 0R0 0B0";
        let plan = one_rank(order, 1.0, 0.125);
        let peaks = peak_per_rank(&plan);
        assert_eq!(peaks[0].peak, 1.25);
        assert_eq!(peaks[0].at.unwrap().to_string(), "0F2");
        // Without a checkpoint a lone forward is the peak.
        assert_eq!(max_peak(&one_rank(order, 1.0, 0.0)), 1.0);
    }

    #[test]
    fn offloads_move_activations_to_the_host_and_back() {
        let order = "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0F2 0B2 0RELOAD1 0B1 0RELOAD0 0B0";
        let plan = one_rank(order, 1.0, 0.0);
        let peaks = peak_per_rank(&plan);
        assert_eq!(peaks[0].peak, 1.0);
        assert_eq!(peaks[0].host_peak, 2.0);
        // A reload while another pair is held is the peak.
        let order = "0F0 0F1 0OFFLOAD0 0F2 0B2 0RELOAD0 0B1 0B0";
        let peaks = peak_per_rank(&one_rank(order, 1.0, 0.0));
        assert_eq!((peaks[0].peak, peaks[0].host_peak), (2.0, 1.0));
        assert_eq!(peaks[0].at.unwrap().to_string(), "0F1");
    }

    #[test]
    fn the_experts_part_of_a_peak_is_counted_by_the_same_rules() {
        let memory = StageMemorySpec::builder()
            .total(1.0)
            .weight_grad(0.5)
            .checkpoint(0.125)
            .experts(0.25)
            .build()
            .validate()
            .unwrap();
        let peak = |order: &str| {
            let plan = plan_on(problem(1, 3), StageCosts::default(), memory, &[order]);
            let p = peak_per_rank(&plan)[0];
            (p.peak, p.experts)
        };
        // Two forwards held: 2, of which the experts' rows 0.5.
        assert_eq!(peak("0F0 0F1 0I0 0W0 0I1 0W1"), (2.0, 0.5));
        // The I frees what the W does not keep, none of the experts' rows: at 0F1 after 0I0,
        // 0.5 + 1 held, 0.25 + 0.25 of it the experts'.
        assert_eq!(peak("0F0 0I0 0F1 0W0 0I1 0W1"), (1.5, 0.5));
        // A recomputed forward keeps its checkpoint, none of its experts' rows.
        assert_eq!(peak("0F0 0F1 0F2 0B2 0R1 0B1 0R0 0B0"), (1.25, 0.25));
        // Offloaded pairs take their experts' rows to the host.
        let order = "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0F2 0B2 0RELOAD1 0B1 0RELOAD0 0B0";
        assert_eq!(peak(order), (1.0, 0.25));
        // Without an experts' figure, none.
        let plain = plan_on(
            problem(1, 3),
            StageCosts::default(),
            StageMemory::default(),
            &[order],
        );
        assert_eq!(peak_per_rank(&plain)[0].experts, 0.0);
    }

    #[test]
    fn an_offload_after_the_input_gradient_moves_what_the_w_keeps() {
        // Half of each pair is kept for its W. 0F0 is moved out whole before its I (1) and
        // again, its W's half (0.5), between its I and W (a transfer counts what was held
        // before it).
        let order = "0F0 0OFFLOAD0 0F1 0RELOAD0 0I0 0OFFLOAD0 0I1 0RELOAD0 0W0 0W1";
        let plan = one_rank(order, 0.5, 0.0);
        let held = held_per_task(&plan);
        assert_eq!(
            held,
            vec![vec![1.0, 1.0, 1.0, 2.0, 2.0, 1.5, 1.0, 1.0, 1.0, 0.5]]
        );
        assert_eq!(peak_per_rank(&plan)[0].host_peak, 1.0);
    }
}
