//! Settling a [`Retimer`] after edits: keys for the tasks added or moved since the last settle,
//! then the times downstream of the edits (in increasing key order) and the latest times upstream
//! (in decreasing key order), each stopping wherever a value comes out unchanged.
//!
//! The keys are a topological order of the graph (`graph.rs`): every engine predecessor, and
//! every task a task bounds, has a smaller key. An added task takes the middle of the gap its
//! neighbours in the graph leave; where there is none, or the rank's keys no longer agree with
//! its edges, every task is numbered afresh by Kahn's algorithm, which times the whole plan on the
//! way (taking ready tasks by start time, so the keys follow time and leave room where later
//! edits land).

use super::{Retimer, NONE, UNSET};
use crate::analysis::replay::{Blocked, ReplayError};
use crate::ir::ids::RankId;
use crate::ir::op::OpKind;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A queued task: its key, rank and position.
fn entry(key: u64, r: usize, i: usize) -> (u64, u32, u32) {
    (key, r as u32, i as u32)
}

/// The room between consecutive keys after a renumbering.
const GAP: u64 = 1 << 20;
/// How far past its predecessors an added task's key lands at most.
const STEP: u64 = GAP >> 10;

impl Retimer {
    /// Brings every time (and latest time) up to date with the edits since the last settle.
    /// Errors where the edits leave tasks that can never run.
    pub fn settle(&mut self) -> Result<(), ReplayError> {
        let edited: Vec<(usize, usize)> = (0..self.edited.len())
            .filter(|&r| self.edited[r] != NONE)
            .map(|r| (r, self.edited[r]))
            .collect();
        if edited.is_empty() {
            return Ok(());
        }
        for &(r, _) in &edited {
            self.refresh_rank(r);
            self.edited[r] = NONE;
        }
        let before = self.makespan;
        if !edited.iter().all(|&(r, _)| self.assign_keys(r)) {
            if let Some(journal) = self.journal.as_mut() {
                journal.renumbered = true;
            }
            self.renumber_and_time()?;
            if self.keeps_slack {
                self.recompute_latest();
            }
            return Ok(());
        }
        let epoch = self.next_epoch();
        let mut queue = BinaryHeap::new();
        for &(r, from) in &edited {
            for i in from..self.orders[r].len() {
                self.marks[r][i] = epoch;
                queue.push(Reverse(entry(self.keys[r][i], r, i)));
            }
        }
        let (mut changed, mut next) = (Vec::new(), Vec::new());
        // The ranks whose times changed, for their last ends.
        let (mut touched, mut ranks) = (vec![false; self.orders.len()], Vec::new());
        while let Some(Reverse((_, r, i))) = queue.pop() {
            let (r, i) = (r as usize, i as usize);
            let start = self.start_of(r, i);
            let end = start + self.duration(&self.orders[r][i]);
            let old = self.rows[r][i];
            if start == old.start && end == old.end {
                continue;
            }
            self.set_times(r, i, start, end);
            if !touched[r] {
                touched[r] = true;
                ranks.push(r);
            }
            if self.keeps_slack {
                changed.push((r, i));
            }
            next.clear();
            self.for_each_succ(r, i, |sr, si| {
                if self.marks[sr][si] != epoch {
                    next.push((sr, si));
                }
            });
            for &(sr, si) in &next {
                // Queued once: a task comes out after every predecessor it has (smaller keys).
                if self.marks[sr][si] != epoch {
                    self.marks[sr][si] = epoch;
                    queue.push(Reverse(entry(self.keys[sr][si], sr, si)));
                }
            }
        }
        ranks.extend(edited.iter().map(|&(r, _)| r).filter(|&r| !touched[r]));
        for r in ranks {
            self.rank_end[r] = self.rows[r].iter().map(|t| t.end).fold(0.0, f64::max);
        }
        self.makespan = self.rank_end.iter().copied().fold(0.0, f64::max);
        if self.keeps_slack {
            if self.makespan != before {
                self.recompute_latest();
            } else {
                let mut seeds = changed;
                for &(r, _) in &edited {
                    seeds.extend((0..self.orders[r].len()).map(|i| (r, i)));
                }
                self.propagate_latest(seeds);
            }
        }
        Ok(())
    }

    /// The start of rank `r`'s task at `i` from its engine predecessors' ends, as the replay
    /// engine computes it.
    fn start_of(&self, r: usize, i: usize) -> f64 {
        let (mut start, mut inputs) = (0.0f64, f64::NEG_INFINITY);
        self.for_each_pred(r, i, |pr, pi, latency| {
            let end = self.rows[pr][pi].end;
            match latency {
                None => start = start.max(end),
                Some(latency) => inputs = inputs.max(end + self.tail(pr, pi) + latency),
            }
        });
        if inputs.is_finite() {
            start = start.max(inputs + self.head(r, i));
        }
        start
    }

    /// The all-to-all issued before rank `r`'s task at `i` once its inputs arrive (0 without).
    fn head(&self, r: usize, i: usize) -> f64 {
        if self.a2a {
            self.costs.a2a_phases(&self.orders[r][i]).head
        } else {
            0.0
        }
    }

    /// The all-to-all after rank `r`'s task at `i` that what needs its outputs waits for.
    fn tail(&self, r: usize, i: usize) -> f64 {
        if self.a2a {
            self.costs.a2a_phases(&self.orders[r][i]).tail
        } else {
            0.0
        }
    }

    /// The latest start of rank `r`'s task at `i` from the tasks that bound it.
    fn latest_of(&self, r: usize, i: usize) -> f64 {
        let mut latest_end = self.makespan;
        self.for_each_bounder(r, i, |br, bi, w| {
            latest_end = latest_end.min(self.latest[br][bi] - w);
        });
        let t = self.rows[r][i];
        latest_end - (t.end - t.start)
    }

    /// Sets a task's times, journaled in an open trial.
    fn set_times(&mut self, r: usize, i: usize, start: f64, end: f64) {
        let row = &mut self.rows[r][i];
        if let Some(journal) = self.journal.as_mut() {
            let latest = self.latest[r].get(i).copied().unwrap_or(f64::NAN);
            journal.cells.push((r, i, row.start, row.end, latest));
        }
        row.start = start;
        row.end = end;
    }

    /// Sets a task's latest start, journaled in an open trial.
    fn set_latest(&mut self, r: usize, i: usize, latest: f64) {
        if let Some(journal) = self.journal.as_mut() {
            let row = self.rows[r][i];
            journal
                .cells
                .push((r, i, row.start, row.end, self.latest[r][i]));
        }
        self.latest[r][i] = latest;
    }

    /// Keys for rank `r`'s unkeyed tasks, each in the middle of the gap its keyed neighbours
    /// leave; false where there is no gap or the rank's keys disagree with its edges.
    fn assign_keys(&mut self, r: usize) -> bool {
        for i in 0..self.orders[r].len() {
            if self.keys[r][i] != UNSET {
                continue;
            }
            let (mut lo, mut hi) = (0u64, UNSET);
            self.for_each_pred(r, i, |pr, pi, _| {
                let k = self.keys[pr][pi];
                if k != UNSET {
                    lo = lo.max(k);
                }
            });
            self.for_each_succ(r, i, |sr, si| hi = hi.min(self.keys[sr][si]));
            if hi <= lo.saturating_add(1) {
                return false;
            }
            // Right after its predecessors (as a replay would reach it), leaving the rest of the
            // gap to what lands after it.
            self.keys[r][i] = lo + ((hi - lo) / 2).min(STEP);
        }
        (0..self.orders[r].len()).all(|i| {
            let key = self.keys[r][i];
            let mut fits = true;
            self.for_each_pred(r, i, |pr, pi, _| fits &= self.keys[pr][pi] < key);
            fits
        })
    }

    /// Numbers every task afresh (Kahn's algorithm, ready tasks by start time) and times it on
    /// the way: the times a full replay gives.
    pub(super) fn renumber_and_time(&mut self) -> Result<(), ReplayError> {
        let offsets: Vec<usize> = self
            .orders
            .iter()
            .scan(0, |acc, o| {
                let at = *acc;
                *acc += o.len();
                Some(at)
            })
            .collect();
        let total = self.orders.iter().map(Vec::len).sum::<usize>();
        let mut waiting = vec![0u32; total];
        for r in 0..self.orders.len() {
            for i in 0..self.orders[r].len() {
                self.for_each_succ(r, i, |sr, si| waiting[offsets[sr] + si] += 1);
            }
        }
        let mut heap = BinaryHeap::new();
        for r in 0..self.orders.len() {
            for i in 0..self.orders[r].len() {
                if waiting[offsets[r] + i] == 0 {
                    heap.push(Reverse((self.start_of(r, i).to_bits(), r, i)));
                }
            }
        }
        let mut count = 0u64;
        while let Some(Reverse((bits, r, i))) = heap.pop() {
            count += 1;
            self.keys[r][i] = count * GAP;
            let start = f64::from_bits(bits);
            let end = start + self.duration(&self.orders[r][i]);
            let old = self.rows[r][i];
            if start != old.start || end != old.end {
                self.set_times(r, i, start, end);
            }
            let mut ready = Vec::new();
            self.for_each_succ(r, i, |sr, si| {
                let left = &mut waiting[offsets[sr] + si];
                *left -= 1;
                if *left == 0 {
                    ready.push((sr, si));
                }
            });
            for (sr, si) in ready {
                heap.push(Reverse((self.start_of(sr, si).to_bits(), sr, si)));
            }
        }
        if count as usize != total {
            return Err(self.stalled(&offsets, &waiting));
        }
        for r in 0..self.orders.len() {
            self.rank_end[r] = self.rows[r].iter().map(|t| t.end).fold(0.0, f64::max);
        }
        self.makespan = self.rank_end.iter().copied().fold(0.0, f64::max);
        Ok(())
    }

    /// Renumbers every task (the times stay as they are).
    pub(super) fn renumber(&mut self) {
        // The same walk; a rollback restored the times it would give.
        let _ = self.renumber_and_time();
    }

    /// The tasks that never became ready, as a deadlock.
    fn stalled(&self, offsets: &[usize], waiting: &[u32]) -> ReplayError {
        let blocked = (0..self.orders.len())
            .filter_map(|r| {
                let i = (0..self.orders[r].len()).find(|&i| waiting[offsets[r] + i] > 0)?;
                let task = self.orders[r][i];
                Some(Blocked {
                    rank: RankId::new(r as u32),
                    position: i,
                    task,
                    needs: task.work().op(OpKind::Forward),
                })
            })
            .collect();
        ReplayError::Deadlock(blocked)
    }

    /// Every latest start afresh, in decreasing key order.
    pub(super) fn recompute_latest(&mut self) {
        let mut all: Vec<(u64, usize, usize)> = Vec::new();
        for r in 0..self.orders.len() {
            all.extend((0..self.orders[r].len()).map(|i| (self.keys[r][i], r, i)));
        }
        all.sort_unstable_by_key(|&(key, _, _)| Reverse(key));
        for (_, r, i) in all {
            let latest = self.latest_of(r, i);
            if latest.to_bits() != self.latest[r][i].to_bits() {
                self.set_latest(r, i, latest);
            }
        }
    }

    /// The latest starts upstream of `seeds`, in decreasing key order, stopping where one comes
    /// out unchanged.
    fn propagate_latest(&mut self, seeds: Vec<(usize, usize)>) {
        let epoch = self.next_epoch();
        let mut queue = BinaryHeap::new();
        for (r, i) in seeds {
            if self.marks[r][i] != epoch {
                self.marks[r][i] = epoch;
                queue.push(entry(self.keys[r][i], r, i));
            }
        }
        let mut next = Vec::new();
        while let Some((_, r, i)) = queue.pop() {
            let (r, i) = (r as usize, i as usize);
            let latest = self.latest_of(r, i);
            if latest == self.latest[r][i] {
                continue;
            }
            self.set_latest(r, i, latest);
            next.clear();
            self.for_each_bounded(r, i, |br, bi, _| {
                if self.marks[br][bi] != epoch {
                    next.push((br, bi));
                }
            });
            for &(br, bi) in &next {
                if self.marks[br][bi] != epoch {
                    self.marks[br][bi] = epoch;
                    queue.push(entry(self.keys[br][bi], br, bi));
                }
            }
        }
    }

    /// A new propagation's number (marks of earlier ones never equal it).
    fn next_epoch(&mut self) -> u32 {
        if self.epoch == u32::MAX {
            self.marks.iter_mut().for_each(|row| row.fill(0));
            self.epoch = 0;
        }
        self.epoch += 1;
        self.epoch
    }
}
