//! Projection of a verified global plan into one program per rank.
//!
//! Every cross-rank dependency becomes a message ([`crate::spmd::messages`]): an activation when a
//! forward's next stage runs on another rank, a gradient when an input-gradient backward's previous
//! stage does. Messages are ordered globally by the simulated time at which their producing task
//! ends (the replay engine's completion order, a topological order, breaking ties), and every rank
//! lays out its events on that one time line: a compute at its simulated start, its sends at its
//! end, a receive where its message is produced (early) or just before its consumer. So the
//! programs follow the simulated schedule: executed with the costs of the model, they take the
//! simulated time. With `Early` receives every rank's communication follows the one global key, so
//! the programs complete even under blocking rendezvous semantics; `JustInTime` receives keep each
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
//!
//! The steps: [`timed_source`] replays the plan (forward part only, for evaluation);
//! [`Producers`] records when and in which order every op's task completed; a [`RankEvents`] per
//! rank collects keyed events ([`EventKey`], [`EventClass`]); [`lay_out`] sorts them and groups
//! neighbouring sends and receives.

use crate::analysis::replay::{replay, TimedTask};
use crate::analysis::verify::{verify_schedule, Violations};
use crate::ir::ids::{RankId, StageId};
use crate::ir::op::{Op, OpKind, Task, Work};
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::messages::{remote_inputs, remote_outputs};
use crate::spmd::program::{
    CommGroup, CommOp, Direction, Instr, Message, ProgramSet, RankProgram, Semantics,
};
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

/// An event of a rank's program before grouping.
#[derive(Clone, Debug)]
enum Event {
    Compute(Task),
    Loss(Work),
    Comm(CommOp),
    FreeOutput(Work),
    GradSync(StageId),
}

/// What an event is, in the order events at the same moment come: a just-in-time receive before
/// the compute it feeds, a gradient-sync marker right before its compute, the compute, the loss
/// after its forward, sends (and early receives) at a task's end, frees after their sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum EventClass {
    JustInTimeReceive,
    GradSync,
    Compute,
    Loss,
    Communication,
    FreeOutput,
}

/// A point on the one global time line: (simulated time, position in the topological order,
/// class, tie-break). A compute sits at its start (`2 q` for its task's completion sequence `q`),
/// its sends at its end (`2 q + 1`), a receive where its message is produced (early) or just
/// before its consumer (just in time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct EventKey {
    /// The bits of a non-negative time, which sort like the times.
    time: u64,
    topo: u64,
    class: EventClass,
    tiebreak: u64,
}

/// A moment of a task on the time line: (time bits, topological position).
type Moment = (u64, u64);

fn time_bits(t: f64) -> u64 {
    t.max(0.0).to_bits()
}

/// The tie-break between the messages of one task: activation before gradient.
fn direction_bit(m: &Message) -> u64 {
    u64::from(m.direction == Direction::Gradient)
}

/// The order in which a peer sends its messages: by producing task, then direction, then stage
/// and microbatch.
fn message_key(m: &Message) -> u64 {
    (direction_bit(m) << 62) | (u64::from(m.from_stage.get()) << 32) | u64::from(m.microbatch.get())
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
/// incomplete plan or one that cannot finish is rejected with the verifier's violations; the
/// programs themselves are for [`crate::spmd::check::check_programs`] to check.
pub fn project(plan: &Plan, options: ProjectionOptions) -> Result<ProgramSet, Violations> {
    let ops: usize = plan.orders().iter().flatten().map(|t| t.ops().len()).sum();
    if ops != plan.problem().work_count() * 3 {
        verify_schedule(plan)?;
    }
    let (source, timeline) = timed_source(plan, options.forward_only)?;
    let producers = Producers::index(&source, &timeline);
    let programs = timeline
        .iter()
        .enumerate()
        .map(|(r, tasks)| {
            let mut events = RankEvents::new(source.problem(), RankId::new(r as u32), &producers);
            events.add_tasks(tasks, options.recv);
            RankProgram {
                rank: RankId::new(r as u32),
                instrs: lay_out(events.finish(), options.forward_only),
            }
        })
        .collect();
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

/// The plan the programs run (its forward part alone for evaluation) and its simulated timeline.
fn timed_source(
    plan: &Plan,
    forward_only: bool,
) -> Result<(Plan, Vec<Vec<TimedTask>>), Violations> {
    let source = if forward_only {
        let orders = plan
            .orders()
            .iter()
            .map(|o| o.iter().filter_map(forward_part).collect())
            .collect();
        plan.clone()
            .with_orders(orders)
            .expect("a plan's forward part keeps its problem, models and facts")
    } else {
        plan.clone()
    };
    let costs = source.costs();
    match replay(&source, |t| costs.task_duration(t), costs.comm(), true) {
        Ok(outcome) => Ok((source, outcome.timeline)),
        Err(stuck) => Err(Violations(vec![stuck.into()])),
    }
}

/// When and in which order every op's task completed.
struct Producers {
    slots: OpSlots,
    /// The completion sequence of every op's task.
    sequence: Vec<usize>,
    /// The simulated end of every op's task.
    end: Vec<f64>,
}

impl Producers {
    fn index(plan: &Plan, timeline: &[Vec<TimedTask>]) -> Producers {
        let slots = plan.slots();
        let mut sequence = vec![usize::MAX; slots.len()];
        let mut end = vec![0.0f64; slots.len()];
        for t in timeline.iter().flatten() {
            for op in t.task.ops() {
                let slot = slots.op(op).expect("replayed ops are in range");
                sequence[slot] = t.sequence;
                end[slot] = t.end;
            }
        }
        Producers {
            slots,
            sequence,
            end,
        }
    }

    fn of(&self, op: Op) -> (usize, f64) {
        let slot = self.slots.op(op).expect("replayed ops are in range");
        (self.sequence[slot], self.end[slot])
    }
}

/// A receive placed just in time: (peer, producing sequence, consumer's moment, message).
type LateReceive = (RankId, usize, Moment, Message);

/// The events of one rank's program, keyed on the global time line.
struct RankEvents<'a> {
    problem: &'a Problem,
    rank: RankId,
    producers: &'a Producers,
    events: Vec<(EventKey, Event)>,
    late: Vec<LateReceive>,
}

impl<'a> RankEvents<'a> {
    fn new(problem: &'a Problem, rank: RankId, producers: &'a Producers) -> RankEvents<'a> {
        RankEvents {
            problem,
            rank,
            producers,
            events: Vec::new(),
            late: Vec::new(),
        }
    }

    fn push(&mut self, (time, topo): Moment, class: EventClass, tiebreak: u64, event: Event) {
        let key = EventKey {
            time,
            topo,
            class,
            tiebreak,
        };
        self.events.push((key, event));
    }

    fn add_tasks(&mut self, tasks: &[TimedTask], recv: RecvPolicy) {
        let last_weight = last_weight_tasks(tasks);
        for t in tasks {
            let q = t.sequence as u64;
            let start = (time_bits(t.start), 2 * q);
            let end = (time_bits(t.end), 2 * q + 1);
            self.add_receives(&t.task, start, recv);
            for op in t.task.ops().iter().filter(|o| o.kind == OpKind::WeightGrad) {
                if last_weight.get(&op.stage) == Some(&t.sequence) {
                    let tiebreak = u64::from(op.stage.get());
                    self.push(
                        start,
                        EventClass::GradSync,
                        tiebreak,
                        Event::GradSync(op.stage),
                    );
                }
            }
            self.push(start, EventClass::Compute, 0, Event::Compute(t.task));
            self.add_losses(&t.task, start);
            self.add_sends(&t.task, end);
        }
    }

    /// The task's inputs from other ranks: early at their production, or remembered for
    /// just-in-time placement.
    fn add_receives(&mut self, task: &Task, start: Moment, recv: RecvPolicy) {
        for input in remote_inputs(self.problem, self.rank, task) {
            let (produced, produced_at) = self.producers.of(input.producer);
            let message = input.message;
            match recv {
                RecvPolicy::Early => self.push(
                    (time_bits(produced_at), 2 * produced as u64 + 1),
                    EventClass::Communication,
                    direction_bit(&message),
                    Event::Comm(CommOp::Recv {
                        from: input.from,
                        message,
                    }),
                ),
                RecvPolicy::JustInTime => self.late.push((input.from, produced, start, message)),
            }
        }
    }

    /// A loss after every forward on the last stage of its route.
    fn add_losses(&mut self, task: &Task, start: Moment) {
        for op in task.ops().iter().filter(|o| o.kind == OpKind::Forward) {
            let last = self
                .problem
                .route_of(op.microbatch)
                .is_some_and(|route| route.next(op.stage).is_none());
            if last {
                let work = Work {
                    stage: op.stage,
                    microbatch: op.microbatch,
                };
                self.push(start, EventClass::Loss, 0, Event::Loss(work));
            }
        }
    }

    /// The task's outputs for other ranks at its end; a sent activation may then be freed.
    fn add_sends(&mut self, task: &Task, end: Moment) {
        for output in remote_outputs(self.problem, self.rank, task) {
            let message = output.message;
            let tiebreak = direction_bit(&message);
            self.push(
                end,
                EventClass::Communication,
                tiebreak,
                Event::Comm(CommOp::Send {
                    to: output.to,
                    message,
                }),
            );
            if message.direction == Direction::Activation {
                let free = Event::FreeOutput(message.source());
                self.push(end, EventClass::FreeOutput, tiebreak, free);
            }
        }
    }

    /// Places the just-in-time receives and returns every event in program order.
    fn finish(mut self) -> Vec<Event> {
        place_just_in_time(&mut self.late, &mut self.events);
        self.events.sort_unstable_by_key(|e| e.0);
        self.events.into_iter().map(|(_, e)| e).collect()
    }
}

/// Per stage, the completion sequence of the rank's last task producing its weight gradients.
fn last_weight_tasks(tasks: &[TimedTask]) -> HashMap<StageId, usize> {
    let mut last = HashMap::new();
    for t in tasks {
        for op in t.task.ops().iter().filter(|o| o.kind == OpKind::WeightGrad) {
            last.insert(op.stage, t.sequence);
        }
    }
    last
}

/// Places just-in-time receives right before their consumers, except that the receives from one
/// peer keep the order of that peer's sends (the k-th send matches the k-th receive): a receive
/// moves earlier when a later message of the same peer is needed sooner.
fn place_just_in_time(late: &mut [LateReceive], events: &mut Vec<(EventKey, Event)>) {
    // The peer sends in the order (producing sequence, message key).
    late.sort_by_key(|&(peer, produced, _, m)| (peer, produced, message_key(&m)));
    let mut bound: Moment = (u64::MAX, u64::MAX);
    let mut current_peer = None;
    for &(peer, produced, consumer, message) in late.iter().rev() {
        if current_peer != Some(peer) {
            current_peer = Some(peer);
            bound = (u64::MAX, u64::MAX);
        }
        bound = bound.min(consumer);
        // The peer's send order: by producing task, then activation before gradient.
        let tiebreak = ((produced as u64) << 1) | direction_bit(&message);
        let key = EventKey {
            time: bound.0,
            topo: bound.1,
            class: EventClass::JustInTimeReceive,
            tiebreak,
        };
        events.push((
            key,
            Event::Comm(CommOp::Recv {
                from: peer,
                message,
            }),
        ));
    }
}

/// Turns sorted events into instructions: consecutive sends and receives form one group; frees
/// follow the group that sent the output.
fn lay_out(events: Vec<Event>, forward_only: bool) -> Vec<Instr> {
    let mut instrs = Vec::with_capacity(events.len() + 1);
    let mut group = CommGroup::default();
    let mut frees: Vec<Work> = Vec::new();
    let flush = |instrs: &mut Vec<Instr>, group: &mut CommGroup, frees: &mut Vec<Work>| {
        if !group.ops.is_empty() {
            instrs.push(Instr::Comm(std::mem::take(group)));
        }
        instrs.extend(frees.drain(..).map(Instr::FreeOutput));
    };
    for event in events {
        let instr = match event {
            Event::Comm(op) => {
                group.ops.push(op);
                continue;
            }
            Event::FreeOutput(w) => {
                frees.push(w);
                continue;
            }
            Event::Compute(t) => Instr::Compute(t),
            Event::Loss(w) => Instr::Loss(w),
            Event::GradSync(s) => Instr::GradSync(s),
        };
        flush(&mut instrs, &mut group, &mut frees);
        instrs.push(instr);
    }
    flush(&mut instrs, &mut group, &mut frees);
    if !forward_only {
        instrs.push(Instr::FlushWeightGrads);
    }
    instrs
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1F1B on two ranks and two microbatches.
    fn one_f_one_b() -> Plan {
        crate::testing::plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"])
    }

    fn text(program: &RankProgram) -> Vec<String> {
        program.instrs.iter().map(Instr::to_string).collect()
    }

    #[test]
    fn early_receives_sit_where_the_message_is_produced() {
        let set = project(&one_f_one_b(), ProjectionOptions::default()).unwrap();
        assert_eq!(set.semantics, Semantics::Blocking);
        assert_eq!(
            text(&set.programs[1]),
            [
                "[recv-act(stage 1, mb 0) from rank 0]",
                "1F0",
                "loss(stage 1, mb 0)",
                "[recv-act(stage 1, mb 1) from rank 0]",
                "1B0",
                "[send-grad(stage 1, mb 0) to rank 0]",
                "1F1",
                "loss(stage 1, mb 1)",
                "grad-sync(stage 1)",
                "1B1",
                "[send-grad(stage 1, mb 1) to rank 0]",
                "flush-weight-grads",
            ]
        );
        assert!(text(&set.programs[0]).contains(&"free-output(stage 0, mb 0)".to_string()));
    }

    #[test]
    fn just_in_time_receives_sit_before_their_consumer() {
        let options = ProjectionOptions {
            recv: RecvPolicy::JustInTime,
            forward_only: false,
        };
        let set = project(&one_f_one_b(), options).unwrap();
        assert_eq!(set.semantics, Semantics::Batched);
        let rank1 = text(&set.programs[1]);
        let position = |s: &str| rank1.iter().position(|i| i.contains(s)).unwrap();
        assert_eq!(
            position("recv-act(stage 1, mb 1) from rank 0") + 1,
            position("1F1")
        );
    }

    #[test]
    fn forward_only_programs_hold_forwards_and_losses() {
        let options = ProjectionOptions {
            recv: RecvPolicy::Early,
            forward_only: true,
        };
        let set = project(&one_f_one_b(), options).unwrap();
        assert!(set.forward_only);
        let all: Vec<String> = set.programs.iter().flat_map(text).collect();
        assert!(
            all.iter().all(|i| !i.contains('B') && !i.contains("flush")),
            "{all:?}"
        );
        assert_eq!(all.iter().filter(|i| i.starts_with("loss")).count(), 2);
    }

    #[test]
    fn an_incomplete_plan_is_rejected_with_the_verifiers_violations() {
        let plan = one_f_one_b();
        let mut orders = plan.orders().to_vec();
        orders[1].pop();
        let err = project(
            &plan.with_orders(orders).unwrap(),
            ProjectionOptions::default(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("1I1"), "{err}");
    }
}
