//! The dependency graph a [`Retimer`] keeps its times and slack on: the replay engine's rules
//! ([`crate::analysis::replay`]) and the slack's ([`crate::analysis::slack`]) as edges between
//! `(rank, position)` nodes, each side read from the ranks' orders where it is needed.
//!
//! A task starts at the latest of the ends of its *engine predecessors* (0 with none), where a
//! dependency's end counts from its outputs: `end + tail + latency + head` (the tail all-to-all
//! of the task that ran it, the cross-rank latency for another rank, this task's head
//! all-to-all; none without a mixture of experts):
//! - a compute (an op's task, or a recompute): the compute before it on its rank (the rank's
//!   clock); for one that allocates, the offloads between the last allocating compute before it
//!   and it (the fence: the earlier offloads ended before that compute started, so they never
//!   decide); the tasks that ran the ops its ops depend on (dependencies); for a backward op, the
//!   last reload of its pair before it;
//! - a transfer: the compute that issues it (an offload's producer, else the compute before its
//!   place) and the transfer before it on the link ([`crate::analysis::link`]).
//!
//! A task's latest start is `latest_end - (end - start)`, where its latest end is the makespan
//! or less: the least `latest_start(t) - w` over the tasks `t` it *bounds for* (slack's rules,
//! kept as they are: a transfer bounds the transfer before it on the link where that sits earlier
//! in the order, and its issuer; a compute bounds the compute before it, the nearest offload
//! before it if it allocates, the tasks of its ops' dependencies, and for a backward op the later
//! of its pair's first and last reload that sits before it).
//!
//! Every successor list here is the exact inverse of its predecessor list (tested).

use super::{Retimer, NONE};
use crate::ir::op::{OpKind, Task, Work};
use std::ops::ControlFlow;

impl Retimer {
    /// The position of the compute before position `i` of rank `r`.
    pub(super) fn prev_compute(&self, r: usize, i: usize) -> Option<usize> {
        self.orders[r][..i].iter().rposition(|t| !t.on_link())
    }

    /// The position of the compute after position `i` of rank `r` (the order's length if none).
    fn next_compute(&self, r: usize, i: usize) -> usize {
        let order = &self.orders[r];
        (i + 1..order.len())
            .find(|&p| !order[p].on_link())
            .unwrap_or(order.len())
    }

    /// Whether the task waits for the offloads before it (the fence).
    fn waits_for_fence(task: &Task) -> bool {
        !task.on_link() && task.allocates()
    }

    /// Calls `f(rank, position, latency)` for each engine predecessor of rank `r`'s task at `i`:
    /// `latency` is None but for a dependency (an op of its ops depends on one of the
    /// predecessor's), then the latency between the two ranks.
    pub(super) fn for_each_pred(
        &self,
        r: usize,
        i: usize,
        mut f: impl FnMut(usize, usize, Option<f64>),
    ) {
        let order = &self.orders[r];
        let task = order[i];
        if task.on_link() {
            let links = &self.transfers[r];
            match links.producer[i] {
                NONE => {
                    if let Some(p) = self.prev_compute(r, i) {
                        f(r, p, None);
                    }
                }
                p => f(r, p, None),
            }
            if links.prev[i] != NONE {
                f(r, links.prev[i], None);
            }
            return;
        }
        let clock = self.prev_compute(r, i);
        if let Some(p) = clock {
            f(r, p, None);
        }
        if Self::waits_for_fence(&task) {
            for p in (0..i).rev() {
                if matches!(order[p], Task::Offload(_)) {
                    f(r, p, None);
                } else if Self::waits_for_fence(&order[p]) {
                    break;
                }
            }
        }
        if task.is_residency() {
            return;
        }
        let _ = task.try_for_each_op(|op| {
            let _ = self.links.try_for_each_dep(op, |dep, slot| {
                if !task.runs(dep) {
                    let (dr, di) = self.at_op[slot];
                    if dr != NONE {
                        let own = self.links.owner(dep.stage).map(|o| o.index()) == Some(r);
                        f(dr, di, Some(if own { 0.0 } else { self.comm }));
                    }
                }
                ControlFlow::<()>::Continue(())
            });
            ControlFlow::<()>::Continue(())
        });
        // A backward op waits for its pair's reload.
        match self.transfers[r].waits_for.get(i) {
            Some(&p) if p != NONE => f(r, p, None),
            _ => {}
        }
    }

    /// Calls `f(rank, position)` for each task that has rank `r`'s task at `i` among its engine
    /// predecessors (maybe more than once).
    pub(super) fn for_each_succ(&self, r: usize, i: usize, mut f: impl FnMut(usize, usize)) {
        let order = &self.orders[r];
        let task = order[i];
        let links = &self.transfers[r];
        if task.on_link() {
            if links.next[i] != NONE {
                f(r, links.next[i]);
            }
            match task {
                Task::Offload(_) => {
                    if let Some(p) =
                        (i + 1..order.len()).find(|&p| Self::waits_for_fence(&order[p]))
                    {
                        f(r, p);
                    }
                }
                Task::Reload(work) => {
                    self.for_each_backward_of(r, work, |p| {
                        if links.waits_for[p] == i {
                            f(r, p);
                        }
                    });
                }
                _ => {}
            }
            return;
        }
        let next = self.next_compute(r, i);
        if next < order.len() {
            f(r, next);
        }
        if links.any() {
            for p in i + 1..next {
                if links.producer[p] == NONE {
                    f(r, p);
                }
            }
            for &(_, offload) in links.issued_by(i) {
                f(r, offload);
            }
        }
        self.for_each_dependent(r, i, |dr, di, _| f(dr, di));
    }

    /// Calls `f(position)` for each task of rank `r` that runs an input-gradient or
    /// weight-gradient op of `work`'s pair (once per task).
    fn for_each_backward_of(&self, r: usize, work: Work, mut f: impl FnMut(usize)) {
        let mut seen = NONE;
        for kind in [OpKind::InputGrad, OpKind::WeightGrad] {
            let Some(slot) = self.links.slot(work.op(kind)) else {
                continue;
            };
            let (dr, di) = self.at_op[slot];
            if dr == r && di != seen {
                seen = di;
                f(di);
            }
        }
    }

    /// Calls `f(rank, position, w)` for each task running an op that depends on an op of rank
    /// `r`'s task at `i` (`w`: the latency between the two ranks).
    fn for_each_dependent(&self, r: usize, i: usize, mut f: impl FnMut(usize, usize, f64)) {
        let _ = self.orders[r][i].try_for_each_op(|op| {
            if let Some(slot) = self.links.slot(op) {
                for &dependent in self.dependents.of_slot(slot) {
                    let (dr, di) = self.at_op[dependent as usize];
                    if dr != NONE && (dr, di) != (r, i) {
                        f(dr, di, if dr == r { 0.0 } else { self.comm });
                    }
                }
            }
            ControlFlow::<()>::Continue(())
        });
    }

    /// Calls `f(rank, position, w)` for each task that rank `r`'s task at `i` bounds: its latest
    /// start, less `w`, is a latest end of that task (the slack's rules).
    pub(super) fn for_each_bounded(
        &self,
        r: usize,
        i: usize,
        mut f: impl FnMut(usize, usize, f64),
    ) {
        let order = &self.orders[r];
        let task = order[i];
        if task.on_link() {
            let links = &self.transfers[r];
            if links.prev[i] != NONE && links.prev[i] < i {
                f(r, links.prev[i], 0.0);
            }
            let issuer = match links.producer[i] {
                NONE => self.prev_compute(r, i),
                p => Some(p),
            };
            if let Some(p) = issuer {
                f(r, p, 0.0);
            }
            return;
        }
        if let Some(p) = self.prev_compute(r, i) {
            f(r, p, 0.0);
        }
        if task.allocates() {
            if let Some(p) = order[..i]
                .iter()
                .rposition(|t| matches!(t, Task::Offload(_)))
            {
                f(r, p, 0.0);
            }
        }
        let _ = task.try_for_each_op(|op| {
            let _ = self.links.try_for_each_dep(op, |_, slot| {
                let (dr, di) = self.at_op[slot];
                if dr != NONE && (dr, di) != (r, i) {
                    f(dr, di, if dr == r { 0.0 } else { self.comm });
                }
                ControlFlow::<()>::Continue(())
            });
            ControlFlow::<()>::Continue(())
        });
        match self.transfers[r].bounds.get(i) {
            Some(&p) if p != NONE => f(r, p, 0.0),
            _ => {}
        }
    }

    /// Calls `f(rank, position, w)` for each task that bounds rank `r`'s task at `i` (the
    /// inverse of [`Retimer::for_each_bounded`], maybe more than once).
    pub(super) fn for_each_bounder(
        &self,
        r: usize,
        i: usize,
        mut f: impl FnMut(usize, usize, f64),
    ) {
        let order = &self.orders[r];
        let task = order[i];
        let links = &self.transfers[r];
        if task.on_link() {
            if links.next[i] != NONE && links.next[i] > i {
                f(r, links.next[i], 0.0);
            }
            match task {
                Task::Offload(_) => {
                    // The allocating computes up to the next offload: this is the nearest
                    // offload before each.
                    let after = order[i + 1..].iter().enumerate();
                    for (k, t) in after.take_while(|(_, t)| !matches!(t, Task::Offload(_))) {
                        if !t.on_link() && t.allocates() {
                            f(r, i + 1 + k, 0.0);
                        }
                    }
                }
                Task::Reload(work) => {
                    self.for_each_backward_of(r, work, |p| {
                        if links.bounds[p] == i {
                            f(r, p, 0.0);
                        }
                    });
                }
                _ => {}
            }
            return;
        }
        let next = self.next_compute(r, i);
        if next < order.len() {
            f(r, next, 0.0);
        }
        if links.any() {
            for p in i + 1..next {
                if links.producer[p] == NONE {
                    f(r, p, 0.0);
                }
            }
            for &(_, offload) in links.issued_by(i) {
                f(r, offload, 0.0);
            }
        }
        self.for_each_dependent(r, i, f);
    }
}
