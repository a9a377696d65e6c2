//! Local search on a finished schedule: pull the critical path forward one swap at a time.
//!
//! From the rank with the longest span, the search follows the chain of waits backwards: a task
//! that started when a dependency arrived points to that dependency's task; a task that started
//! when its rank became free points to the task before it. Wherever that chain passes a task
//! directly preceded on its rank by a W (or a forward it does not depend on), swapping the two is a
//! candidate move. Candidates are simulated; the best that shortens the longest span (or keeps it
//! and shortens the makespan) within the memory limit is kept, and the search repeats until no
//! move helps or the evaluation budget is spent. Every accepted order is a complete, acyclic
//! schedule, because candidates that fail to simulate are discarded.

use crate::schedules::score::Score;
use crate::schedules::threshold::Threshold;
use pipeweave_core::ir::deps::predecessors;
use pipeweave_core::{peak_per_rank, simulate, Plan, Simulation, Task, TOLERANCE};

/// A candidate within `limit` with its simulation, or None; the comparison of its peak with the
/// limit is recorded in `checks`.
fn evaluate(
    plan: &Plan,
    orders: Vec<Vec<Task>>,
    limit: f64,
    checks: &mut Threshold,
) -> Option<(Plan, Simulation)> {
    let candidate = plan.clone().with_orders(orders).ok()?;
    // Some rank above the limit, as `peak > limit + TOLERANCE` (a NaN peak is above nothing).
    let peak = peak_per_rank(&candidate)
        .iter()
        .map(|p| p.peak)
        .fold(f64::NEG_INFINITY, f64::max);
    if !checks.check(peak, limit) {
        return None;
    }
    let sim = simulate(&candidate).ok()?;
    Some((candidate, sim))
}

/// Swaps (rank, index) with its predecessor on the critical chain ending at the rank with the
/// longest span.
fn critical_moves(plan: &Plan, sim: &Simulation, limit_moves: usize) -> Vec<(usize, usize)> {
    let timeline = sim.timeline();
    let mut where_run = vec![(usize::MAX, usize::MAX); plan.op_slots()];
    for (r, tasks) in timeline.iter().enumerate() {
        for (i, t) in tasks.iter().enumerate() {
            for op in t.task.ops() {
                if let Some(slot) = plan.op_slot(op) {
                    where_run[slot] = (r, i);
                }
            }
        }
    }
    let Some(worst) =
        (0..timeline.len()).max_by(|&a, &b| sim.ranks()[a].span.total_cmp(&sim.ranks()[b].span))
    else {
        return Vec::new();
    };
    let mut moves = Vec::new();
    let (mut r, mut i) = (worst, timeline[worst].len().saturating_sub(1));
    let mut steps = 0;
    while moves.len() < limit_moves && steps < 4 * limit_moves + 64 {
        steps += 1;
        let Some(current) = timeline[r].get(i) else {
            break;
        };
        let previous_end = if i > 0 {
            timeline[r][i - 1].end
        } else {
            f64::NEG_INFINITY
        };
        if current.start <= previous_end + TOLERANCE {
            // Started when the rank became free: the task before it delayed it.
            if i == 0 {
                break;
            }
            let before = timeline[r][i - 1].task;
            let depends = current
                .task
                .ops()
                .iter()
                .flat_map(|op| predecessors(plan.problem(), *op))
                .any(|d| before.ops().contains(&d));
            if !depends {
                moves.push((r, i));
            }
            i -= 1;
            continue;
        }
        // Started when a dependency arrived: follow the latest one.
        let mut latest: Option<(f64, usize, usize)> = None;
        for op in current.task.ops() {
            for dep in predecessors(plan.problem(), op) {
                if current.task.ops().contains(&dep) {
                    continue;
                }
                let Some(slot) = plan.op_slot(dep) else {
                    continue;
                };
                let (q, j) = where_run[slot];
                if q == usize::MAX {
                    continue;
                }
                let end = timeline[q][j].end;
                if latest.is_none_or(|(e, _, _)| end > e) {
                    latest = Some((end, q, j));
                }
            }
        }
        match latest {
            Some((_, q, j)) => {
                r = q;
                i = j;
            }
            None => break,
        }
    }
    moves
}

/// Improves `orders` (a schedule of `plan`'s problem) by critical-path swaps, spending at most
/// `budget` simulations.
pub fn refine(plan: &Plan, orders: Vec<Vec<Task>>, limit: f64, budget: usize) -> Vec<Vec<Task>> {
    refine_probed(plan, orders, limit, budget).0
}

/// [`refine`], with the outcomes of every comparison it made against `limit`: at any other limit
/// the threshold admits, the search is the same, swap for swap ([`crate::schedules::memo`]).
pub fn refine_probed(
    plan: &Plan,
    orders: Vec<Vec<Task>>,
    limit: f64,
    budget: usize,
) -> (Vec<Vec<Task>>, Threshold) {
    let mut checks = Threshold::new();
    let Some((mut current, mut sim)) = evaluate(plan, orders.clone(), limit, &mut checks) else {
        return (orders, checks);
    };
    let mut spent = 0;
    while spent < budget {
        let mut best: Option<(Plan, Simulation)> = None;
        for (r, i) in critical_moves(&current, &sim, 8) {
            if spent >= budget {
                break;
            }
            spent += 1;
            let mut trial = current.orders().to_vec();
            trial[r].swap(i - 1, i);
            if let Some((candidate, trial_sim)) = evaluate(plan, trial, limit, &mut checks) {
                let reference = best.as_ref().map_or(Score::of(&sim), |b| Score::of(&b.1));
                if Score::of(&trial_sim).beats(reference) {
                    best = Some((candidate, trial_sim));
                }
            }
        }
        match best {
            Some((p, s)) => {
                current = p;
                sim = s;
            }
            None => break,
        }
    }
    (current.orders().to_vec(), checks)
}
