//! One rank's host link and reloads as the retimer's graph (`graph.rs`) reads them, per position
//! of the rank's order so that every edge is one lookup: an offload's producer, each transfer's
//! neighbours on the link ([`crate::analysis::link`]), the offloads each compute issues, and the
//! reload a backward waits for (the engine's rule) and the one it bounds (the slack's).

use super::NONE;
use crate::analysis::link::{link_order, offload_producers};
use crate::ir::deps::Links;
use crate::ir::op::{Task, Work};
use std::collections::HashMap;

/// A rank's link and reloads, per position; empty vectors for a rank without transfers.
#[derive(Clone, Debug, Default)]
pub(super) struct RankLinks {
    /// An offload's producer (NONE: issued at its place, or not an offload).
    pub(super) producer: Vec<usize>,
    /// The transfer before it on the link.
    pub(super) prev: Vec<usize>,
    /// The transfer after it on the link.
    pub(super) next: Vec<usize>,
    /// `(producer, offload)`, sorted ([`offload_producers`]).
    issues: Vec<(usize, usize)>,
    /// Where each position's entries of `issues` begin (one more entry than positions).
    issue_from: Vec<usize>,
    /// The last reload of a backward's pair before it: what the engine has it wait for.
    pub(super) waits_for: Vec<usize>,
    /// The later of its pair's first and last reload that sits before a backward: what it
    /// bounds in the slack.
    pub(super) bounds: Vec<usize>,
}

/// The pair whose input-gradient or weight-gradient op `task` runs, if any.
pub(super) fn backward_work(task: &Task) -> Option<Work> {
    match *task {
        Task::InputGrad(w) | Task::WeightGrad(w) | Task::Backward(w) => Some(w),
        Task::Overlapped { backward, .. } => Some(backward),
        _ => None,
    }
}

impl RankLinks {
    /// The link and reloads of `order`.
    pub(super) fn of(order: &[Task], links: &Links) -> RankLinks {
        if !order.iter().any(Task::on_link) {
            return RankLinks::default();
        }
        let slots = links.slots();
        let issues = offload_producers(order, slots);
        let mut producer = vec![NONE; order.len()];
        let mut issue_from = vec![0; order.len() + 1];
        for &(p, o) in &issues {
            producer[o] = p;
            issue_from[p + 1] += 1;
        }
        for k in 0..order.len() {
            issue_from[k + 1] += issue_from[k];
        }
        let (mut prev, mut next) = (vec![NONE; order.len()], vec![NONE; order.len()]);
        for pair in link_order(order, slots).windows(2) {
            prev[pair[1]] = pair[0];
            next[pair[0]] = pair[1];
        }
        // Per pair, its first and last reload.
        let mut ends: HashMap<Work, (usize, usize)> = HashMap::new();
        for (p, task) in order.iter().enumerate() {
            if let Task::Reload(w) = *task {
                ends.entry(w).and_modify(|e| e.1 = p).or_insert((p, NONE));
            }
        }
        let (mut waits_for, mut bounds) = (vec![NONE; order.len()], vec![NONE; order.len()]);
        let mut last: HashMap<Work, usize> = HashMap::new();
        for (p, task) in order.iter().enumerate() {
            if let Task::Reload(w) = *task {
                last.insert(w, p);
            }
            let Some(w) = backward_work(task) else {
                continue;
            };
            waits_for[p] = last.get(&w).copied().unwrap_or(NONE);
            if let Some(&(first, latest)) = ends.get(&w) {
                bounds[p] = [first, latest]
                    .into_iter()
                    .rev()
                    .find(|&q| q < p)
                    .unwrap_or(NONE);
            }
        }
        RankLinks {
            producer,
            prev,
            next,
            issues,
            issue_from,
            waits_for,
            bounds,
        }
    }

    /// The offloads the compute at `position` issues, as `(producer, offload)`.
    pub(super) fn issued_by(&self, position: usize) -> &[(usize, usize)] {
        match (
            self.issue_from.get(position),
            self.issue_from.get(position + 1),
        ) {
            (Some(&a), Some(&b)) => &self.issues[a..b],
            _ => &[],
        }
    }

    /// Whether the rank has transfers.
    pub(super) fn any(&self) -> bool {
        !self.producer.is_empty()
    }
}
