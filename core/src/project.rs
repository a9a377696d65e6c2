//! Projection of a verified global plan into one program per rank.
//!
//! Every cross-rank dependency becomes a message: an activation when a forward's next stage runs on
//! another rank, a gradient when an input-gradient backward's previous stage does. Messages are
//! ordered globally by the simulated time at which their producing task ends (the replay engine's
//! completion order, a topological order, breaking ties), and every rank lays out its events on that
//! one time line: a compute at its simulated start, its sends at its end, a receive where its message
//! is produced (early) or just before its consumer. So the programs follow the simulated schedule:
//! executed with the costs of the model, they take the simulated time. With `Early` receives every rank's communication follows the one global key, so the
//! programs complete even under blocking rendezvous semantics; `JustInTime` receives keep each
//! peer's send order but are guaranteed to complete under batched semantics only (a two-rank
//! exchange of one send each way deadlocks when each blocks on its send).
//!
//! Receive placement is a policy ([`RecvPolicy`]): `Early` posts a receive at the message's place in
//! the global order (as soon as it can exist; each early receive holds a buffer), `JustInTime`
//! right before the compute that consumes it (fewest buffers). Sends and receives that fall between
//! the same two computes form one [`CommGroup`], posted together like `batch_isend_irecv`, so two
//! ranks that exchange at the same time (in a two-rank pipeline the previous and the next peer are
//! one rank) never block each other.
//!
//! Markers: `Loss` after the forward of a route's last stage; `FreeOutput` after an activation is
//! sent; `GradSync(stage)` before the last task producing weight gradients of that stage on the
//! rank; `FlushWeightGrads` at the end. `forward_only` projects the forwards and losses alone.

use crate::check::Semantics;
use crate::deps::predecessors;
use crate::error::CoreError;
use crate::ids::{RankId, StageId};
use crate::op::{Op, OpKind, Task, Work};
use crate::plan::Plan;
use crate::program::{CommGroup, CommOp, Direction, Instr, Message, ProgramSet, RankProgram};
use crate::replay::replay;
use crate::simulate::task_duration;
use crate::verify::{verify_schedule, wait_cycle, Violation, Violations};
use std::collections::HashMap;

/// Where receives go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecvPolicy {
    /// At the message's place in the global order.
    #[default]
    Early,
    /// Right before the consuming compute.
    JustInTime,
}

/// Options of [`project`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ProjectionOptions {
    /// Receive placement.
    pub recv: RecvPolicy,
    /// Project the forwards (and losses) only: evaluation.
    pub forward_only: bool,
}

/// An event of a rank's program before grouping, with its global sort key.
#[derive(Clone, Debug)]
enum Event {
    Compute(Task),
    Loss(Work),
    Comm(CommOp),
    FreeOutput(Work),
    GradSync(StageId),
}

/// Sort key of an event: (time, position in the topological order, class, message).
/// Times are non-negative, so their bit patterns sort like the numbers. A compute sits at its start
/// (`2 q` for its position `q`), its sends at its end (`2 q + 1`), a receive where its message is
/// produced (early) or just before its consumer (just in time).
type Key = u128;

/// Packs a key: 64 bits of time, 30 of topological position, 3 of class, 31 of tie-break.
fn key(time: u64, topo: u64, class: u8, sub: u64) -> Key {
    (u128::from(time) << 64)
        | (u128::from(topo & ((1 << 30) - 1)) << 34)
        | (u128::from(class & 7) << 31)
        | u128::from(sub & ((1 << 31) - 1))
}

/// The tie-break between the messages of one task: activation before gradient.
fn direction_bit(m: &Message) -> u64 {
    u64::from(m.direction == Direction::Gradient)
}

fn time_bits(t: f64) -> u64 {
    t.max(0.0).to_bits()
}

fn message_key(m: &Message) -> u64 {
    let direction = match m.direction {
        Direction::Activation => 0u64,
        Direction::Gradient => 1u64,
    };
    (direction << 62) | (u64::from(m.from_stage.get()) << 32) | u64::from(m.microbatch.get())
}

/// The part of a task a forward-only program runs.
fn forward_part(task: &Task) -> Option<Task> {
    match *task {
        Task::Forward(_) => Some(*task),
        Task::Overlapped { forward, .. } => Some(Task::Forward(forward)),
        _ => None,
    }
}

/// Projects `plan` into per-rank programs. The plan must be complete and runnable: an
/// incomplete plan is rejected (with the verifier's violations), and a replay that cannot finish
/// is rejected with its cycle; the programs themselves are for [`crate::check_programs`] to check.
pub fn project(plan: &Plan, options: ProjectionOptions) -> Result<ProgramSet, CoreError> {
    let ops: usize = plan.orders().iter().flatten().map(|t| t.ops().len()).sum();
    if ops != plan.problem().work_count() * 3 {
        verify_schedule(plan)?;
    }
    let source = if options.forward_only {
        let orders = plan
            .orders()
            .iter()
            .map(|o| o.iter().filter_map(forward_part).collect())
            .collect();
        plan.clone().with_orders(orders)?
    } else {
        plan.clone()
    };
    let outcome = replay(
        &source,
        |t| task_duration(&source, t),
        source.costs().comm(),
        true,
    )
    .map_err(|_| match verify_schedule(plan) {
        Err(e) => e,
        Ok(()) => CoreError::Verification(Violations(Vec::new())),
    })?;
    if !outcome.blocked.is_empty() {
        return Err(CoreError::Verification(Violations(vec![Violation::Cycle(
            wait_cycle(&source, &outcome.blocked),
        )])));
    }
    let problem = source.problem();
    let owner = |s: StageId| {
        problem
            .rank_of(s)
            .expect("verified plans name stages in range")
    };
    // The completion sequence of every op's task.
    let mut sequence = vec![usize::MAX; source.op_slots()];
    let mut produced_at = vec![0.0f64; source.op_slots()];
    let slot = |op: Op| {
        source
            .op_slot(op)
            .expect("verified plans name ops in range")
    };
    for tasks in &outcome.timeline {
        for t in tasks {
            for op in t.task.ops() {
                sequence[slot(op)] = t.sequence;
                produced_at[slot(op)] = t.end;
            }
        }
    }
    // The task holding the last weight-gradient op of each (rank, stage).
    let mut last_weight: HashMap<StageId, usize> = HashMap::new();
    let mut programs = Vec::with_capacity(outcome.timeline.len());
    for (r, tasks) in outcome.timeline.iter().enumerate() {
        let rank = RankId::new(r as u32);
        last_weight.clear();
        for t in tasks {
            for op in t.task.ops().iter().filter(|o| o.kind == OpKind::WeightGrad) {
                last_weight.insert(op.stage, t.sequence);
            }
        }
        let mut events: Vec<(Key, Event)> = Vec::new();
        // Just-in-time receives: (peer, producing sequence, consumer's key, message).
        let mut late: Vec<(RankId, usize, (u64, u64), Message)> = Vec::new();
        for t in tasks {
            let q = t.sequence;
            let (start, end) = (time_bits(t.start), time_bits(t.end));
            let (at_start, at_end) = (2 * q as u64, 2 * q as u64 + 1);
            let ops = t.task.ops();
            for op in &ops {
                for dep in predecessors(problem, *op) {
                    if ops.contains(&dep) || owner(dep.stage) == rank {
                        continue;
                    }
                    let message = match dep.kind {
                        OpKind::Forward => Message::activation(dep.stage, op.stage, op.microbatch),
                        _ => Message::gradient(dep.stage, op.stage, op.microbatch),
                    };
                    let produced = sequence[slot(dep)];
                    let from = owner(dep.stage);
                    match options.recv {
                        RecvPolicy::Early => events.push((
                            key(
                                time_bits(produced_at[slot(dep)]),
                                2 * produced as u64 + 1,
                                4,
                                direction_bit(&message),
                            ),
                            Event::Comm(CommOp::Recv { from, message }),
                        )),
                        RecvPolicy::JustInTime => {
                            late.push((from, produced, (start, at_start), message))
                        }
                    }
                }
            }
            for stage in ops
                .iter()
                .filter(|o| o.kind == OpKind::WeightGrad)
                .map(|o| o.stage)
            {
                if last_weight.get(&stage) == Some(&q) {
                    events.push((
                        key(start, at_start, 1, u64::from(stage.get())),
                        Event::GradSync(stage),
                    ));
                }
            }
            events.push((key(start, at_start, 2, 0), Event::Compute(t.task)));
            for op in &ops {
                let Some(route) = problem.route_of(op.microbatch) else {
                    continue;
                };
                match op.kind {
                    OpKind::Forward => match route.next(op.stage) {
                        None => events.push((
                            key(start, at_start, 3, 0),
                            Event::Loss(Work {
                                stage: op.stage,
                                microbatch: op.microbatch,
                            }),
                        )),
                        Some(next) if owner(next) != rank => {
                            let message = Message::activation(op.stage, next, op.microbatch);
                            events.push((
                                key(end, at_end, 4, direction_bit(&message)),
                                Event::Comm(CommOp::Send {
                                    to: owner(next),
                                    message,
                                }),
                            ));
                            let work = Work {
                                stage: op.stage,
                                microbatch: op.microbatch,
                            };
                            events.push((
                                key(end, at_end, 5, direction_bit(&message)),
                                Event::FreeOutput(work),
                            ));
                        }
                        Some(_) => {}
                    },
                    OpKind::InputGrad => {
                        if let Some(prev) = route.prev(op.stage) {
                            if owner(prev) != rank {
                                let message = Message::gradient(op.stage, prev, op.microbatch);
                                events.push((
                                    key(end, at_end, 4, direction_bit(&message)),
                                    Event::Comm(CommOp::Send {
                                        to: owner(prev),
                                        message,
                                    }),
                                ));
                            }
                        }
                    }
                    OpKind::WeightGrad => {}
                }
            }
        }
        place_just_in_time(&mut late, &mut events);
        events.sort_unstable_by_key(|e| e.0);
        programs.push(RankProgram {
            rank,
            instrs: lay_out(events, options.forward_only),
        });
    }
    let semantics = match options.recv {
        RecvPolicy::Early => Semantics::Blocking,
        RecvPolicy::JustInTime => Semantics::Batched,
    };
    Ok(ProgramSet {
        programs,
        forward_only: options.forward_only,
        semantics,
    })
}

/// Places just-in-time receives right before their consumers, except that the receives from one
/// peer keep the order of that peer's sends (the k-th send matches the k-th receive): a receive
/// moves earlier when a later message of the same peer is needed sooner.
fn place_just_in_time(
    late: &mut [(RankId, usize, (u64, u64), Message)],
    events: &mut Vec<(Key, Event)>,
) {
    // The peer sends in the order (producing sequence, message key).
    late.sort_by_key(|&(peer, produced, _, m)| (peer, produced, message_key(&m)));
    let mut i = late.len();
    let mut bound = (u64::MAX, u64::MAX);
    let mut current_peer = None;
    while i > 0 {
        i -= 1;
        let (peer, produced, consumer, message) = late[i];
        if current_peer != Some(peer) {
            current_peer = Some(peer);
            bound = (u64::MAX, u64::MAX);
        }
        bound = bound.min(consumer);
        // The peer's send order: by producing task, then activation before gradient.
        let tiebreak =
            ((produced as u64) << 1) | u64::from(message.direction == Direction::Gradient);
        events.push((
            key(bound.0, bound.1, 0, tiebreak),
            Event::Comm(CommOp::Recv {
                from: peer,
                message,
            }),
        ));
    }
}

/// Turns sorted events into instructions: consecutive sends and receives form one group; frees
/// follow the group that sent the output.
fn lay_out(events: Vec<(Key, Event)>, forward_only: bool) -> Vec<Instr> {
    let mut instrs = Vec::with_capacity(events.len() + 1);
    let mut group = CommGroup::default();
    let mut frees: Vec<Work> = Vec::new();
    let flush = |instrs: &mut Vec<Instr>, group: &mut CommGroup, frees: &mut Vec<Work>| {
        if !group.ops.is_empty() {
            instrs.push(Instr::Comm(std::mem::take(group)));
        }
        instrs.extend(frees.drain(..).map(Instr::FreeOutput));
    };
    for (_, event) in events {
        match event {
            Event::Comm(op) => group.ops.push(op),
            Event::FreeOutput(w) => frees.push(w),
            Event::Compute(t) => {
                flush(&mut instrs, &mut group, &mut frees);
                instrs.push(Instr::Compute(t));
            }
            Event::Loss(w) => {
                flush(&mut instrs, &mut group, &mut frees);
                instrs.push(Instr::Loss(w));
            }
            Event::GradSync(s) => {
                flush(&mut instrs, &mut group, &mut frees);
                instrs.push(Instr::GradSync(s));
            }
        }
    }
    flush(&mut instrs, &mut group, &mut frees);
    if !forward_only {
        instrs.push(Instr::FlushWeightGrads);
    }
    instrs
}
