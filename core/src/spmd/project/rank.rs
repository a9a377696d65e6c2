//! One rank's program: its own tasks' events in key order (PyTorch's parameter actions of
//! [`params::place`] laid out around their computes, gradient-sync markers, losses, sends, frees
//! and drops, a mixture of experts' all-to-alls), its receives merged in, then grouped into
//! instructions. The events a forward's tail all-to-all delays (its combine's wait, its sends
//! and frees: see `all_to_all.rs`) wait in a queue of their own, merged in the same way.

use super::all_to_all::{head, Experts};
use super::events::{direction_bit, time_bits, Event, EventClass, EventKey, Keyed, Moment};
use super::layout::Layout;
use super::receives::Receives;
use super::ProjectionOptions;
use crate::analysis::replay::TimedTask;
use crate::ir::all_to_all::{AllToAll, AllToAllPhase, TaskAllToAlls};
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::plan::Dropped;
use crate::spmd::messages::remote_output;
use crate::spmd::params::{self, Placed, Slot};
use crate::spmd::program::{CommOp, Direction, Instr, RankProgram};
use std::collections::HashSet;
use std::ops::ControlFlow;

/// What every rank's projection reads: the dependency tables, the pairs dropped for a
/// recompute, the all-to-alls (if any).
pub(super) struct Shared<'a> {
    pub(super) links: &'a Links,
    /// Per (stage, microbatch) pair, what is dropped of it for a recompute (empty when the
    /// plan recomputes nothing).
    pub(super) dropped: &'a [Dropped],
    pub(super) experts: Option<&'a Experts<'a>>,
}

/// The program of rank `r`: its receives collected into `buffer`, merged into its tasks' events.
pub(super) fn project_rank(
    shared: &Shared<'_>,
    receives: &mut Receives<'_>,
    buffer: &mut Vec<Keyed>,
    r: usize,
    options: ProjectionOptions,
) -> RankProgram {
    let rank = RankId::new(r as u32);
    let tasks = receives.tasks(rank);
    let heads = shared.experts.map(|e| e.heads(tasks)).unwrap_or_default();
    receives.collect(rank, &heads, buffer);
    // PyTorch's parameter actions go around the model's computes alone.
    let order: Vec<Task> = tasks
        .iter()
        .map(|t| t.task)
        .filter(|t| !t.is_residency())
        .collect();
    let mut projection = RankProjection {
        links: shared.links,
        dropped: shared.dropped,
        experts: shared.experts,
        rank,
        receives: std::mem::take(buffer),
        next_receive: 0,
        delayed: Vec::new(),
        heads,
        heads_issued: HashSet::new(),
        layout: Layout::with_capacity(tasks.len() * 3),
    };
    projection.emit_tasks(tasks, &params::place(&order, options.forward_only));
    let (instrs, used) = projection.finish(options.forward_only);
    *buffer = used;
    RankProgram { rank, instrs }
}

/// The projection of one rank: its receives, keyed on the global time line and sorted, merged
/// into the events of its own tasks as these are emitted in order.
pub(super) struct RankProjection<'a> {
    links: &'a Links,
    /// Per (stage, microbatch) pair, what is dropped of it for a
    /// recompute (empty when the plan recomputes nothing).
    dropped: &'a [Dropped],
    experts: Option<&'a Experts<'a>>,
    rank: RankId,
    /// The rank's receives, sorted by key.
    receives: Vec<Keyed>,
    /// The first receive not laid out yet.
    next_receive: usize,
    /// Events placed later than the task that made them (after a tail all-to-all), sorted by
    /// key, the last first.
    delayed: Vec<Keyed>,
    /// The works whose backward on this rank waits for a head all-to-all.
    heads: HashSet<Work>,
    /// Those whose head has been issued, not yet waited for.
    heads_issued: HashSet<Work>,
    layout: Layout,
}

impl RankProjection<'_> {
    /// Lays out `event` at `key`, after the receives and the delayed events before it.
    fn emit(&mut self, key: EventKey, event: Event) {
        self.lay_out_before(key);
        self.lay_out(event);
    }

    /// Lays out the receives and the delayed events before `key`, in key order.
    fn lay_out_before(&mut self, key: EventKey) {
        loop {
            let received = self.receives.get(self.next_receive).filter(|r| r.0 < key);
            let delayed = self.delayed.last().filter(|d| d.0 < key);
            let event = match (received, delayed) {
                (Some(r), Some(d)) if d.0 < r.0 => self.delayed.pop().map(|d| d.1),
                (Some(r), _) => {
                    self.next_receive += 1;
                    Some(r.1)
                }
                (None, Some(_)) => self.delayed.pop().map(|d| d.1),
                (None, None) => None,
            };
            let Some(event) = event else { break };
            self.lay_out(event);
        }
    }

    /// Lays out `event` now.
    fn lay_out(&mut self, event: Event) {
        if let Event::Issue(a) = event {
            if a.phase == AllToAllPhase::CombineBackward && self.heads.contains(&a.work) {
                self.heads_issued.insert(a.work);
            }
        }
        self.layout.push(event);
    }

    /// Places `event` at `key`, later than the events emitted so far.
    fn delay(&mut self, key: EventKey, event: Event) {
        let at = self.delayed.partition_point(|d| d.0 > key);
        self.delayed.insert(at, (key, event));
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
            let all = self.experts.map(|e| e.of_task(&t.task));
            if let Some(head) = all.as_ref().and_then(|a| a.head) {
                self.emit_head(head, start);
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
            let ready = match &all {
                Some(all) => self.emit_span(all, t, start),
                None => None,
            };
            let _ = t.task.try_for_each_op(|op| {
                let last_stage = self.links.next(op.stage, op.microbatch).is_none();
                if op.kind == OpKind::Forward && last_stage {
                    let work = Work {
                        stage: op.stage,
                        microbatch: op.microbatch,
                    };
                    self.emit(EventKey::new(start, EventClass::Loss, 0), Event::Loss(work));
                    // The loss gives the gradient: the backward's head may start.
                    if self.heads.contains(&work) {
                        let key = EventKey::new(start, EventClass::Loss, 1);
                        self.emit(key, Event::Issue(head(work)));
                    }
                }
                ControlFlow::<()>::Continue(())
            });
            self.emit_sends(&t.task, end, ready);
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

    /// A backward's head all-to-all: issued here unless its gradient's arrival issued it, and
    /// waited for before the backward starts at `start`.
    fn emit_head(&mut self, head: AllToAll, start: Moment) {
        self.lay_out_before(EventKey::new(start, EventClass::HeadAllToAll, 0));
        if !self.heads_issued.remove(&head.work) {
            self.layout.push(Event::Issue(head));
        }
        let key = EventKey::new(start, EventClass::HeadAllToAll, 1);
        self.emit(key, Event::Wait(head));
    }

    /// The task's in-span all-to-alls right after its compute, each issued and waited for, then
    /// a forward's combine issued: waited for at once where a loss needs the output, else where
    /// the replay ends it, which is returned (its sends go there).
    fn emit_span(&mut self, all: &TaskAllToAlls, t: &TimedTask, start: Moment) -> Option<Moment> {
        let mut k = 0;
        let mut span = |this: &mut Self, event| {
            this.emit(EventKey::new(start, EventClass::SpanAllToAll, k), event);
            k += 1;
        };
        for &a in &all.span {
            span(self, Event::Issue(a));
            span(self, Event::Wait(a));
        }
        let combine = all.tail?;
        span(self, Event::Issue(combine));
        let work = combine.work;
        if self.links.next(work.stage, work.microbatch).is_none() {
            span(self, Event::Wait(combine));
            return None;
        }
        let ready = (
            time_bits(self.experts?.outputs_end(t)),
            2 * t.sequence as u64 + 1,
        );
        self.delay(
            EventKey::new(ready, EventClass::TailWait, 0),
            Event::Wait(combine),
        );
        Some(ready)
    }

    /// The task's outputs for other ranks at its end (or at `ready`, once its tail all-to-all
    /// ends), the heads of the backwards its gradients start on this rank, then the sent
    /// activations may be freed.
    fn emit_sends(&mut self, task: &Task, end: Moment, ready: Option<Moment>) {
        let at = ready.unwrap_or(end);
        let place = |this: &mut Self, key, event| match ready {
            Some(_) => this.delay(key, event),
            None => this.emit(key, event),
        };
        let _ = task.try_for_each_op(|op| {
            if let Some(output) = remote_output(self.links, self.rank, op) {
                let message = output.message;
                let send = Event::Comm(CommOp::Send {
                    to: output.to,
                    message,
                });
                let tiebreak = direction_bit(&message);
                let key = EventKey::new(at, EventClass::Communication, tiebreak);
                place(self, key, send);
            }
            ControlFlow::<()>::Continue(())
        });
        if !self.heads.is_empty() {
            self.emit_local_heads(task, end);
        }
        let _ = task.try_for_each_op(|op| {
            let output = remote_output(self.links, self.rank, op);
            if let Some(message) = output.map(|o| o.message) {
                if message.direction == Direction::Activation {
                    let free = Event::FreeOutput(message.source());
                    let tiebreak = direction_bit(&message);
                    let key = EventKey::new(at, EventClass::FreeOutput, tiebreak);
                    place(self, key, free);
                }
            }
            ControlFlow::<()>::Continue(())
        });
    }

    /// The heads of the backwards on this rank whose gradient `task` produces, issued at its
    /// `end` after its sends.
    fn emit_local_heads(&mut self, task: &Task, end: Moment) {
        let _ = task.try_for_each_op(|op| {
            if op.kind != OpKind::InputGrad {
                return ControlFlow::<()>::Continue(());
            }
            let prev = self.links.prev(op.stage, op.microbatch);
            let work = prev.map(|stage| Work {
                stage,
                microbatch: op.microbatch,
            });
            if let Some(work) = work.filter(|w| self.heads.contains(w)) {
                let key = EventKey::new(end, EventClass::Communication, 2);
                self.emit(key, Event::Issue(head(work)));
            }
            ControlFlow::<()>::Continue(())
        });
    }

    /// The drop of a forward whose pair is recomputed (or, after an input-gradient backward, of
    /// what its W keeps where an `RW` rebuilds it), after the op's sends and frees.
    fn emit_drop(&mut self, task: &Task, end: Moment) {
        if self.dropped.is_empty() {
            return;
        }
        let slots = self.links.slots();
        let _ = task.try_for_each_op(|op| {
            let pair = slots.pair(op.stage, op.microbatch);
            let drops = pair.map(|p| self.dropped[p]).unwrap_or_default();
            let dropped = match op.kind {
                OpKind::Forward => drops.after_forward,
                OpKind::InputGrad => drops.after_input_grad,
                OpKind::WeightGrad => false,
            };
            if dropped {
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
        let past = self.receives.last().into_iter().chain(self.delayed.first());
        if let Some(last) = past.map(|e| e.0).max() {
            self.lay_out_before(last);
        }
        for (_, left) in self.receives.drain(self.next_receive..) {
            self.layout.push(left);
        }
        for (_, left) in self.delayed.drain(..).rev() {
            self.layout.push(left);
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
