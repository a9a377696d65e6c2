//! Slack: how much later each task of a simulated plan could start without the plan ending later
//! (its total float on the critical-path schedule).
//!
//! Walks the timeline backwards in the replay's completion order (a topological order of the
//! tasks with their dependencies and ranks' orders): each task must end by the latest start of
//! everything that waits for it, and starts its own duration before that; the last tasks may end
//! at the makespan. What waits for a task, by the replay engine's rules
//! ([`crate::analysis::replay`]): the next compute of its rank; the ops that depend on its ops
//! (across ranks after the latency); for a transfer, the next transfer on its link (in the
//! link's order, [`crate::analysis::link`]), and the backward it reloads for or the allocations
//! after the offload; for a compute, the reloads issued right after it and the offloads of what
//! it produced.
//!
//! Passes use it to tell a delay the plan absorbs from one that lengthens it.

use crate::analysis::link::{link_order, offload_producers};
use crate::analysis::replay::TimedTask;
use crate::analysis::simulate::Simulation;
use crate::ir::deps::Links;
use crate::ir::op::{OpKind, Task};
use crate::ir::plan::Plan;
use std::collections::HashMap;
use std::ops::ControlFlow;

/// Per rank, per task of its order (as the simulation's timeline holds them), how much later the
/// task could start without delaying the end of the plan (0 on the critical path). `simulation`
/// must be a simulation of `plan` (its timeline holding the plan's orders).
pub fn slack(plan: &Plan, simulation: &Simulation) -> Vec<Vec<f64>> {
    let timeline = simulation.timeline();
    let links = Links::of(plan.problem());
    let slots = links.slots();
    let comm = plan.costs().comm();
    // Where each op runs: (rank, position).
    let mut at_op = vec![(u32::MAX, u32::MAX); slots.len()];
    // Per pair, the positions of its reloads on its rank (one before its I, maybe one between its
    // I and W), in order.
    let mut reload_of = vec![[u32::MAX; 2]; slots.pairs()];
    for (r, tasks) in timeline.iter().enumerate() {
        for (i, t) in tasks.iter().enumerate() {
            let (ops, count) = t.task.op_array();
            for &op in &ops[..count] {
                if let Some(k) = slots.op(op) {
                    at_op[k] = (r as u32, i as u32);
                }
            }
            if let Task::Reload(w) = t.task {
                if let Some(pair) = slots.pair(w.stage, w.microbatch) {
                    let at = &mut reload_of[pair];
                    at[usize::from(at[0] != u32::MAX)] = i as u32;
                }
            }
        }
    }
    // Per rank, each transfer's predecessor on the link and each offload's producer, by
    // position ([`crate::analysis::link`]).
    let links_of: Vec<(HashMap<usize, usize>, HashMap<usize, usize>)> = timeline
        .iter()
        .map(|tasks| {
            let order: Vec<Task> = tasks.iter().map(|t| t.task).collect();
            let sequence = link_order(&order, slots);
            let before = sequence.windows(2).map(|w| (w[1], w[0])).collect();
            let producer = offload_producers(&order, slots)
                .into_iter()
                .map(|(p, o)| (o, p))
                .collect();
            (before, producer)
        })
        .collect();
    let makespan = simulation.makespan();
    let mut latest_end: Vec<Vec<f64>> = timeline
        .iter()
        .map(|tasks| vec![makespan; tasks.len()])
        .collect();
    let mut by_completion: Vec<(usize, usize, usize)> = timeline
        .iter()
        .enumerate()
        .flat_map(|(r, tasks)| {
            tasks
                .iter()
                .enumerate()
                .map(move |(i, t)| (t.sequence, r, i))
        })
        .collect();
    by_completion.sort_unstable_by_key(|&(sequence, _, _)| std::cmp::Reverse(sequence));
    let mut out: Vec<Vec<f64>> = timeline.iter().map(|t| vec![0.0; t.len()]).collect();
    for &(_, r, i) in &by_completion {
        let t: TimedTask = timeline[r][i];
        let latest_start = latest_end[r][i] - (t.end - t.start);
        out[r][i] = (latest_start - t.start).max(0.0);
        let mut bound = |rank: usize, position: usize, by: f64| {
            if let Some(e) = latest_end
                .get_mut(rank)
                .and_then(|row| row.get_mut(position))
            {
                *e = e.min(by);
            }
        };
        let tasks = &timeline[r];
        if t.task.on_link() {
            // The transfer before it on the link ends before it starts; it is issued by its
            // producer (an offload) or once the compute before it ended.
            let (before, producer) = &links_of[r];
            if let Some(&p) = before.get(&i) {
                bound(r, p, latest_start);
            }
            let issuer = producer
                .get(&i)
                .copied()
                .or_else(|| tasks[..i].iter().rposition(|x| !x.task.on_link()));
            if let Some(p) = issuer {
                bound(r, p, latest_start);
            }
            continue;
        }
        // The compute before it ends before it starts.
        if let Some(p) = tasks[..i].iter().rposition(|x| !x.task.on_link()) {
            bound(r, p, latest_start);
        }
        if t.task.allocates() {
            // The offloads before it must have ended.
            for (p, x) in tasks[..i].iter().enumerate().rev() {
                if matches!(x.task, Task::Offload(_)) {
                    bound(r, p, latest_start);
                    break;
                }
            }
        }
        let _ = t.task.try_for_each_op(|op| {
            let _ = links.try_for_each_dep(op, |_, k| {
                let (dr, di) = at_op[k];
                if dr == u32::MAX || (dr as usize == r && di as usize == i) {
                    return ControlFlow::<()>::Continue(());
                }
                let latency = if dr as usize == r { 0.0 } else { comm };
                bound(dr as usize, di as usize, latest_start - latency);
                ControlFlow::Continue(())
            });
            // A backward waits for its pair's reload when the reload comes before it (an I, or
            // the W of a pair moved out between its I and W).
            if op.kind != OpKind::Forward {
                if let Some(pair) = slots.pair(op.stage, op.microbatch) {
                    let before = reload_of[pair].iter().rev().find(|&&ri| (ri as usize) < i);
                    if let Some(&ri) = before {
                        bound(r, ri as usize, latest_start);
                    }
                }
            }
            ControlFlow::<()>::Continue(())
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::simulate::simulate;

    #[test]
    fn the_critical_path_has_no_slack_and_waits_have_some() {
        // 1F1B at 2 ranks, 2 microbatches, unit costs (B = 2): rank 0's F1 ends at 2 but is
        // needed only at 4 (by its B0, which waits for rank 1's gradient, and by rank 1's F1);
        // its B0 ends at 6 and B1 starts at 7 (waiting for rank 1); the rest is critical.
        let plan = crate::testing::plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
        let sim = simulate(&plan).unwrap();
        let s = slack(&plan, &sim);
        assert_eq!(s, vec![vec![0.0, 2.0, 1.0, 0.0], vec![0.0, 0.0, 0.0, 0.0]]);
    }

    #[test]
    fn a_reload_may_start_as_late_as_its_backward_needs() {
        // One rank: the reload (1 long) is issued after 0F1 ends at 3; 0B1 runs [3, 5] beside
        // it, and 0B0 needs it only at 5: one unit of slack.
        let plan = crate::testing::plan(2, &["0F0 0OFFLOAD0 0F1 0RELOAD0 0B1 0B0"]);
        let sim = simulate(&plan).unwrap();
        let s = slack(&plan, &sim);
        assert_eq!(s[0][3], 1.0, "{s:?}");
        assert_eq!(s[0][4], 0.0);
    }
}
