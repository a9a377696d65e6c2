//! The states a rank keeps on the device between a pair's ops: each forward's saved state (until
//! its I), what each I keeps for its W (until the W), and the last forward's input, which a drop
//! right after that forward cuts the saved state down to (an overlapped F&B runs its backward
//! between its forward and the drop).

use super::ledger::Table;
use crate::host_link::DeviceState;
use candle_core::Tensor;
use pipeweave_core::Work;
use pipeweave_kernels::{StagePendingWeightGrad, StageSaved};
use std::collections::HashMap;

/// The device states kept per pair.
#[derive(Default)]
pub(crate) struct KeptStates {
    saved: HashMap<Work, StageSaved>,
    pending: HashMap<Work, StagePendingWeightGrad>,
    /// The last forward's input (until the next forward).
    last_input: Option<(Work, Tensor)>,
}

impl KeptStates {
    /// Keeps `work`'s saved forward state.
    pub(crate) fn keep_saved(&mut self, work: Work, saved: StageSaved) {
        self.saved.insert(work, saved);
    }

    /// Takes `work`'s saved forward state, if kept.
    pub(crate) fn take_saved(&mut self, work: Work) -> Option<StageSaved> {
        self.saved.remove(&work)
    }

    /// Keeps what `work`'s I left for its W.
    pub(crate) fn keep_pending(&mut self, work: Work, pending: StagePendingWeightGrad) {
        self.pending.insert(work, pending);
    }

    /// Takes what `work`'s I left for its W, if kept.
    pub(crate) fn take_pending(&mut self, work: Work) -> Option<StagePendingWeightGrad> {
        self.pending.remove(&work)
    }

    /// Takes `work`'s state for a transfer: its saved state, else what its I keeps, with the
    /// table its bytes are counted in.
    pub(crate) fn take_either(&mut self, work: Work) -> Option<(DeviceState, Table)> {
        if let Some(saved) = self.saved.remove(&work) {
            Some((DeviceState::Saved(saved), Table::Saved))
        } else {
            let pending = self.pending.remove(&work)?;
            Some((DeviceState::Pending(pending), Table::Pending))
        }
    }

    /// Remembers `input` as the last forward's, `work`'s.
    pub(crate) fn set_last_input(&mut self, work: Work, input: Tensor) {
        self.last_input = Some((work, input));
    }

    /// Takes the last forward's input if that forward was `work`'s (it is gone either way).
    pub(crate) fn take_last_input(&mut self, work: Work) -> Option<Tensor> {
        match self.last_input.take() {
            Some((last, input)) if last == work => Some(input),
            _ => None,
        }
    }

    /// A pair whose W state is still kept, if any.
    pub(crate) fn any_pending(&self) -> Option<Work> {
        self.pending.keys().next().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{block, hidden};
    use super::*;

    #[test]
    fn the_last_input_is_given_only_to_a_drop_of_its_own_forward() {
        let mut kept = KeptStates::default();
        let (first, second) = (Work::new(0, 0), Work::new(0, 1));
        kept.set_last_input(first, hidden(1));
        assert!(kept.take_last_input(second).is_none());
        assert!(kept.take_last_input(first).is_none());
        kept.set_last_input(first, hidden(1));
        kept.set_last_input(second, hidden(2));
        assert!(kept.take_last_input(second).is_some());
    }

    #[test]
    fn a_transfer_takes_the_saved_state_first_then_the_w_state() {
        let model = block();
        let mut kept = KeptStates::default();
        let work = Work::new(0, 0);
        let (_, saved) = model.forward(&hidden(1)).unwrap();
        let (_, other) = model.forward(&hidden(2)).unwrap();
        let (_, pending) = model.backward_input(other, &hidden(3)).unwrap();
        kept.keep_saved(work, saved);
        kept.keep_pending(work, pending);
        assert_eq!(kept.any_pending(), Some(work));
        assert!(matches!(
            kept.take_either(work),
            Some((DeviceState::Saved(_), Table::Saved))
        ));
        assert!(matches!(
            kept.take_either(work),
            Some((DeviceState::Pending(_), Table::Pending))
        ));
        assert!(kept.take_either(work).is_none());
        assert_eq!(kept.any_pending(), None);
    }
}
