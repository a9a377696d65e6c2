//! The replay engine's event loop ([`replay_bounded`]): every rank runs its order as early as
//! dependencies allow; a rank blocked on an op waits on that op's list of waiters until the op
//! finishes (see the module doc of [`super`]).

use super::deadlock::wait_cycle;
use super::host_links::HostLinks;
use super::resume::agreeing_prefix;
use super::{Blocked, Replay, ReplayError, TimedTask};
use crate::ir::all_to_all::A2aPhases;
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, OpKind, Task, Work};
use crate::ir::plan::Plan;
use std::collections::VecDeque;
use std::ops::ControlFlow;

const NONE: u32 = u32::MAX;

/// Why a rank stops at a task: one of its ops is out of range, or waits for an op (with its slot)
/// that has not run yet.
enum Stop {
    OutOfRange(Op),
    Waits(Op, usize),
}

/// The engine: [`replay_linked`] giving up (None) when a task would end after `bound`, resumed
/// from a prefix of an earlier replay where one is given and agrees with `plan`.
pub(super) fn replay_bounded(
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
    // All-to-alls before and after a task's compute (a mixture of experts): a replay resumed
    // from an earlier one would not know the tails of the tasks it keeps, so it starts afresh.
    let costs = plan.costs();
    let a2a = costs.has_a2a();
    if let Some((earlier, cut)) = resume.filter(|_| record && !a2a) {
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
                // When the task's inputs are ready (its head all-to-all then runs before it).
                let mut inputs = f64::NEG_INFINITY;
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
                        inputs = inputs.max(done + latency);
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
                let phases = if a2a {
                    costs.a2a_phases(&task)
                } else {
                    A2aPhases::NONE
                };
                if inputs.is_finite() {
                    start = start.max(inputs + phases.head);
                }
                let end = start + duration(&task);
                if end > bound {
                    return Ok(None);
                }
                // What needs the task's outputs waits for its tail all-to-all too.
                let outputs_ready = end + phases.tail;
                let mut k = 0;
                let twice = task.try_for_each_op(|op| {
                    let slot = own[k];
                    k += 1;
                    if !finish[slot].is_nan() {
                        return ControlFlow::Break(op);
                    }
                    finish[slot] = outputs_ready;
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

/// When what an offload of `work` moves exists: the end of the first of its
/// [`Work::offload_sources`] that ran; None when neither has.
fn produced(links: &Links, finish: &[f64], work: Work) -> Option<f64> {
    work.offload_sources()
        .into_iter()
        .filter_map(|op| links.slot(op))
        .map(|slot| finish[slot])
        .find(|end| !end.is_nan())
}
