//! The replay engine: runs every rank's order as early as dependencies allow.
//!
//! Each rank runs its tasks in order; a task starts when the rank is free and every op it depends on
//! (outside the task itself) has finished, plus the cross-rank latency for an op on another rank. The
//! engine is event driven: a rank blocked on an op registers as a waiter of that op and is woken when
//! the op finishes, so a replay costs time linear in the number of ops. When no rank can move and
//! some have tasks left, the plan cannot finish; the engine returns what each blocked rank waits for.
//!
//! The engine assumes every op of every task is in range (the verifier checks that first); an op out
//! of range is reported as an [`EngineFault`] rather than a panic.

use crate::deps::predecessors;
use crate::ids::RankId;
use crate::op::{Op, Task};
use crate::plan::Plan;
use std::collections::VecDeque;

const NONE: u32 = u32::MAX;

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

/// Why the engine could not replay a plan at all.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EngineFault {
    /// An op names a stage or microbatch out of range.
    OutOfRange(RankId, usize, Op),
    /// An op runs a second time.
    RunsTwice(RankId, usize, Op),
}

/// What a replay produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Replay {
    /// Per rank, the tasks that ran with their times, in order.
    pub timeline: Vec<Vec<TimedTask>>,
    /// Ranks that could not finish (empty when the plan completed).
    pub blocked: Vec<Blocked>,
}

/// Replays `plan` with `duration` giving each task's length and `comm` the cross-rank latency.
/// With `record` false the timeline comes back empty (a feasibility check needs no times).
pub fn replay(
    plan: &Plan,
    duration: impl Fn(&Task) -> f64,
    comm: f64,
    record: bool,
) -> Result<Replay, EngineFault> {
    let problem = plan.problem();
    let ranks = plan.orders().len();
    let mut finish = vec![f64::NAN; plan.op_slots()];
    let mut waiter_head = vec![NONE; plan.op_slots()];
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

    while let Some(r) = ready.pop_front() {
        let order = &plan.orders()[r];
        'tasks: while position[r] < order.len() {
            let task = order[position[r]];
            let ops = task.ops();
            let mut start = clock[r];
            let mut slots = [0usize; 3];
            for (k, op) in ops.iter().enumerate() {
                match plan.op_slot(*op) {
                    Some(slot) if problem.has_work(op.stage, op.microbatch) => slots[k] = slot,
                    _ => {
                        return Err(EngineFault::OutOfRange(
                            RankId::new(r as u32),
                            position[r],
                            *op,
                        ))
                    }
                }
                for dep in predecessors(problem, *op) {
                    if ops.contains(&dep) {
                        continue;
                    }
                    let slot = plan
                        .op_slot(dep)
                        .expect("predecessors of an in-range op are in range");
                    let done = finish[slot];
                    if done.is_nan() {
                        waiter_next[r] = waiter_head[slot];
                        waiter_head[slot] = r as u32;
                        waiting_for[r] = Some(dep);
                        break 'tasks;
                    }
                    let owner = problem.rank_of(dep.stage).map(RankId::index);
                    let latency = if owner == Some(r) { 0.0 } else { comm };
                    start = start.max(done + latency);
                }
            }
            let end = start + duration(&task);
            for (op, &slot) in ops.iter().zip(&slots) {
                if !finish[slot].is_nan() {
                    return Err(EngineFault::RunsTwice(
                        RankId::new(r as u32),
                        position[r],
                        *op,
                    ));
                }
                finish[slot] = end;
                let mut w = std::mem::replace(&mut waiter_head[slot], NONE);
                while w != NONE {
                    let next = waiter_next[w as usize];
                    waiter_next[w as usize] = NONE;
                    waiting_for[w as usize] = None;
                    ready.push_back(w as usize);
                    w = next;
                }
            }
            clock[r] = end;
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
    let blocked = (0..ranks)
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
    Ok(Replay { timeline, blocked })
}
