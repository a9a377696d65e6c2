//! The ranks' host links as the replay engine runs them: when each link is free, the fence of
//! the offloads a rank passed, when each pair's reload ends, and the offloads issued by the
//! computes that produce what they move (see the module doc of [`super`]).

use super::{Replay, ReplayError, TimedTask};
use crate::analysis::link::offload_producers;
use crate::ir::deps::Links;
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use std::ops::ControlFlow;

/// The ranks' host links as the engine runs them (see the module doc).
pub(super) struct HostLinks {
    /// Whether the plan offloads (else nothing waits for a reload).
    pub(super) offloads: bool,
    /// Per rank, when its link is free.
    free: Vec<f64>,
    /// Per rank, when the last offload whose place the rank passed ends.
    pub(super) fence: Vec<f64>,
    /// Per pair, when its reload ends (NaN: not reloaded, or not yet); empty without offload.
    reloaded: Vec<f64>,
    /// Per rank, its offloads with their producers ([`offload_producers`]); empty without
    /// offload.
    pub(super) producers: Vec<Vec<(usize, usize)>>,
    /// Per rank, how many of `producers` have been issued.
    next_issue: Vec<usize>,
    /// Per rank, per position, the link times of the offload there once issued by its producer
    /// (NaN before); empty without offload.
    issued: Vec<Vec<(f64, f64)>>,
}

impl HostLinks {
    pub(super) fn new(plan: &Plan, ranks: usize, pairs: usize) -> HostLinks {
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
    pub(super) fn issue(
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
    pub(super) fn issued_here(&mut self, r: usize, position: usize) -> Option<(f64, f64)> {
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
    pub(super) fn run(
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
    pub(super) fn seed(
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
    pub(super) fn reloaded(&self, pair: Option<usize>) -> f64 {
        let ends = pair.and_then(|p| self.reloaded.get(p)).copied();
        ends.filter(|e| !e.is_nan()).unwrap_or(0.0)
    }
}
