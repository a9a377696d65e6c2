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

use crate::analysis::link::offload_producers;
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, OpKind, Task, Work};
use crate::ir::plan::Plan;
use std::collections::VecDeque;
use std::fmt;
use std::ops::ControlFlow;
use thiserror::Error;

const NONE: u32 = u32::MAX;

/// Why a rank stops at a task: one of its ops is out of range, or waits for an op (with its slot)
/// that has not run yet.
enum Stop {
    OutOfRange(Op),
    Waits(Op, usize),
}

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

/// The engine: [`replay_linked`] giving up (None) when a task would end after `bound`, resumed
/// from a prefix of an earlier replay where one is given and agrees with `plan`.
fn replay_bounded(
    plan: &Plan,
    links: &Links,
    duration: impl Fn(&Task) -> f64,
    comm: f64,
    record: bool,
    bound: f64,
    resume: Option<(&Replay, usize)>,
) -> Result<Option<Replay>, ReplayError> {
    let ranks = plan.orders().len();
    let slots = links.slots();
    let mut finish = vec![f64::NAN; slots.len()];
    let mut waiter_head = vec![NONE; slots.len()];
    let mut waiter_next = vec![NONE; ranks];
    let mut position = vec![0usize; ranks];
    let mut clock = vec![0.0f64; ranks];
    let mut timeline: Vec<Vec<TimedTask>> = plan
        .orders()
        .iter()
        .map(|o| Vec::with_capacity(if record { o.len() } else { 0 }))
        .collect();
    let mut waiting_for: Vec<Option<Op>> = vec![None; ranks];
    let mut ready: VecDeque<usize> = (0..ranks).collect();
    let mut completed = 0usize;
    let mut host = HostLinks::new(plan, ranks, slots.pairs());
    if let Some((earlier, cut)) = resume.filter(|_| record) {
        if let Some(prefix) = agreeing_prefix(plan, &host.producers, earlier, cut) {
            if prefix
                .iter()
                .flat_map(|done| done.iter())
                .any(|t| t.end > bound)
            {
                return Ok(None);
            }
            for (r, done) in prefix.iter().enumerate() {
                for (p, timed) in done.iter().enumerate() {
                    host.seed(r, (p, timed), links, &mut finish, &mut clock[r]);
                    if let Some(over) = host.issue(r, p, timed.end, plan, &duration, bound) {
                        return over;
                    }
                }
                position[r] = done.len();
                completed += done.len();
                timeline[r].extend_from_slice(done);
            }
        }
    }

    while let Some(r) = ready.pop_front() {
        let order = &plan.orders()[r];
        while position[r] < order.len() {
            let task = order[position[r]];
            let at = |op| (RankId::new(r as u32), position[r], op);
            let (start, end) = if task.is_residency() {
                let w = task.work();
                if !links.has_work(w.stage, w.microbatch) {
                    let (rank, position, op) = at(w.op(OpKind::Forward));
                    return Err(ReplayError::OutOfRange(rank, position, op));
                }
                let pair = slots.pair(w.stage, w.microbatch);
                // An offload went on the link when its producer ended (see `HostLinks::issue`);
                // one without a producer before it, once what it moves exists; any other
                // transfer once the compute before it ended.
                let (start, end) = match host.issued_here(r, position[r]) {
                    Some(times) => times,
                    None => {
                        let issued = match task {
                            Task::Offload(w) => produced(links, &finish, w).unwrap_or(clock[r]),
                            _ => clock[r],
                        };
                        host.run(r, &task, pair, (&mut clock[r], issued), duration(&task))
                    }
                };
                if end > bound {
                    return Ok(None);
                }
                (start, end)
            } else {
                let mut start = clock[r];
                if task.allocates() {
                    start = start.max(host.fence[r]);
                }
                let mut own = [0usize; 3];
                let mut count = 0;
                let ready_or_not = task.try_for_each_op(|op| {
                    let located = links.try_for_each_dep(op, |dep, slot| {
                        if task.runs(dep) {
                            return ControlFlow::Continue(());
                        }
                        let done = finish[slot];
                        if done.is_nan() {
                            return ControlFlow::Break(Stop::Waits(dep, slot));
                        }
                        let owner = links.owner(dep.stage).map(RankId::index);
                        let latency = if owner == Some(r) { 0.0 } else { comm };
                        start = start.max(done + latency);
                        ControlFlow::Continue(())
                    });
                    let Some((slot, flow)) = located else {
                        return ControlFlow::Break(Stop::OutOfRange(op));
                    };
                    // A backward of an offloaded pair waits for its reload (an I, or the W of a
                    // pair offloaded between its I and W).
                    if host.offloads && op.kind != OpKind::Forward {
                        start = start.max(host.reloaded(slots.pair(op.stage, op.microbatch)));
                    }
                    own[count] = slot;
                    count += 1;
                    flow
                });
                match ready_or_not {
                    ControlFlow::Continue(()) => {}
                    ControlFlow::Break(Stop::OutOfRange(op)) => {
                        let (rank, position, op) = at(op);
                        return Err(ReplayError::OutOfRange(rank, position, op));
                    }
                    ControlFlow::Break(Stop::Waits(dep, slot)) => {
                        waiter_next[r] = waiter_head[slot];
                        waiter_head[slot] = r as u32;
                        waiting_for[r] = Some(dep);
                        break;
                    }
                }
                let end = start + duration(&task);
                if end > bound {
                    return Ok(None);
                }
                let mut k = 0;
                let twice = task.try_for_each_op(|op| {
                    let slot = own[k];
                    k += 1;
                    if !finish[slot].is_nan() {
                        return ControlFlow::Break(op);
                    }
                    finish[slot] = end;
                    if waiter_head[slot] == NONE {
                        return ControlFlow::Continue(());
                    }
                    let mut w = std::mem::replace(&mut waiter_head[slot], NONE);
                    while w != NONE {
                        let next = waiter_next[w as usize];
                        waiter_next[w as usize] = NONE;
                        waiting_for[w as usize] = None;
                        ready.push_back(w as usize);
                        w = next;
                    }
                    ControlFlow::Continue(())
                });
                if let ControlFlow::Break(op) = twice {
                    let (rank, position, op) = at(op);
                    return Err(ReplayError::RunsTwice(rank, position, op));
                }
                clock[r] = end;
                if let Some(over) = host.issue(r, position[r], end, plan, &duration, bound) {
                    return over;
                }
                (start, end)
            };
            if record {
                timeline[r].push(TimedTask {
                    task,
                    start,
                    end,
                    sequence: completed,
                });
            }
            completed += 1;
            position[r] += 1;
        }
    }
    let blocked: Vec<Blocked> = (0..ranks)
        .filter_map(|r| {
            let needs = waiting_for[r]?;
            Some(Blocked {
                rank: RankId::new(r as u32),
                position: position[r],
                task: plan.orders()[r][position[r]],
                needs,
            })
        })
        .collect();
    if blocked.is_empty() {
        Ok(Some(Replay { timeline }))
    } else {
        Err(ReplayError::Deadlock(wait_cycle(plan, &blocked)))
    }
}

/// The ranks' host links as the engine runs them (see the module doc).
struct HostLinks {
    /// Whether the plan offloads (else nothing waits for a reload).
    offloads: bool,
    /// Per rank, when its link is free.
    free: Vec<f64>,
    /// Per rank, when the last offload whose place the rank passed ends.
    fence: Vec<f64>,
    /// Per pair, when its reload ends (NaN: not reloaded, or not yet); empty without offload.
    reloaded: Vec<f64>,
    /// Per rank, its offloads with their producers ([`offload_producers`]); empty without
    /// offload.
    producers: Vec<Vec<(usize, usize)>>,
    /// Per rank, how many of `producers` have been issued.
    next_issue: Vec<usize>,
    /// Per rank, per position, the link times of the offload there once issued by its producer
    /// (NaN before); empty without offload.
    issued: Vec<Vec<(f64, f64)>>,
}

impl HostLinks {
    fn new(plan: &Plan, ranks: usize, pairs: usize) -> HostLinks {
        let offloads = plan.facts().residency.offloaded;
        let slots = plan.slots();
        let producers: Vec<Vec<(usize, usize)>> = if offloads {
            plan.orders()
                .iter()
                .map(|o| offload_producers(o, slots))
                .collect()
        } else {
            Vec::new()
        };
        let issued = if offloads {
            let unset = (f64::NAN, f64::NAN);
            plan.orders().iter().map(|o| vec![unset; o.len()]).collect()
        } else {
            Vec::new()
        };
        HostLinks {
            offloads,
            free: vec![0.0; ranks],
            fence: vec![0.0; ranks],
            reloaded: vec![f64::NAN; if offloads { pairs } else { 0 }],
            producers,
            next_issue: vec![0; ranks],
            issued,
        }
    }

    /// Puts on rank `r`'s link the offloads the compute at `position` (ended at `end`) issues,
    /// if any; `Some(Ok(None))` when one would end after `bound`.
    fn issue(
        &mut self,
        r: usize,
        position: usize,
        end: f64,
        plan: &Plan,
        duration: &impl Fn(&Task) -> f64,
        bound: f64,
    ) -> Option<Result<Option<Replay>, ReplayError>> {
        let producers = self.producers.get(r)?;
        let mut over = false;
        while let Some(&(producer, offload)) = producers.get(self.next_issue[r]) {
            if producer != position {
                break;
            }
            self.next_issue[r] += 1;
            let start = end.max(self.free[r]);
            let finish = start + duration(&plan.orders()[r][offload]);
            self.free[r] = finish;
            self.issued[r][offload] = (start, finish);
            over |= finish > bound;
        }
        over.then_some(Ok(None))
    }

    /// The link times of the offload at `position` of rank `r` if its producer issued it; its
    /// place frees the device copy once it ends (the fence of what allocates after it).
    fn issued_here(&mut self, r: usize, position: usize) -> Option<(f64, f64)> {
        let &(start, end) = self.issued.get(r)?.get(position)?;
        if start.is_nan() {
            return None;
        }
        self.fence[r] = self.fence[r].max(end);
        Some((start, end))
    }

    /// Runs a residency task of rank `r` (on pair `pair`) taking `length`: a recompute on the
    /// rank's compute (after the offloads before it), a transfer on its link once the compute
    /// before it ended and the link is free. Returns its start and end.
    fn run(
        &mut self,
        r: usize,
        task: &Task,
        pair: Option<usize>,
        (clock, issued): (&mut f64, f64),
        length: f64,
    ) -> (f64, f64) {
        if let Task::Recompute(_) | Task::RecomputeWeightGrad(_) = task {
            let start = clock.max(self.fence[r]);
            *clock = start + length;
            return (start, *clock);
        }
        let start = issued.max(self.free[r]);
        let end = start + length;
        self.free[r] = end;
        match (task, pair) {
            (Task::Reload(_), Some(pair)) if self.offloads => self.reloaded[pair] = end,
            _ => self.fence[r] = self.fence[r].max(end),
        }
        (start, end)
    }

    /// Takes over `timed`, a task of rank `r` an earlier replay ran: the ends of its ops, the
    /// rank's clock, its link and fence, as running it here would have left them.
    fn seed(
        &mut self,
        r: usize,
        (position, timed): (usize, &TimedTask),
        links: &Links,
        finish: &mut [f64],
        clock: &mut f64,
    ) {
        let task = timed.task;
        if task.on_link() {
            if self.issued_here(r, position).is_some() {
                return;
            }
            self.free[r] = timed.end;
            let pair = links
                .slots()
                .pair(task.work().stage, task.work().microbatch);
            match (task, pair) {
                (Task::Reload(_), Some(pair)) if self.offloads => self.reloaded[pair] = timed.end,
                _ => self.fence[r] = self.fence[r].max(timed.end),
            }
            return;
        }
        *clock = timed.end;
        if !task.is_residency() {
            let _ = task.try_for_each_op(|op| {
                if let Some(slot) = links.slot(op) {
                    finish[slot] = timed.end;
                }
                ControlFlow::<()>::Continue(())
            });
        }
    }

    /// When the reload of `pair` ends (0 when it has none, or none yet).
    fn reloaded(&self, pair: Option<usize>) -> f64 {
        let ends = pair.and_then(|p| self.reloaded.get(p)).copied();
        ends.filter(|e| !e.is_nan()).unwrap_or(0.0)
    }
}

/// When what an offload of `work` moves exists: the end of the first of its
/// [`Work::offload_sources`] that ran; None when neither has.
fn produced(links: &Links, finish: &[f64], work: Work) -> Option<f64> {
    work.offload_sources()
        .into_iter()
        .filter_map(|op| links.slot(op))
        .map(|slot| finish[slot])
        .find(|end| !end.is_nan())
}

/// Per rank, the tasks `earlier` completed before sequence number `cut`, when they begin the
/// rank's order in `plan` (None when some do not: the replay then starts afresh).
/// With offloads, the prefix ends before the first compute (on any rank) that issues another
/// offload in `plan` than in `earlier` (`producers`: `plan`'s, per rank), as the link's times
/// after it change.
fn agreeing_prefix<'r>(
    plan: &Plan,
    producers: &[Vec<(usize, usize)>],
    earlier: &'r Replay,
    cut: usize,
) -> Option<Vec<&'r [TimedTask]>> {
    if earlier.timeline.len() != plan.orders().len() {
        return None;
    }
    let mut cut = cut;
    if !producers.is_empty() {
        let slots = plan.slots();
        for (r, row) in earlier.timeline.iter().enumerate() {
            let tasks: Vec<Task> = row.iter().map(|t| t.task).collect();
            let before = offload_producers(&tasks, slots);
            let now = &producers[r];
            let issuing = |list: &[(usize, usize)], k: usize| {
                list.get(k)
                    .map(|&(p, o)| (p, plan.orders()[r].get(o).copied()))
            };
            let differs = (0..before.len().max(now.len())).find(|&k| {
                let earlier_issue = before.get(k).map(|&(p, o)| (p, Some(tasks[o])));
                earlier_issue != issuing(now, k)
            });
            if let Some(k) = differs {
                let first = [before.get(k), now.get(k)]
                    .into_iter()
                    .flatten()
                    .map(|&(p, _)| p)
                    .min()
                    .unwrap_or(0);
                if let Some(t) = row.get(first) {
                    cut = cut.min(t.sequence);
                }
            }
        }
    }
    earlier
        .timeline
        .iter()
        .zip(plan.orders())
        .map(|(row, order)| {
            let done = row.iter().take_while(|t| t.sequence < cut).count();
            let agrees = done <= order.len()
                && row[..done]
                    .iter()
                    .zip(order)
                    .all(|(t, task)| t.task == *task);
            agrees.then_some(&row[..done])
        })
        .collect()
}

/// Follows "rank waits for an op of rank q" from the first blocked rank until a rank repeats and
/// returns the waits on that cycle (all blocked ranks when no cycle closes, which a structurally
/// sound plan cannot produce).
fn wait_cycle(plan: &Plan, blocked: &[Blocked]) -> Vec<Blocked> {
    let mut by_rank: Vec<Option<Blocked>> = vec![None; plan.orders().len()];
    for b in blocked {
        by_rank[b.rank.index()] = Some(*b);
    }
    let Some(start) = blocked.first() else {
        return Vec::new();
    };
    let mut path: Vec<Blocked> = Vec::new();
    let mut on_path = vec![usize::MAX; by_rank.len()];
    let mut current = *start;
    loop {
        if on_path[current.rank.index()] != usize::MAX {
            return path.split_off(on_path[current.rank.index()]);
        }
        on_path[current.rank.index()] = path.len();
        path.push(current);
        let owner = plan.problem().rank_of(current.needs.stage);
        match owner.and_then(|o| by_rank[o.index()]) {
            Some(next) => current = next,
            None => return blocked.to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(orders: &[&[&str]]) -> Plan {
        let rows: Vec<String> = orders.iter().map(|o| o.join(" ")).collect();
        let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
        crate::testing::plan(1, &rows)
    }

    #[test]
    fn tasks_start_as_early_as_dependencies_allow() {
        let p = plan(&[&["0F0", "0B0"], &["1F0", "1B0"]]);
        let replayed = replay(&p, |_| 1.0, 0.5, true).unwrap();
        let times: Vec<(f64, f64)> = replayed.timeline[1]
            .iter()
            .map(|t| (t.start, t.end))
            .collect();
        assert_eq!(times, [(1.5, 2.5), (2.5, 3.5)]);
        assert_eq!(replayed.timeline[0][1].start, 4.0);
        assert!(replay(&p, |_| 1.0, 0.0, false).unwrap().timeline[0].is_empty());
    }

    #[test]
    fn a_cycle_of_waits_is_a_deadlock_naming_every_rank_on_it() {
        // Rank 0 wants the gradient before sending the activation it depends on.
        let p = plan(&[&["0B0", "0F0"], &["1F0", "1B0"]]);
        match replay(&p, |_| 1.0, 0.0, false) {
            Err(ReplayError::Deadlock(waits)) => {
                let text = ReplayError::Deadlock(waits.clone()).to_string();
                assert!(text.contains("rank 0 waits at task 0 (0B0)"), "{text}");
            }
            other => panic!("expected a deadlock, got {other:?}"),
        }
    }

    #[test]
    fn transfers_run_on_the_link_beside_the_computes() {
        // One rank, two microbatches. The offload of 0F0 takes [1, 3]; 0F1 allocates, so it
        // waits for it: [3, 4]. 0B1 [4, 6]; the reload is issued after 0B1 ([6, 8]) and 0B0
        // waits for it.
        let plan = crate::testing::plan(2, &["0F0 0OFFLOAD0 0F1 0B1 0RELOAD0 0B0"]);
        let duration = |t: &Task| match t {
            Task::Offload(_) | Task::Reload(_) => 2.0,
            Task::Backward(_) => 2.0,
            _ => 1.0,
        };
        let replayed = replay(&plan, duration, 0.0, true).unwrap();
        let times: Vec<(String, f64, f64)> = replayed.timeline[0]
            .iter()
            .map(|t| (t.task.to_string(), t.start, t.end))
            .collect();
        let expected = [
            ("0F0", 0.0, 1.0),
            ("0OFFLOAD0", 1.0, 3.0),
            ("0F1", 3.0, 4.0),
            ("0B1", 4.0, 6.0),
            ("0RELOAD0", 6.0, 8.0),
            ("0B0", 8.0, 10.0),
        ];
        let expected: Vec<(String, f64, f64)> = expected
            .iter()
            .map(|&(t, a, b)| (t.to_string(), a, b))
            .collect();
        assert_eq!(times, expected);
    }

    #[test]
    fn an_offload_placed_late_is_issued_when_its_forward_ends() {
        // The offload of 0F0 sits after 0F1 (its device copy freed there): it is issued when
        // 0F0 ends, [1, 3], and 0F1 (before it in the order) does not wait for it: [1, 2].
        // 0B1 [2, 4]; the reload is issued after 0B1, [4, 6]; 0B0 waits for it.
        let plan = crate::testing::plan(2, &["0F0 0F1 0OFFLOAD0 0B1 0RELOAD0 0B0"]);
        let duration = |t: &Task| match t {
            Task::Offload(_) | Task::Reload(_) | Task::Backward(_) => 2.0,
            _ => 1.0,
        };
        let replayed = replay(&plan, duration, 0.0, true).unwrap();
        let times: Vec<(f64, f64)> = replayed.timeline[0]
            .iter()
            .map(|t| (t.start, t.end))
            .collect();
        assert_eq!(
            times,
            [
                (0.0, 1.0),
                (1.0, 2.0),
                (1.0, 3.0),
                (2.0, 4.0),
                (4.0, 6.0),
                (6.0, 8.0)
            ]
        );
    }

    #[test]
    fn a_w_waits_for_the_reload_of_what_it_keeps() {
        // 0F0 [0,1], 0I0 [1,2]; what its W keeps goes out [2,4] and comes back [4,6] (issued
        // after 0I0, once the link is free): 0W0 waits for it.
        let plan = crate::testing::plan(1, &["0F0 0I0 0OFFLOAD0 0RELOAD0 0W0"]);
        let duration = |t: &Task| if t.on_link() { 2.0 } else { 1.0 };
        let replayed = replay(&plan, duration, 0.0, true).unwrap();
        let times: Vec<(f64, f64)> = replayed.timeline[0]
            .iter()
            .map(|t| (t.start, t.end))
            .collect();
        assert_eq!(
            times,
            [(0.0, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 6.0), (6.0, 7.0)]
        );
    }

    #[test]
    fn a_reload_placed_early_hides_behind_the_computes() {
        let plan = crate::testing::plan(2, &["0F0 0OFFLOAD0 0F1 0RELOAD0 0B1 0B0"]);
        let replayed = replay(&plan, |_| 1.0, 0.0, true).unwrap();
        let ends: Vec<f64> = replayed.timeline[0].iter().map(|t| t.end).collect();
        // F0 [0,1], offload [1,2], F1 [2,3], reload [3,4] beside B1 [3,4], B0 [4,5].
        assert_eq!(ends, [1.0, 2.0, 3.0, 4.0, 4.0, 5.0]);
        // A recompute runs on the compute side.
        let plan = crate::testing::plan(2, &["0F0 0F1 0B1 0R0 0B0"]);
        let replayed = replay(&plan, |_| 1.0, 0.0, true).unwrap();
        assert_eq!(replayed.timeline[0][4].end, 5.0);
    }

    #[test]
    fn a_resumed_replay_equals_a_fresh_one_and_a_bound_stops_it() {
        let before = crate::testing::plan(
            2,
            &[
                "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0RELOAD0 0B0 0RELOAD1 0B1",
                "1F0 1B0 1F1 1B1",
            ],
        );
        let earlier = replay_within(&before, f64::INFINITY, None)
            .unwrap()
            .unwrap();
        // The second reload moved before the first backward: every task that ran before the
        // task now displaced (0B0, at position 5) keeps its times.
        let after = crate::testing::plan(
            2,
            &[
                "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0RELOAD0 0RELOAD1 0B0 0B1",
                "1F0 1B0 1F1 1B1",
            ],
        );
        let cut = earlier.timeline[0][5].sequence;
        let fresh = replay_within(&after, f64::INFINITY, None).unwrap().unwrap();
        let resumed = replay_within(&after, f64::INFINITY, Some((&earlier, cut))).unwrap();
        let times = |r: &Replay| -> Vec<Vec<(Task, f64, f64)>> {
            let row = |row: &Vec<TimedTask>| row.iter().map(|t| (t.task, t.start, t.end)).collect();
            r.timeline.iter().map(row).collect()
        };
        assert_eq!(times(&resumed.unwrap()), times(&fresh));
        assert_ne!(
            times(&fresh)[0],
            times(&earlier)[0],
            "the move changes rank 0's times"
        );
        // A prefix that does not begin the plan's orders is ignored: the replay starts afresh.
        let wrong = replay_within(&after, f64::INFINITY, Some((&earlier, usize::MAX))).unwrap();
        assert_eq!(times(&wrong.unwrap()), times(&fresh));
        // No task ends after the makespan; one unit less is beaten, resumed or not.
        let makespan = fresh.makespan();
        assert!(replay_within(&after, makespan, None).unwrap().is_some());
        assert!(replay_within(&after, makespan - 1.0, None)
            .unwrap()
            .is_none());
        assert!(replay_within(&after, makespan - 1.0, Some((&earlier, cut)))
            .unwrap()
            .is_none());
    }

    #[test]
    fn repeated_and_out_of_range_ops_are_faults_not_panics() {
        let twice = plan(&[&["0F0", "0F0", "0B0"], &["1F0", "1B0"]]);
        assert!(matches!(
            replay(&twice, |_| 1.0, 0.0, false),
            Err(ReplayError::RunsTwice(..))
        ));
        let far = plan(&[&["0F7"], &["1F0", "1B0"]]);
        assert!(matches!(
            replay(&far, |_| 1.0, 0.0, false),
            Err(ReplayError::OutOfRange(..))
        ));
    }
}
