//! The replay engine: runs every rank's order as early as dependencies allow.
//!
//! Each rank runs its tasks in order; a task starts when the rank is free and every op it depends on
//! (outside the task itself) has finished, plus the cross-rank latency for an op on another rank. The
//! engine is event driven: a rank blocked on an op registers as a waiter of that op and is woken when
//! the op finishes, so a replay costs time linear in the number of ops. When no rank can move and
//! some have tasks left, the plan cannot finish; the engine returns what each blocked rank waits for.
//!
//! The residency tasks ([`Task::is_residency`]) have their own rules. A recompute runs on the rank
//! like any compute. The transfers (offload, reload) run on the rank's host link, one at a time in
//! the order they are issued ([`crate::analysis::link`]), each starting once it is issued and the
//! link is free; the computes go on beside them. An offload is issued as soon as what it moves
//! exists (its pair's forward ended, or its input-gradient backward for what a W keeps), right
//! after that compute, wherever it sits in the order: its place is where the device copy is freed
//! (PipeOffload's offload end), so it may sit later than its forward and leave the allocations
//! between free of its fence. A reload is issued when the compute before it in the order has
//! ended. A backward (the I of an offloaded pair, or its W when the transfers sit
//! between its I and W) starts only after its reload has ended, and a task that allocates device
//! memory (a forward, a recompute; a reload by the link's own order) only after every offload
//! earlier in the rank's order has ended, so the memory freed at an offload's place in the order
//! is free by then (what [`crate::analysis::peak`] counts on). The timeline keeps every task at
//! its place in the rank's order, transfers with their times on the link.
//!
//! A search that tries one change of a plan at a time ([`replay_within`]) resumes from an earlier
//! replay (every task it completed before the change's first task keeps its times) and stops as
//! soon as a task ends after the makespan it must beat.
//!
//! The engine assumes every op of every task is in range (the verifier checks that first); an op out
//! of range, an op run twice, and a deadlock are reported as a [`ReplayError`] rather than a panic.
//! It assumes residency tasks come in their verified order (a reload before its backward); a
//! backward whose reload comes later in the order runs as though its pair had not been offloaded.
//!
//! Files: this one holds what a replay produces and its errors, and the entry points;
//! `engine.rs` the event loop; `host_links.rs` the ranks' host links as the loop runs them;
//! `resume.rs` which prefix of an earlier replay a resumed one keeps; `deadlock.rs` the cycle of
//! waits a deadlock reports.

mod deadlock;
mod engine;
mod host_links;
mod resume;
#[cfg(test)]
mod tests;

use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, Task};
use crate::ir::plan::Plan;
use engine::replay_bounded;
use std::fmt;
use thiserror::Error;

/// One task with its simulated start and end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimedTask {
    /// The task.
    pub task: Task,
    /// Start time.
    pub start: f64,
    /// End time.
    pub end: f64,
    /// Position of this task in the order the engine completed tasks: a topological order of
    /// the per-rank orders together with the dependencies (used to order messages globally).
    pub sequence: usize,
}

/// A rank that cannot continue: the task it is at and the op it waits for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Blocked {
    /// The waiting rank.
    pub rank: RankId,
    /// Index of the task in the rank's order.
    pub position: usize,
    /// The task it cannot start.
    pub task: Task,
    /// The op it waits for.
    pub needs: Op,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} waits at task {} ({}) for {} (stage {}, microbatch {})",
            self.rank,
            self.position,
            self.task,
            self.needs,
            self.needs.stage,
            self.needs.microbatch
        )
    }
}

/// Why the engine could not run every task of a plan.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum ReplayError {
    /// An op names a stage or microbatch out of range, or a stage off its microbatch's route.
    #[error("rank {0}, task {1}: op {2} is out of range")]
    OutOfRange(RankId, usize, Op),
    /// An op runs a second time.
    #[error("rank {0}, task {1}: op {2} runs a second time")]
    RunsTwice(RankId, usize, Op),
    /// No rank can move and some have tasks left: the cycle of waiting ranks (every blocked rank
    /// when no cycle closes).
    #[error("deadlock: {}", describe_waits(.0))]
    Deadlock(Vec<Blocked>),
}

/// The ranks of a deadlock, each as it waits, joined by `; ` (also the communication checker's).
pub(crate) fn describe_waits<T: fmt::Display>(waits: &[T]) -> String {
    waits
        .iter()
        .map(T::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a replay produced: per rank, the tasks that ran with their times, in order (empty rows
/// when the timeline was not recorded).
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    /// Per rank, the timed tasks.
    pub timeline: Vec<Vec<TimedTask>>,
}

impl Replay {
    /// When the last recorded task ends (transfers included; 0 when nothing was recorded): the
    /// simulator's makespan.
    pub fn makespan(&self) -> f64 {
        latest_end(&self.timeline)
    }
}

/// When the last task of `timeline` (per rank, its timed tasks) ends; 0 for none.
pub(crate) fn latest_end(timeline: &[Vec<TimedTask>]) -> f64 {
    timeline.iter().flatten().map(|t| t.end).fold(0.0, f64::max)
}

/// Replays `plan` with `duration` giving each task's length and `comm` the cross-rank latency.
/// With `record` false the timeline comes back empty (a feasibility check needs no times).
pub fn replay(
    plan: &Plan,
    duration: impl Fn(&Task) -> f64,
    comm: f64,
    record: bool,
) -> Result<Replay, ReplayError> {
    replay_linked(plan, &Links::of(plan.problem()), duration, comm, record)
}

/// [`replay`] with the dependency tables of the plan's problem already built.
pub fn replay_linked(
    plan: &Plan,
    links: &Links,
    duration: impl Fn(&Task) -> f64,
    comm: f64,
    record: bool,
) -> Result<Replay, ReplayError> {
    let replayed = replay_bounded(plan, links, duration, comm, record, f64::INFINITY, None)?;
    Ok(replayed.expect("no task ends after an infinite bound"))
}

/// The recorded replay of `plan` under its cost model, or None as soon as some task would end
/// after `bound` (so the makespan would exceed it): a search that keeps a plan only when it is
/// no slower than one it holds stops a losing candidate early. With `resume` (an earlier
/// replay and a sequence number), every task the earlier replay completed before that number
/// keeps its times and the engine goes on from there: right when `plan`'s orders begin with those
/// tasks (checked; the replay starts afresh when they do not) and nothing they waited for has
/// changed, e.g. a candidate that moves a task of one rank to position `p` resumed at the
/// sequence number of the task that was at `p`. Errors as [`replay`]; a candidate stopped early
/// is not checked further.
pub fn replay_within(
    plan: &Plan,
    bound: f64,
    resume: Option<(&Replay, usize)>,
) -> Result<Option<Replay>, ReplayError> {
    let costs = plan.costs();
    let links = Links::of(plan.problem());
    let duration = |t: &Task| costs.task_duration(t);
    replay_bounded(plan, &links, duration, costs.comm(), true, bound, resume)
}
