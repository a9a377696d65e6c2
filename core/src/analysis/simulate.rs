//! The simulator: runs a plan under its cost model and reports the figures people compare.
//!
//! Every rank runs its order as early as dependencies allow (see [`crate::analysis::replay`]). Reported:
//! - `makespan`: when the last task ends;
//! - per rank: `busy` (time running computes, recomputes included), `idle` (= makespan - busy),
//!   `span` (first compute's start to last compute's end) and `link_busy` (time its host link
//!   spends on transfers, which run beside the computes);
//! - `bubble_rate` as the Zero Bubble paper defines it: `(span - work) / span` with `span` the
//!   longest per-rank span and `work` the largest per-rank sum of unfused op costs (F + I + W of
//!   every op the rank runs; for uniform costs `m (T_F + T_B + T_W)`);
//! - peak activation memory per rank (units of one microbatch of a rank's share), on the device
//!   and in host memory (offloaded activations);
//! - the timeline of every task;
//! - with a mixture of experts' all-to-alls, how much of their time runs under computes
//!   ([`crate::analysis::all_to_all`]).

use crate::analysis::all_to_all::{a2a_figures, A2aFigures};
use crate::analysis::peak::peak_per_rank;
use crate::analysis::replay::{latest_end, replay, ReplayError, TimedTask};
use crate::ir::op::Task;
use crate::ir::plan::Plan;

/// Figures of one rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankFigures {
    /// Time spent running tasks.
    pub busy: f64,
    /// Makespan minus busy.
    pub idle: f64,
    /// First start to last end (0 for a rank with no task).
    pub span: f64,
    /// Sum of unfused op costs (F, I, W) of the rank's ops.
    pub work: f64,
    /// Peak activation memory on the device.
    pub peak_activations: f64,
    /// Peak activation memory offloaded to the host (0 without offload).
    pub host_peak_activations: f64,
    /// The part of `peak_activations` a mixture's experts keep (0 where the memory model
    /// gives them none).
    pub experts_peak_activations: f64,
    /// Time the rank's host link spends on transfers.
    pub link_busy: f64,
}

/// The result of simulating a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    makespan: f64,
    bubble_rate: f64,
    ranks: Vec<RankFigures>,
    timeline: Vec<Vec<TimedTask>>,
    a2a: Option<A2aFigures>,
}

impl Simulation {
    /// When the last task ends.
    pub fn makespan(&self) -> f64 {
        self.makespan
    }
    /// The Zero Bubble paper's bubble rate.
    pub fn bubble_rate(&self) -> f64 {
        self.bubble_rate
    }
    /// Per-rank figures.
    pub fn ranks(&self) -> &[RankFigures] {
        &self.ranks
    }
    /// The longest per-rank span.
    pub fn max_span(&self) -> f64 {
        self.ranks.iter().map(|r| r.span).fold(0.0, f64::max)
    }
    /// Per rank, every task with its start and end.
    pub fn timeline(&self) -> &[Vec<TimedTask>] {
        &self.timeline
    }
    /// The step's all-to-all time, hidden and exposed (a mixture of experts'; None without).
    pub fn a2a(&self) -> Option<A2aFigures> {
        self.a2a
    }
}

/// Simulates `plan`. Fails when the plan cannot run to completion (the replay engine says why; the
/// verifier reports the same plan's faults in full).
pub fn simulate(plan: &Plan) -> Result<Simulation, ReplayError> {
    let costs = plan.costs();
    simulate_with(plan, |t| costs.task_duration(t), costs.comm())
}

/// Simulates `plan` with `duration` giving each task's length and `comm` the cross-rank latency
/// instead of the plan's cost model: e.g. the durations its tasks took on a backend, which gives
/// the makespan the run would have had if nothing but its tasks took time.
pub fn simulate_with(
    plan: &Plan,
    duration: impl Fn(&Task) -> f64,
    comm: f64,
) -> Result<Simulation, ReplayError> {
    let outcome = replay(plan, duration, comm, true)?;
    Ok(Simulation::from_timeline(plan, outcome.timeline))
}

/// The makespan of `plan` with every overlapped F&B pair's halves run one after the other (each
/// all-to-all of a pair waited for): what the pairs' interleaving saves.
pub fn sequential_pairs_makespan(plan: &Plan) -> Result<f64, ReplayError> {
    let costs = plan.costs();
    let duration = |task: &Task| match task {
        Task::Overlapped { .. } => {
            costs.compute_duration(task) + costs.a2a_phases(task).sequential().inside_exposed
        }
        other => costs.task_duration(other),
    };
    Ok(simulate_with(plan, duration, costs.comm())?.makespan())
}

impl Simulation {
    /// The figures of `plan` run along `timeline` (per rank, its tasks with start and end): a
    /// simulated timeline, or one measured on a backend. The work behind the bubble rate comes
    /// from the plan's cost model, the peaks from its orders.
    pub fn from_timeline(plan: &Plan, timeline: Vec<Vec<TimedTask>>) -> Simulation {
        let costs = plan.costs();
        let peaks = peak_per_rank(plan);
        let makespan = latest_end(&timeline);
        let ranks: Vec<RankFigures> = timeline
            .iter()
            .enumerate()
            .map(|(r, tasks)| {
                let length = |t: &TimedTask| t.end - t.start;
                let busy: f64 = tasks.iter().filter(|t| !t.task.on_link()).map(length).sum();
                // A fold from +0, not `sum` (whose empty sum is -0, printed "-0.000").
                let link_busy = tasks
                    .iter()
                    .filter(|t| t.task.on_link())
                    .map(length)
                    .fold(0.0, |a, b| a + b);
                let mut computes = tasks.iter().filter(|t| !t.task.on_link());
                let first = computes.next();
                let last = computes.next_back().or(first);
                RankFigures {
                    busy,
                    idle: makespan - busy,
                    span: match (first, last) {
                        (Some(a), Some(b)) => b.end - a.start,
                        _ => 0.0,
                    },
                    work: tasks
                        .iter()
                        .flat_map(|t| {
                            let (ops, count) = t.task.op_array();
                            ops.into_iter().take(count)
                        })
                        .map(|op| costs.op_cost(op))
                        .sum(),
                    peak_activations: peaks.get(r).map_or(0.0, |p| p.peak),
                    host_peak_activations: peaks.get(r).map_or(0.0, |p| p.host_peak),
                    experts_peak_activations: peaks.get(r).map_or(0.0, |p| p.experts),
                    link_busy,
                }
            })
            .collect();
        let max_span = ranks.iter().map(|r| r.span).fold(0.0, f64::max);
        let max_work = ranks.iter().map(|r| r.work).fold(0.0, f64::max);
        let bubble_rate = if max_span > 0.0 {
            ((max_span - max_work) / max_span).max(0.0)
        } else {
            0.0
        };
        let a2a = a2a_figures(plan, &timeline);
        Simulation {
            makespan,
            bubble_rate,
            ranks,
            timeline,
            a2a,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::memory::StageMemory;
    use crate::testing::{costs, plan_on, problem};

    /// GPipe on `ranks` x `microbatches`: every forward, then every full backward; forwards take
    /// `f`, backwards `b` (half input gradient, half weight gradient).
    fn gpipe(ranks: u32, microbatches: u32, f: f64, b: f64) -> Plan {
        let orders: Vec<String> = (0..ranks)
            .map(|r| {
                let f = (0..microbatches).map(|m| format!("{r}F{m}"));
                let b = (0..microbatches).map(|m| format!("{r}B{m}"));
                f.chain(b).collect::<Vec<_>>().join(" ")
            })
            .collect();
        let orders: Vec<&str> = orders.iter().map(String::as_str).collect();
        plan_on(
            problem(ranks, microbatches),
            costs(f, b / 2.0, b / 2.0),
            StageMemory::default(),
            &orders,
        )
    }

    #[test]
    fn gpipe_takes_the_closed_form_time() {
        let sim = simulate(&gpipe(4, 8, 1.0, 2.0)).unwrap();
        assert_eq!(sim.makespan(), (8.0 + 3.0) * 3.0);
        assert_eq!(sim.ranks()[0].busy, 24.0);
        assert_eq!(sim.ranks()[0].idle, 9.0);
        assert_eq!(sim.ranks()[3].peak_activations, 8.0);
        // span 33, work 24 on every rank: the bubble is 9 / 33.
        assert!((sim.bubble_rate() - 9.0 / 33.0).abs() < 1e-12);
        assert_eq!(sim.timeline()[1][0].start, 1.0);
        // No transfers: the link is idle, +0 (not -0, which prints as "-0.000").
        assert!(sim.ranks()[0].link_busy.is_sign_positive());
    }

    #[test]
    fn other_durations_and_latency_replace_the_cost_model() {
        let plan = gpipe(2, 2, 1.0, 2.0);
        // One slow forward of microbatch 0 on rank 0 delays everything after it.
        let sim = simulate_with(
            &plan,
            |t| match t {
                Task::Forward(w) if w.microbatch.get() == 0 && w.stage.get() == 0 => 5.0,
                Task::Forward(_) => 1.0,
                _ => 2.0,
            },
            0.5,
        )
        .unwrap();
        // Rank 0: F0 [0,5], F1 [5,6]; rank 1: F0 [5.5,6.5], F1 [6.5,7.5], B0 [7.5,9.5],
        // B1 [9.5,11.5]; rank 0: B0 waits for 9.5 + 0.5, B1 follows: ends at 14.
        assert_eq!(sim.makespan(), 14.0);
        assert_eq!(sim.timeline()[1][0].start, 5.5);
        // The plan's own model gives the closed form (no latency).
        assert_eq!(simulate(&plan).unwrap().makespan(), (2.0 + 1.0) * 3.0);
    }

    #[test]
    fn a_plan_that_cannot_finish_is_an_error_not_a_panic() {
        let mut plan = gpipe(2, 1, 1.0, 1.0);
        let mut orders = plan.orders().to_vec();
        orders[0].reverse();
        plan = plan.with_orders(orders).unwrap();
        assert!(matches!(simulate(&plan), Err(ReplayError::Deadlock(_))));
    }
}
