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
//! rank; `FlushWeightGrads` at the end. The residency tasks: a recompute is a compute like any
//! other, `Drop` follows (with its sends) the forward of every pair the plan recomputes, and a
//! transfer (`Offload`, `Reload`) sits where the plan's order puts it, right after the compute
//! before it (which is when it is issued on the link). PyTorch's parameter actions ([`Instr::Params`]) where its
//! own lowering puts them ([`crate::spmd::params::place`]): unshards and reshards right before a
//! compute, a stage's gradient reduction and its wait right after the compute of its last weight
//! gradient and that compute's sends, the last reshards at the end. `forward_only` projects the
//! forwards and losses alone (and the residency actions, no reductions).
//!
//! The steps: [`timed_source`] replays the plan (forward part only, for evaluation), unless the
//! caller hands in its simulation ([`project_simulated`]). Then each rank on its own (ranks are
//! independent once the timeline is known; a large plan's ranks are split into blocks projected
//! on threads of their own): [`Receives`] walks the timelines of the ranks that send to it and
//! turns each output for it into a receive, keyed on the time line ([`EventKey`],
//! [`EventClass`]) and sorted; a [`RankProjection`] walks the rank's tasks emitting their events,
//! which come out in key order (a rank's tasks follow each other in time and in the topological
//! order), with the receives merged in; a [`Layout`] groups neighbouring sends and receives into
//! instructions. Every key is distinct, so the merge is the one order a full sort of all events
//! would give.

use crate::analysis::replay::{replay, TimedTask};
use crate::analysis::simulate::Simulation;
use crate::analysis::verify::{verify_schedule, Violations};
use crate::ir::deps::Links;
use crate::ir::facts::{Facts, Residency};
use crate::ir::ids::{RankId, StageId};
use crate::ir::op::{Op, OpKind, Task, Work};
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::messages::{remote_output, remote_outputs};
use crate::spmd::params::{self, Placed, Slot};
use crate::spmd::program::{
    CommGroup, CommOp, Direction, Instr, Message, ParamAction, ProgramSet, RankProgram, Semantics,
};
use std::borrow::Cow;
use std::ops::ControlFlow;

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
#[derive(Clone, Copy, Debug)]
enum Event {
    Compute(Task),
    Loss(Work),
    Comm(CommOp),
    FreeOutput(Work),
    GradSync(StageId),
    Params(ParamAction, StageId),
    /// Keep only the stage input of this forward (its pair is recomputed).
    Drop(Work),
    /// An offload or a reload, issued after the compute before it.
    Transfer(Task),
}

/// What an event is, in the order events at the same moment come: unshards and reshards before
/// a compute, a just-in-time receive before the compute it feeds, a gradient-sync marker right
/// before its compute, the compute, the loss after its forward, sends (and early receives) at a
/// task's end, frees after their sends (a recomputed forward's drop after them), then the gradient
/// reductions (and the last reshards) and the transfers issued after the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum EventClass {
    Residency,
    JustInTimeReceive,
    GradSync,
    Compute,
    Loss,
    Communication,
    FreeOutput,
    Reduction,
}

/// A point on the one global time line: (simulated time, position in the topological order,
/// class, tie-break). A compute sits at its start (`2 q` for its task's completion sequence `q`),
/// its sends at its end (`2 q + 1`), a receive where its message is produced (early) or just
/// before its consumer (just in time).
///
/// Packed into one integer that compares as the tuple does: the bits of the non-negative time
/// (which sort like the times) in the high 64 bits, then 32 bits of topological position, 3 of
/// class and 29 of tie-break. The size limits keep every field in its bits: a plan has fewer
/// than `3 · 2^24` tasks, so `2 q + 1` and a just-in-time tie-break `2 q + 1` stay below `2^28`,
/// and a stage below `2^16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct EventKey(u128);

impl EventKey {
    fn new((time, topo): Moment, class: EventClass, tiebreak: u64) -> EventKey {
        debug_assert!(topo < 1 << 32 && tiebreak < 1 << 29, "see the size limits");
        EventKey(
            (u128::from(time) << 64)
                | (u128::from(topo) << 32)
                | ((class as u128) << 29)
                | u128::from(tiebreak),
        )
    }
}

/// A moment of a task on the time line: (time bits, topological position).
type Moment = (u64, u64);

/// An event at its place on the time line.
type Keyed = (EventKey, Event);

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
    check_complete(plan)?;
    let (source, timeline) = timed_source(plan, options.forward_only)?;
    Ok(programs_of(&source, &timeline, options))
}

/// [`project`] for a plan already simulated: the programs follow `simulation`'s timeline instead
/// of a replay of their own (it must be [`crate::simulate`]'s result for `plan`; a timeline that
/// does not hold the plan's orders, or whose tasks on a rank overlap, is replayed again, and so
/// are forward-only programs, which run a part of the plan).
pub fn project_simulated(
    plan: &Plan,
    simulation: &Simulation,
    options: ProjectionOptions,
) -> Result<ProgramSet, Violations> {
    let timeline = simulation.timeline();
    let matches = timeline.len() == plan.orders().len()
        && timeline
            .iter()
            .zip(plan.orders())
            .all(|(timed, order)| timed.len() == order.len());
    if options.forward_only || !matches || !is_sequential(timeline) {
        return project(plan, options);
    }
    check_complete(plan)?;
    Ok(programs_of(plan, timeline, options))
}

/// An incomplete plan is rejected with the verifier's violations (a complete one may still not
/// run; the replay finds that).
fn check_complete(plan: &Plan) -> Result<(), Violations> {
    let ops: usize = plan.orders().iter().flatten().map(|t| t.op_array().1).sum();
    if ops != plan.problem().work_count() * 3 {
        verify_schedule(plan)?;
    }
    Ok(())
}

/// Plans with fewer tasks than this are projected on the calling thread alone.
const PARALLEL_TASKS: usize = 1 << 15;

/// The programs of `source` laid out along its `timeline`. Ranks are independent once the
/// timeline is known: a large plan's ranks are split into contiguous blocks projected on
/// threads of their own (each reusing its receive buffers from one rank to the next).
fn programs_of(
    source: &Plan,
    timeline: &[Vec<TimedTask>],
    options: ProjectionOptions,
) -> ProgramSet {
    let links = Links::of(source.problem());
    let senders = senders(source.problem());
    let dropped = source.recomputed_pairs();
    let starts = (options.recv == RecvPolicy::JustInTime).then(|| Starts::index(&links, timeline));
    let project = |ranks: std::ops::Range<usize>| {
        let mut receives = Receives {
            links: &links,
            timeline,
            senders: &senders,
            starts: starts.as_ref(),
            late: Vec::new(),
        };
        let mut buffer = Vec::new();
        ranks
            .map(|r| project_rank(&links, &dropped, &mut receives, &mut buffer, r, options))
            .collect::<Vec<_>>()
    };
    let tasks: usize = timeline.iter().map(Vec::len).sum();
    let threads = if tasks < PARALLEL_TASKS {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(timeline.len()))
    };
    let programs = if threads <= 1 {
        project(0..timeline.len())
    } else {
        let block = timeline.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..timeline.len())
                .step_by(block)
                .map(|first| {
                    let ranks = first..(first + block).min(timeline.len());
                    scope.spawn(move || project(ranks))
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    };
    let semantics = match options.recv {
        RecvPolicy::Early => Semantics::Blocking,
        RecvPolicy::JustInTime => Semantics::Batched,
    };
    ProgramSet {
        programs,
        forward_only: options.forward_only,
        semantics,
    }
}

/// The program of rank `r`: its receives collected into `buffer`, merged into its tasks' events.
fn project_rank(
    links: &Links,
    dropped: &[bool],
    receives: &mut Receives<'_>,
    buffer: &mut Vec<Keyed>,
    r: usize,
    options: ProjectionOptions,
) -> RankProgram {
    let rank = RankId::new(r as u32);
    let tasks = &receives.timeline[r];
    receives.collect(rank, buffer);
    // PyTorch's parameter actions go around the model's computes alone.
    let order: Vec<Task> = tasks
        .iter()
        .map(|t| t.task)
        .filter(|t| !t.is_residency())
        .collect();
    let mut projection = RankProjection {
        links,
        dropped,
        rank,
        receives: std::mem::take(buffer),
        next_receive: 0,
        layout: Layout::with_capacity(tasks.len() * 3),
    };
    projection.emit_tasks(tasks, &params::place(&order, options.forward_only));
    let (instrs, used) = projection.finish(options.forward_only);
    *buffer = used;
    RankProgram { rank, instrs }
}

/// Per rank, the ranks that send it something: the owners of the stages next to its own on a
/// route, in rank order.
fn senders(problem: &Problem) -> Vec<Vec<RankId>> {
    let mut senders = vec![Vec::new(); problem.ranks() as usize];
    for route in problem.routes() {
        for pair in route.stages().windows(2) {
            let (Some(a), Some(b)) = (problem.rank_of(pair[0]), problem.rank_of(pair[1])) else {
                continue;
            };
            if a != b {
                senders[b.index()].push(a);
                senders[a.index()].push(b);
            }
        }
    }
    for list in &mut senders {
        list.sort_unstable();
        list.dedup();
    }
    senders
}

/// What finds a rank's receives: they are found from the sending side, walking each sender's
/// timeline in order, where every output for the rank is a receive, early at the moment it is
/// produced or just in time (see [`place_just_in_time`]). So a rank's list is a run of keys in
/// order per sender, which a run-adaptive sort merges.
struct Receives<'a> {
    links: &'a Links,
    timeline: &'a [Vec<TimedTask>],
    senders: &'a [Vec<RankId>],
    /// The tasks' starts, for just-in-time receives.
    starts: Option<&'a Starts>,
    /// The just-in-time receives being placed.
    late: Vec<LateReceive>,
}

impl Receives<'_> {
    /// The receives of `rank`, keyed on the time line and sorted, into `events`.
    fn collect(&mut self, rank: RankId, events: &mut Vec<Keyed>) {
        events.clear();
        self.late.clear();
        for &from in &self.senders[rank.index()] {
            for t in &self.timeline[from.index()] {
                for output in remote_outputs(self.links, from, &t.task) {
                    if output.to != rank {
                        continue;
                    }
                    let message = output.message;
                    match self.starts {
                        None => {
                            let produced = (time_bits(t.end), 2 * t.sequence as u64 + 1);
                            let key = EventKey::new(
                                produced,
                                EventClass::Communication,
                                direction_bit(&message),
                            );
                            events.push((key, Event::Comm(CommOp::Recv { from, message })));
                        }
                        Some(starts) => {
                            let consumer = starts.of_consumer(&message);
                            self.late.push((from, t.sequence, consumer, message));
                        }
                    }
                }
            }
        }
        place_just_in_time(&mut self.late, events);
        events.sort_by_key(|e| e.0);
    }
}

/// Whether every rank's timed tasks follow each other (each starts after the previous ends, in
/// completion order): what a replay produces, and what laying out a rank's own events in the
/// order they are generated relies on.
fn is_sequential(timeline: &[Vec<TimedTask>]) -> bool {
    timeline.iter().all(|tasks| {
        let mut computes = tasks.iter().filter(|t| !t.task.on_link()).peekable();
        tasks.iter().all(|t| t.start >= 0.0 && t.end >= t.start)
            && std::iter::from_fn(|| {
                let t = computes.next()?;
                Some(
                    computes
                        .peek()
                        .is_none_or(|next| next.start >= t.end && next.sequence > t.sequence),
                )
            })
            .all(|ok| ok)
    })
}

/// The plan the programs run (its forward part alone for evaluation) and its simulated timeline.
fn timed_source(
    plan: &Plan,
    forward_only: bool,
) -> Result<(Cow<'_, Plan>, Vec<Vec<TimedTask>>), Violations> {
    let source = if forward_only {
        let orders = plan
            .orders()
            .iter()
            .map(|o| o.iter().filter_map(forward_part).collect())
            .collect();
        // The forward part runs no recompute or transfer: its activations are kept.
        let facts = Facts {
            residency: Residency::KEPT,
            ..plan.facts()
        };
        Cow::Owned(
            plan.clone()
                .reshaped(None, orders, facts)
                .expect("a plan's forward part keeps its problem, models and layout"),
        )
    } else {
        Cow::Borrowed(plan)
    };
    let costs = source.costs();
    match replay(&source, |t| costs.task_duration(t), costs.comm(), true) {
        Ok(outcome) => Ok((source, outcome.timeline)),
        Err(stuck) => Err(Violations(vec![stuck.into()])),
    }
}

/// Where every op's task starts on the time line: what a just-in-time receive is placed before.
struct Starts {
    slots: OpSlots,
    /// Per op, the moment its task starts.
    start: Vec<Moment>,
}

impl Starts {
    fn index(links: &Links, timeline: &[Vec<TimedTask>]) -> Starts {
        let slots = links.slots();
        let mut start = vec![(0, 0); slots.len()];
        for t in timeline.iter().flatten() {
            let (ops, count) = t.task.op_array();
            for &op in &ops[..count] {
                let slot = slots.op(op).expect("replayed ops are in range");
                start[slot] = (time_bits(t.start), 2 * t.sequence as u64);
            }
        }
        Starts { slots, start }
    }

    /// The start of the task that consumes `message`: the forward of the receiving stage for an
    /// activation, its input-gradient backward for a gradient.
    fn of_consumer(&self, message: &Message) -> Moment {
        let kind = match message.direction {
            Direction::Activation => OpKind::Forward,
            Direction::Gradient => OpKind::InputGrad,
        };
        let op = Op::new(kind, message.to_stage, message.microbatch);
        let slot = self.slots.op(op).expect("replayed ops are in range");
        self.start[slot]
    }
}

/// A receive placed just in time: (peer, producing sequence, consumer's moment, message).
type LateReceive = (RankId, usize, Moment, Message);

/// The projection of one rank: its receives, keyed on the global time line and sorted, merged
/// into the events of its own tasks as these are emitted in order.
struct RankProjection<'a> {
    links: &'a Links,
    /// Per (stage, microbatch) pair, whether its forward's activations are dropped for a
    /// recompute (empty when the plan recomputes nothing).
    dropped: &'a [bool],
    rank: RankId,
    /// The rank's receives, sorted by key.
    receives: Vec<Keyed>,
    /// The first receive not laid out yet.
    next_receive: usize,
    layout: Layout,
}

impl RankProjection<'_> {
    /// Lays out `event` at `key`, after the receives that come before it.
    fn emit(&mut self, key: EventKey, event: Event) {
        while let Some((at, received)) = self.receives.get(self.next_receive) {
            if *at >= key {
                break;
            }
            self.layout.push(*received);
            self.next_receive += 1;
        }
        self.layout.push(event);
    }

    /// The events of the rank's own tasks, in key order: per task, its parameter actions, the
    /// gradient-sync marker, the compute and the loss at its start, the sends, the frees and the
    /// reductions at its end; the parameter actions of the end after the last task.
    fn emit_tasks(&mut self, tasks: &[TimedTask], placed: &[Placed]) {
        let last_weight = last_weight_tasks(tasks);
        let mut placed = placed.iter().peekable();
        let (mut end, mut k) = ((0, 0), 0);
        // The index of the next model compute (what `placed` counts; recomputes and transfers
        // have no parameter actions).
        let mut next_compute = 0;
        for t in tasks {
            if t.task.on_link() {
                k += 1;
                self.emit(
                    EventKey::new(end, EventClass::Reduction, k),
                    Event::Transfer(t.task),
                );
                continue;
            }
            let i = if t.task.is_residency() {
                usize::MAX
            } else {
                next_compute += 1;
                next_compute - 1
            };
            let q = t.sequence as u64;
            let start = (time_bits(t.start), 2 * q);
            end = (time_bits(t.end), 2 * q + 1);
            k = 0;
            while let Some(&(_, _, action, stage)) =
                placed.next_if(|p| p.0 == i && p.1 == Slot::Before)
            {
                self.emit(
                    EventKey::new(start, EventClass::Residency, k),
                    Event::Params(action, stage),
                );
                k += 1;
            }
            let _ = t.task.try_for_each_op(|op| {
                let last = last_weight.get(op.stage.index()) == Some(&t.sequence);
                if op.kind == OpKind::WeightGrad && last {
                    let key = EventKey::new(start, EventClass::GradSync, u64::from(op.stage.get()));
                    self.emit(key, Event::GradSync(op.stage));
                }
                ControlFlow::<()>::Continue(())
            });
            self.emit(
                EventKey::new(start, EventClass::Compute, 0),
                Event::Compute(t.task),
            );
            let _ = t.task.try_for_each_op(|op| {
                let last_stage = self.links.next(op.stage, op.microbatch).is_none();
                if op.kind == OpKind::Forward && last_stage {
                    let work = Work {
                        stage: op.stage,
                        microbatch: op.microbatch,
                    };
                    self.emit(EventKey::new(start, EventClass::Loss, 0), Event::Loss(work));
                }
                ControlFlow::<()>::Continue(())
            });
            self.emit_sends(&t.task, end);
            self.emit_drop(&t.task, end);
            while let Some(&(_, _, action, stage)) = placed.next_if(|p| p.0 == i) {
                self.emit(
                    EventKey::new(end, EventClass::Reduction, k),
                    Event::Params(action, stage),
                );
                k += 1;
            }
        }
        // The end's reshards, after the last task's reductions.
        for &(_, _, action, stage) in placed {
            k += 1;
            self.emit(
                EventKey::new(end, EventClass::Reduction, k),
                Event::Params(action, stage),
            );
        }
    }

    /// The task's outputs for other ranks at its end; then the sent activations may be freed.
    fn emit_sends(&mut self, task: &Task, end: Moment) {
        let _ = task.try_for_each_op(|op| {
            if let Some(output) = remote_output(self.links, self.rank, op) {
                let message = output.message;
                let send = Event::Comm(CommOp::Send {
                    to: output.to,
                    message,
                });
                let tiebreak = direction_bit(&message);
                self.emit(
                    EventKey::new(end, EventClass::Communication, tiebreak),
                    send,
                );
            }
            ControlFlow::<()>::Continue(())
        });
        let _ = task.try_for_each_op(|op| {
            let output = remote_output(self.links, self.rank, op);
            if let Some(message) = output.map(|o| o.message) {
                if message.direction == Direction::Activation {
                    let free = Event::FreeOutput(message.source());
                    let tiebreak = direction_bit(&message);
                    self.emit(EventKey::new(end, EventClass::FreeOutput, tiebreak), free);
                }
            }
            ControlFlow::<()>::Continue(())
        });
    }

    /// The drop of a forward whose pair is recomputed, after the forward's sends and frees.
    fn emit_drop(&mut self, task: &Task, end: Moment) {
        if self.dropped.is_empty() {
            return;
        }
        let slots = self.links.slots();
        let _ = task.try_for_each_op(|op| {
            let pair = slots.pair(op.stage, op.microbatch);
            if op.kind == OpKind::Forward && pair.is_some_and(|p| self.dropped[p]) {
                let work = Work {
                    stage: op.stage,
                    microbatch: op.microbatch,
                };
                self.emit(
                    EventKey::new(end, EventClass::FreeOutput, 2),
                    Event::Drop(work),
                );
            }
            ControlFlow::<()>::Continue(())
        });
    }

    /// The rank's instructions (the receives after its last event laid out last), and the
    /// receive buffer for the next rank.
    fn finish(mut self, forward_only: bool) -> (Vec<Instr>, Vec<Keyed>) {
        for (_, received) in self.receives.drain(self.next_receive..) {
            self.layout.push(received);
        }
        (self.layout.finish(forward_only), self.receives)
    }
}

/// Per stage, the completion sequence of the rank's last task producing its weight gradients
/// (`usize::MAX` for a stage the rank produces none of).
fn last_weight_tasks(tasks: &[TimedTask]) -> Vec<usize> {
    let mut last: Vec<usize> = Vec::new();
    for t in tasks {
        let (ops, count) = t.task.op_array();
        for op in ops[..count].iter().filter(|o| o.kind == OpKind::WeightGrad) {
            if last.len() <= op.stage.index() {
                last.resize(op.stage.index() + 1, usize::MAX);
            }
            last[op.stage.index()] = t.sequence;
        }
    }
    last
}

/// Places just-in-time receives right before their consumers, except that the receives from one
/// peer keep the order of that peer's sends (the k-th send matches the k-th receive): a receive
/// moves earlier when a later message of the same peer is needed sooner.
fn place_just_in_time(late: &mut [LateReceive], events: &mut Vec<Keyed>) {
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
        events.push((
            EventKey::new(bound, EventClass::JustInTimeReceive, tiebreak),
            Event::Comm(CommOp::Recv {
                from: peer,
                message,
            }),
        ));
    }
}

/// Instructions from events in program order: consecutive sends and receives form one group;
/// frees follow the group that sent the output.
struct Layout {
    instrs: Vec<Instr>,
    /// The open group's sends and receives (copied out at its exact size when it closes).
    group: Vec<CommOp>,
    frees: Vec<Work>,
}

impl Layout {
    fn with_capacity(capacity: usize) -> Layout {
        Layout {
            instrs: Vec::with_capacity(capacity),
            group: Vec::new(),
            frees: Vec::new(),
        }
    }

    fn push(&mut self, event: Event) {
        let instr = match event {
            Event::Comm(op) => return self.group.push(op),
            Event::FreeOutput(w) => return self.frees.push(w),
            Event::Compute(t) => Instr::Compute(t),
            Event::Loss(w) => Instr::Loss(w),
            Event::GradSync(s) => Instr::GradSync(s),
            Event::Params(action, stage) => Instr::Params { action, stage },
            Event::Drop(w) => Instr::Drop(w),
            Event::Transfer(Task::Offload(w)) => Instr::Offload(w),
            Event::Transfer(t) => Instr::Reload(t.work()),
        };
        self.flush();
        self.instrs.push(instr);
    }

    /// Closes the open group, then its frees.
    fn flush(&mut self) {
        if !self.group.is_empty() {
            let ops = Box::from(self.group.as_slice());
            self.group.clear();
            self.instrs.push(Instr::Comm(CommGroup { ops }));
        }
        self.instrs
            .extend(self.frees.drain(..).map(Instr::FreeOutput));
    }

    fn finish(mut self, forward_only: bool) -> Vec<Instr> {
        self.flush();
        if !forward_only {
            self.instrs.push(Instr::FlushWeightGrads);
        }
        self.instrs
    }
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
                "unshard(stage 1)",
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
                "reduce-grad(stage 1)",
                "wait-reduce-grad(stage 1)",
                "reshard(stage 1)",
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
    fn forward_only_programs_of_a_residency_plan_run_no_residency() {
        let plan = crate::testing::plan(
            2,
            &["0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1R0 1B0 1F1 1B1"],
        );
        let options = ProjectionOptions {
            recv: RecvPolicy::Early,
            forward_only: true,
        };
        let set = project(&plan, options).unwrap();
        let all: Vec<String> = set.programs.iter().flat_map(text).collect();
        assert!(
            all.iter()
                .all(|i| !i.contains("offload") && !i.contains("reload") && !i.contains('R')),
            "{all:?}"
        );
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
