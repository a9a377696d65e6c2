//! What a rank's step hands on: the summed loss of each microbatch whose loss it computed (keyed
//! by data id), and each microbatch's weight gradients to the [`GradSync`] of the stage's
//! position, with the end of a stage's gradients after the one a grad-sync marker announced
//! ([`GradSync::stage_complete`]: where a data-parallel all-reduce starts).

use crate::gradients::GradSync;
use candle_core::Tensor;
use pipeweave_backends::StageError;
use pipeweave_core::StageId;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

/// A rank's losses and where its weight gradients go.
pub(crate) struct Outcomes {
    sync: Arc<dyn GradSync>,
    /// Stages whose next weight gradient is their last on this rank.
    last_weight: HashSet<StageId>,
    /// Summed loss of every microbatch whose loss this rank computed.
    losses: BTreeMap<u32, f64>,
}

impl Outcomes {
    /// Nothing handed on yet; gradients go to `sync`.
    pub(crate) fn new(sync: Arc<dyn GradSync>) -> Outcomes {
        Outcomes {
            sync,
            last_weight: HashSet::new(),
            losses: BTreeMap::new(),
        }
    }

    /// The loss of data microbatch `key`.
    pub(crate) fn add_loss(&mut self, key: u32, loss: f64) {
        self.losses.insert(key, loss);
    }

    /// Every loss, by data microbatch.
    pub(crate) fn losses(&self) -> &BTreeMap<u32, f64> {
        &self.losses
    }

    /// `stage`'s next weight gradient is its last on this rank.
    pub(crate) fn announce_last(&mut self, stage: StageId) {
        self.last_weight.insert(stage);
    }

    /// Hands on the weight gradients of data microbatch `key` of `stage`, at `position`; after
    /// the announced last, the position's gradients are complete.
    pub(crate) fn add_grads(
        &mut self,
        stage: StageId,
        position: usize,
        key: u32,
        grads: Vec<Tensor>,
    ) -> Result<(), StageError> {
        self.sync.add(position, key, grads)?;
        if self.last_weight.remove(&stage) {
            self.sync.stage_complete(position)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Every call, in order: `add` as `(position, key)`, `stage_complete` as `(position, MAX)`.
    #[derive(Default)]
    struct Calls(Mutex<Vec<(usize, u32)>>);

    impl GradSync for Calls {
        fn add(&self, position: usize, key: u32, _: Vec<Tensor>) -> Result<(), StageError> {
            self.0.lock().unwrap().push((position, key));
            Ok(())
        }

        fn stage_complete(&self, position: usize) -> Result<(), StageError> {
            self.0.lock().unwrap().push((position, u32::MAX));
            Ok(())
        }
    }

    #[test]
    fn a_stage_completes_after_the_gradient_its_marker_announced() {
        let calls = Arc::new(Calls::default());
        let mut outcomes = Outcomes::new(Arc::clone(&calls) as Arc<dyn GradSync>);
        let (stage, other) = (StageId::new(1), StageId::new(2));
        outcomes.add_grads(stage, 1, 0, Vec::new()).unwrap();
        outcomes.announce_last(stage);
        outcomes.add_grads(other, 2, 0, Vec::new()).unwrap();
        outcomes.add_grads(stage, 1, 1, Vec::new()).unwrap();
        outcomes.add_grads(stage, 1, 2, Vec::new()).unwrap();
        let seen = calls.0.lock().unwrap().clone();
        assert_eq!(seen, [(1, 0), (2, 0), (1, 1), (1, u32::MAX), (1, 2)]);
    }

    #[test]
    fn losses_are_kept_by_data_microbatch() {
        let mut outcomes = Outcomes::new(Arc::new(Calls::default()));
        outcomes.add_loss(3, 1.5);
        outcomes.add_loss(0, 2.5);
        let keys: Vec<u32> = outcomes.losses().keys().copied().collect();
        assert_eq!(keys, [0, 3]);
    }
}
