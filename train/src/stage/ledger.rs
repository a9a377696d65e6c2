//! The byte accounting of a rank's activations: per op, the bytes held for each [`Table`] (a
//! forward's saved state, what an I keeps for its W, an output not yet sent, what a dropped W
//! state keeps for its recompute), their live sum and its peak.
//!
//! A hold adds its bytes to the live sum (and may raise the peak); a release takes the bytes held
//! for that op in that table back out, and releasing what is not held changes nothing. The peak
//! is what a step reports as its most activation bytes held at once on the device.

use candle_core::Tensor;
use pipeweave_core::Work;
use std::collections::HashMap;

/// What live activation bytes are held for: a forward's saved state (until its input-gradient
/// backward), its pending weight-gradient state (until its W), an output not yet sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Table {
    Saved,
    Pending,
    Output,
    /// What a pair whose W state was dropped keeps for its `RW` (stage input, output gradient).
    WeightCheckpoint,
}

/// The live activation bytes per table and op, their sum and its peak.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    tables: [HashMap<Work, usize>; 4],
    live: usize,
    peak: usize,
}

impl Ledger {
    fn table(&mut self, table: Table) -> &mut HashMap<Work, usize> {
        &mut self.tables[table as usize]
    }

    /// Counts `amount` bytes held for `work` in `table`.
    pub(crate) fn hold(&mut self, table: Table, work: Work, amount: usize) {
        self.table(table).insert(work, amount);
        self.live += amount;
        self.peak = self.peak.max(self.live);
    }

    /// Stops counting what `table` holds for `work` (nothing where it holds nothing).
    pub(crate) fn release(&mut self, table: Table, work: Work) {
        if let Some(amount) = self.table(table).remove(&work) {
            self.live -= amount;
        }
    }

    /// The bytes `table` holds for `work`, if any.
    pub(crate) fn held(&self, table: Table, work: Work) -> Option<usize> {
        self.tables[table as usize].get(&work).copied()
    }

    /// The bytes held now.
    #[cfg(test)]
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// The most bytes held at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }
}

/// The bytes of `t`'s elements.
pub(crate) fn tensor_bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn work(microbatch: u32) -> Work {
        Work::new(0, microbatch)
    }

    #[test]
    fn holds_add_up_and_the_peak_stays_after_a_release() {
        let mut ledger = Ledger::default();
        ledger.hold(Table::Saved, work(0), 100);
        ledger.hold(Table::Output, work(0), 30);
        ledger.hold(Table::Saved, work(1), 50);
        assert_eq!((ledger.live(), ledger.peak()), (180, 180));
        ledger.release(Table::Saved, work(0));
        assert_eq!((ledger.live(), ledger.peak()), (80, 180));
        ledger.hold(Table::Pending, work(0), 60);
        assert_eq!((ledger.live(), ledger.peak()), (140, 180));
        ledger.hold(Table::WeightCheckpoint, work(2), 70);
        assert_eq!((ledger.live(), ledger.peak()), (210, 210));
    }

    #[test]
    fn a_release_takes_only_what_its_table_holds_for_its_op() {
        let mut ledger = Ledger::default();
        ledger.hold(Table::Saved, work(0), 100);
        ledger.hold(Table::Pending, work(0), 40);
        ledger.release(Table::Output, work(0));
        ledger.release(Table::Saved, work(1));
        assert_eq!(ledger.live(), 140);
        ledger.release(Table::Pending, work(0));
        ledger.release(Table::Pending, work(0));
        assert_eq!(ledger.live(), 100);
        assert_eq!(ledger.held(Table::Saved, work(0)), Some(100));
        assert_eq!(ledger.held(Table::Pending, work(0)), None);
    }

    #[test]
    fn a_tensor_counts_its_elements_times_their_size() {
        let t = Tensor::zeros((3, 5), DType::F64, &Device::Cpu).unwrap();
        assert_eq!(tensor_bytes(&t), 3 * 5 * 8);
    }
}
