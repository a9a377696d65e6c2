//! The simulator: runs a plan under its cost model and reports the figures people compare.
//!
//! Every rank runs its order as early as dependencies allow (see [`crate::replay`]). Reported:
//! - `makespan`: when the last task ends;
//! - per rank: `busy` (time running tasks), `idle` (= makespan - busy), and `span` (first task's
//!   start to last task's end);
//! - `bubble_rate` as the Zero Bubble paper defines it: `(span - work) / span` with `span` the
//!   longest per-rank span and `work` the largest per-rank sum of unfused op costs (F + I + W of
//!   every op the rank runs; for uniform costs `m (T_F + T_B + T_W)`);
//! - peak activation memory per rank (units of one microbatch of a rank's share);
//! - the timeline of every task.

use crate::error::CoreError;
use crate::memory::peak_per_rank;
use crate::op::{OpKind, Task};
use crate::plan::Plan;
use crate::replay::{replay, EngineFault, TimedTask};
use crate::verify::{wait_cycle, Violation, Violations};

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
    /// Peak activation memory.
    pub peak_activations: f64,
}

/// The result of simulating a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Simulation {
    makespan: f64,
    bubble_rate: f64,
    ranks: Vec<RankFigures>,
    timeline: Vec<Vec<TimedTask>>,
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
}

/// Duration of a task under the plan's cost model.
pub fn task_duration(plan: &Plan, task: &Task) -> f64 {
    let costs = plan.costs();
    let cost = |w: crate::op::Work| costs.stage(w.stage).copied().unwrap_or_default();
    match *task {
        Task::Forward(w) => cost(w).forward(),
        Task::InputGrad(w) => cost(w).input_grad(),
        Task::WeightGrad(w) => cost(w).weight_grad(),
        Task::Backward(w) => cost(w).full_backward(),
        Task::Overlapped { forward, backward } => {
            cost(forward).overlapped().max(cost(backward).overlapped())
        }
    }
}

/// Simulates `plan`. Fails with the violation when the plan cannot run to completion.
pub fn simulate(plan: &Plan) -> Result<Simulation, CoreError> {
    let outcome =
        replay(plan, |t| task_duration(plan, t), plan.costs().comm(), true).map_err(|fault| {
            let (rank, position, op, reason) = match fault {
                EngineFault::OutOfRange(r, p, op) => (r, p, op, "out of range"),
                EngineFault::RunsTwice(r, p, op) => (r, p, op, "runs twice"),
            };
            CoreError::Verification(Violations(vec![Violation::OutOfRange {
                rank,
                position,
                op,
                reason: reason.to_string(),
            }]))
        })?;
    if !outcome.blocked.is_empty() {
        return Err(CoreError::Verification(Violations(vec![Violation::Cycle(
            wait_cycle(plan, &outcome.blocked),
        )])));
    }
    let peaks = peak_per_rank(plan);
    let costs = plan.costs();
    let makespan = outcome
        .timeline
        .iter()
        .filter_map(|t| t.last().map(|x| x.end))
        .fold(0.0, f64::max);
    let ranks: Vec<RankFigures> = outcome
        .timeline
        .iter()
        .zip(&peaks)
        .map(|(tasks, peak)| {
            let busy: f64 = tasks.iter().map(|t| t.end - t.start).sum();
            let span = match (tasks.first(), tasks.last()) {
                (Some(a), Some(b)) => b.end - a.start,
                _ => 0.0,
            };
            let work = tasks
                .iter()
                .flat_map(|t| t.task.ops())
                .map(|op| {
                    let c = costs.stage(op.stage).copied().unwrap_or_default();
                    match op.kind {
                        OpKind::Forward => c.forward(),
                        OpKind::InputGrad => c.input_grad(),
                        OpKind::WeightGrad => c.weight_grad(),
                    }
                })
                .sum();
            RankFigures {
                busy,
                idle: makespan - busy,
                span,
                work,
                peak_activations: peak.peak,
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
    Ok(Simulation {
        makespan,
        bubble_rate,
        ranks,
        timeline: outcome.timeline,
    })
}
