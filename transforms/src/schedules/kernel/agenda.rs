//! The agenda: the one event heap of the schedulers, earliest key first.
//!
//! A key is compared as a whole (`Ord`), so ties are broken by what the key holds after the time
//! (the rank, then whatever the caller adds); [`Time`] gives `f64` times the total order they need.
//! Entries for a rank can be superseded: [`Agenda::push_for`] bumps the rank's version, and
//! [`Agenda::pop_current`] skips every entry pushed for it before, so a scheduler never has to
//! search the heap to take back a decision.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// An `f64` time in the total order of [`f64::total_cmp`] (finite times in their usual order).
#[derive(Clone, Copy, Debug)]
pub struct Time(pub f64);

impl PartialEq for Time {
    fn eq(&self, other: &Time) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Time) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Time) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A min-heap of keys, optionally one live entry per rank.
#[derive(Clone, Debug)]
pub struct Agenda<K: Ord> {
    heap: BinaryHeap<Reverse<(K, usize, u64)>>,
    versions: Vec<u64>,
}

impl<K: Ord> Agenda<K> {
    /// An empty agenda for `ranks` ranks (entries of [`Agenda::push`] need none).
    pub fn new(ranks: usize) -> Agenda<K> {
        Agenda {
            heap: BinaryHeap::new(),
            versions: vec![0; ranks],
        }
    }

    /// Adds `key` for `rank` beside what the rank already has (no entry is superseded).
    pub fn push(&mut self, key: K, rank: usize) {
        let version = self.versions.get(rank).copied().unwrap_or(0);
        self.heap.push(Reverse((key, rank, version)));
    }

    /// Adds `key` for `rank`, superseding every entry pushed for it before.
    pub fn push_for(&mut self, key: K, rank: usize) {
        if let Some(v) = self.versions.get_mut(rank) {
            *v += 1;
        }
        self.push(key, rank);
    }

    /// Supersedes every entry of `rank` without adding one.
    pub fn cancel(&mut self, rank: usize) {
        if let Some(v) = self.versions.get_mut(rank) {
            *v += 1;
        }
    }

    /// The earliest live entry's key, left on the agenda; superseded entries are dropped.
    pub fn peek(&mut self) -> Option<&K> {
        while let Some(Reverse((_, rank, version))) = self.heap.peek() {
            if self.versions.get(*rank).copied().unwrap_or(0) == *version {
                break;
            }
            self.heap.pop();
        }
        self.heap.peek().map(|Reverse((key, _, _))| key)
    }

    /// Whether no live entry is left.
    pub fn is_empty(&mut self) -> bool {
        self.peek().is_none()
    }

    /// The earliest live entry (key, rank), taken off the agenda; superseded entries are dropped.
    pub fn pop_current(&mut self) -> Option<(K, usize)> {
        while let Some(Reverse((key, rank, version))) = self.heap.pop() {
            if self.versions.get(rank).copied().unwrap_or(0) == version {
                return Some((key, rank));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_then_the_lower_rank_and_superseded_entries_skipped() {
        let mut agenda: Agenda<(Time, usize)> = Agenda::new(3);
        agenda.push_for((Time(2.0), 0), 0);
        agenda.push_for((Time(1.0), 2), 2);
        agenda.push_for((Time(1.0), 1), 1);
        agenda.push_for((Time(0.5), 0), 0);
        let order: Vec<usize> =
            std::iter::from_fn(|| agenda.pop_current().map(|(_, r)| r)).collect();
        assert_eq!(order, [0, 1, 2]);
        agenda.push_for((Time(3.0), 1), 1);
        agenda.cancel(1);
        assert!(agenda.pop_current().is_none());
    }

    #[test]
    fn times_order_totally() {
        assert!(Time(-1.0) < Time(0.0));
        assert!(Time(f64::INFINITY) > Time(1e300));
        assert_eq!(Time(1.5), Time(1.5));
    }
}
