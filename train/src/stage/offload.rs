//! The offload state machine of a rank (a plan's `offload` pass) over its host link
//! ([`crate::host_link`]: a worker thread beside the computes, one transfer at a time).
//!
//! A pair's state moves through:
//!
//! 1. **started**: its copy to the host store begins, where the plan issues it (right after its
//!    forward, or its I for what the W keeps: **issued** until its place comes), else at its
//!    place in the program;
//! 2. **placed**: its place in the program passed; its device copy is freed once the copy ends
//!    ([`Offloads::freed`] gives the bytes to release; what allocates next, a forward, a
//!    recompute or a reload, waits for those copies first);
//! 3. **reloaded**: copied back; its bytes count on the device again and the backward that needs
//!    it takes it from the link (waiting for the reload to end).
//!
//! A pair is **moving** from its start until its reload: a step that ends with one moving left
//! a W unrun.

use super::ledger::Table;
use crate::host_link::{DeviceState, HostLink, Transferred};
use pipeweave_backends::StageError;
use pipeweave_core::Work;
use std::collections::{HashMap, HashSet};

/// A rank's offloads and reloads, and where each pair stands.
#[derive(Default)]
pub(crate) struct Offloads {
    /// The rank's host link: offloads and reloads copied beside the computes.
    link: HostLink,
    /// The pairs this rank's program offloads right after their forward, and right after their
    /// I (what the W keeps): their copies start there, as the plan issues them.
    after_forward: HashSet<Work>,
    after_input: HashSet<Work>,
    /// Offloads started at their producer whose place in the program has not come yet.
    issued: HashSet<Work>,
    /// Offloads whose place passed, their device copies not yet freed (until their copy ends).
    placed: HashSet<Work>,
    /// Per pair on its way to or in the host store, the table and bytes of its device copy.
    moving: HashMap<Work, (Table, usize)>,
}

impl Offloads {
    /// The program offloads `work`'s saved state right after its forward.
    pub(crate) fn issue_after_forward(&mut self, work: Work) {
        self.after_forward.insert(work);
    }

    /// The program offloads what `work`'s I keeps for its W right after that I.
    pub(crate) fn issue_after_input(&mut self, work: Work) {
        self.after_input.insert(work);
    }

    /// Whether `work`'s offload starts right after its forward.
    pub(crate) fn after_forward(&self, work: Work) -> bool {
        self.after_forward.contains(&work)
    }

    /// Whether `work`'s offload starts right after its I.
    pub(crate) fn after_input(&self, work: Work) -> bool {
        self.after_input.contains(&work)
    }

    /// Starts copying `state`, `bytes` counted in `table`, to the host store.
    pub(crate) fn start(
        &mut self,
        work: Work,
        state: DeviceState,
        table: Table,
        bytes: usize,
    ) -> Result<(), StageError> {
        self.moving.insert(work, (table, bytes));
        self.link.offload(work, state)
    }

    /// `work`'s offload was started at its producer; its place comes later.
    pub(crate) fn issue(&mut self, work: Work) {
        self.issued.insert(work);
    }

    /// Whether `work`'s offload was started at its producer (forgotten: its place has come).
    pub(crate) fn take_issued(&mut self, work: Work) -> bool {
        self.issued.remove(&work)
    }

    /// `work`'s place in the program passed: its device copy goes once its copy ends.
    pub(crate) fn place(&mut self, work: Work) {
        self.placed.insert(work);
    }

    /// The device copies to free now: those placed whose copy ended, with the table their bytes
    /// are counted in; `wait`: first waits for the placed copies (what allocates device memory
    /// does).
    pub(crate) fn freed(&mut self, wait: bool) -> Result<Vec<(Table, Work)>, StageError> {
        if wait {
            let placed = &self.placed;
            self.link.settle(|w| placed.contains(w))?;
        } else {
            self.link.poll()?;
        }
        let mut freed = Vec::new();
        let placed: Vec<Work> = self.placed.iter().copied().collect();
        for work in placed {
            if self.link.finished(work) {
                self.placed.remove(&work);
                if let Some(&(table, _)) = self.moving.get(&work) {
                    freed.push((table, work));
                }
            }
        }
        Ok(freed)
    }

    /// Starts copying `work`'s state back; the table and bytes it will hold on the device.
    pub(crate) fn reload(&mut self, work: Work) -> Result<Option<(Table, usize)>, StageError> {
        self.link.reload(work)?;
        Ok(self.moving.remove(&work))
    }

    /// `work`'s reloaded state, waiting for its reload (None: no reload of it was issued).
    pub(crate) fn take(&mut self, work: Work) -> Result<Option<DeviceState>, StageError> {
        self.link.take(work)
    }

    /// Whether `work`'s state is in (or on its way to) the host store.
    pub(crate) fn on_host(&self, work: Work) -> bool {
        self.link.holds(work)
    }

    /// Waits for every transfer; the transfers as they ran.
    pub(crate) fn finish(&mut self) -> Result<Vec<Transferred>, StageError> {
        self.link.finish()
    }

    /// A pair still moving (offloaded, never reloaded), if any.
    pub(crate) fn any_moving(&self) -> Option<Work> {
        self.moving.keys().next().copied()
    }

    /// The most bytes in the host store at once.
    pub(crate) fn host_peak_bytes(&self) -> usize {
        self.link.host_peak_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{block, hidden};
    use super::*;

    fn saved_state(seed: u64) -> (DeviceState, usize) {
        let (_, saved) = block().forward(&hidden(seed)).unwrap();
        let bytes = saved.held_bytes();
        (DeviceState::Saved(saved), bytes)
    }

    #[test]
    fn a_placed_offload_is_freed_then_reloaded_with_its_bytes() {
        let mut offloads = Offloads::default();
        let work = Work::new(0, 0);
        let (state, bytes) = saved_state(1);
        offloads.start(work, state, Table::Saved, bytes).unwrap();
        assert!(offloads.on_host(work));
        offloads.place(work);
        assert_eq!(offloads.freed(true).unwrap(), [(Table::Saved, work)]);
        assert_eq!(offloads.freed(true).unwrap(), []);
        assert_eq!(offloads.any_moving(), Some(work));
        assert!(offloads.host_peak_bytes() > 0);
        assert_eq!(offloads.reload(work).unwrap(), Some((Table::Saved, bytes)));
        assert!(matches!(
            offloads.take(work).unwrap(),
            Some(DeviceState::Saved(_))
        ));
        assert_eq!(offloads.any_moving(), None);
        let transfers = offloads.finish().unwrap();
        assert_eq!(transfers.len(), 2);
    }

    #[test]
    fn an_offload_issued_at_its_producer_is_not_freed_before_its_place() {
        let mut offloads = Offloads::default();
        let work = Work::new(1, 3);
        offloads.issue_after_forward(work);
        assert!(offloads.after_forward(work) && !offloads.after_input(work));
        let (state, bytes) = saved_state(2);
        offloads.start(work, state, Table::Saved, bytes).unwrap();
        offloads.issue(work);
        offloads.finish().unwrap();
        assert_eq!(offloads.freed(true).unwrap(), []);
        assert!(offloads.take_issued(work));
        assert!(!offloads.take_issued(work));
        offloads.place(work);
        assert_eq!(offloads.freed(false).unwrap(), [(Table::Saved, work)]);
    }

    #[test]
    fn a_reload_of_what_was_never_offloaded_is_refused() {
        let mut offloads = Offloads::default();
        assert!(offloads.reload(Work::new(0, 1)).is_err());
        assert!(offloads.take(Work::new(0, 1)).unwrap().is_none());
    }
}
