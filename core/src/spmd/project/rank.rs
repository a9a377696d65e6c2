//! One rank's program: its own tasks' events in key order (PyTorch's parameter actions of
//! [`params::place`] laid out around their computes, gradient-sync markers, losses, sends, frees
//! and drops), its receives merged in, then grouped into instructions.

use super::events::{direction_bit, time_bits, Event, EventClass, EventKey, Keyed, Moment};
use super::layout::Layout;
use super::receives::Receives;
use super::ProjectionOptions;
use crate::analysis::replay::TimedTask;
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::plan::Dropped;
use crate::spmd::messages::remote_output;
use crate::spmd::params::{self, Placed, Slot};
use crate::spmd::program::{CommOp, Direction, Instr, RankProgram};
use std::ops::ControlFlow;

/// The program of rank `r`: its receives collected into `buffer`, merged into its tasks' events.
pub(super) fn project_rank(
    links: &Links,
    dropped: &[Dropped],
    receives: &mut Receives<'_>,
    buffer: &mut Vec<Keyed>,
    r: usize,
    options: ProjectionOptions,
) -> RankProgram {
    let rank = RankId::new(r as u32);
    let tasks = receives.tasks(rank);
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

/// The projection of one rank: its receives, keyed on the global time line and sorted, merged
/// into the events of its own tasks as these are emitted in order.
pub(super) struct RankProjection<'a> {
    links: &'a Links,
    /// Per (stage, microbatch) pair, what is dropped of it for a
    /// recompute (empty when the plan recomputes nothing).
    dropped: &'a [Dropped],
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
