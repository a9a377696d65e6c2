//! One step's data as the stages see it: every microbatch's input tokens and targets as tensors,
//! and the loss normaliser of the whole global batch.
//!
//! Loss the way Megatron computes it: every microbatch's token losses are summed and divided by
//! the number of non-padding targets of the whole global batch (all microbatches, all
//! data-parallel replicas), known before the step, so the gradients do not depend on how tokens
//! fall into microbatches.

use crate::error::TrainError;
use candle_core::{Device, Tensor};
use pipeweave_kernels::{CpuPrimitives, Primitives};

/// The target id of padding: outside the byte vocabulary, so it can never be a real target.
pub const PAD_ID: u32 = 256;

/// A step's tokens.
#[derive(Clone, Debug)]
pub struct StepBatch {
    inputs: Vec<Tensor>,
    targets: Vec<Tensor>,
    normalizer: f64,
    tokens: usize,
    /// Slot `m` holds data microbatch `data_ids[m]` (the identity unless the data were put
    /// into other slots): deterministic sums of losses and gradients follow the data ids, so
    /// the slots a plan chooses change no bit.
    data_ids: Vec<u32>,
}

impl StepBatch {
    /// [`StepBatch::on_device`] on the device of the kernels' CPU primitives, where the stages
    /// of [`pipeweave_kernels::StageModel::new`] compute.
    pub fn new(
        inputs: &[Vec<u32>],
        targets: &[Vec<u32>],
        sequences: usize,
        seq_len: usize,
        pad_id: Option<u32>,
    ) -> Result<StepBatch, TrainError> {
        let ops = CpuPrimitives::new();
        Self::on_device(inputs, targets, sequences, seq_len, pad_id, ops.device())
    }

    /// Microbatch `m` feeds `inputs[m]` and predicts `targets[m]`, each `sequences × T_m` ids
    /// row-major with `0 < T_m <= seq_len` (every microbatch its own length: variable-length
    /// batches), as tensors on `device` (where the stages compute); targets equal to `pad_id`
    /// count for nothing.
    pub fn on_device(
        inputs: &[Vec<u32>],
        targets: &[Vec<u32>],
        sequences: usize,
        seq_len: usize,
        pad_id: Option<u32>,
        device: &Device,
    ) -> Result<StepBatch, TrainError> {
        if inputs.len() != targets.len() || inputs.is_empty() {
            return Err(TrainError::Batch {
                reason: format!(
                    "{} input and {} target microbatches; both must be equal and at least one",
                    inputs.len(),
                    targets.len()
                ),
            });
        }
        let tensor = |ids: &Vec<u32>, what: &str, m: usize| {
            let t = ids.len() / sequences.max(1);
            if sequences == 0 || t == 0 || t > seq_len || t * sequences != ids.len() {
                return Err(TrainError::Batch {
                    reason: format!(
                        "microbatch {m}: {} {what} ids, expected {sequences} sequences of 1 to \
                         {seq_len} tokens each",
                        ids.len()
                    ),
                });
            }
            Tensor::from_slice(ids, (sequences, t), device)
                .map_err(TrainError::tensor(format!("microbatch {m}'s {what} ids")))
        };
        if let Some(m) = (0..inputs.len()).find(|&m| inputs[m].len() != targets[m].len()) {
            return Err(TrainError::Batch {
                reason: format!(
                    "microbatch {m}: {} input ids but {} target ids",
                    inputs[m].len(),
                    targets[m].len()
                ),
            });
        }
        let inputs = inputs
            .iter()
            .enumerate()
            .map(|(m, ids)| tensor(ids, "input", m))
            .collect::<Result<Vec<_>, _>>()?;
        let tokens = targets
            .iter()
            .flatten()
            .filter(|&&id| Some(id) != pad_id)
            .count();
        let targets_t = targets
            .iter()
            .enumerate()
            .map(|(m, ids)| tensor(ids, "target", m))
            .collect::<Result<Vec<_>, _>>()?;
        if tokens == 0 {
            return Err(TrainError::Batch {
                reason: "the global batch has no non-padding target".to_string(),
            });
        }
        let data_ids = (0..inputs.len() as u32).collect();
        Ok(StepBatch {
            inputs,
            targets: targets_t,
            normalizer: tokens as f64,
            tokens,
            data_ids,
        })
    }

    /// The same batch whose slot `m` holds data microbatch `ids[m]` (a permutation of the
    /// slots; see [`StepBatch::data_id`]).
    pub fn with_data_ids(mut self, ids: Vec<u32>) -> Result<StepBatch, TrainError> {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        if !sorted.iter().copied().eq(0..self.inputs.len() as u32) {
            return Err(TrainError::Batch {
                reason: format!(
                    "data ids {ids:?} are not a permutation of the {} slots",
                    self.inputs.len()
                ),
            });
        }
        self.data_ids = ids;
        Ok(self)
    }

    /// The data microbatch slot `m` holds: what deterministic sums are ordered by.
    pub fn data_id(&self, m: usize) -> Option<u32> {
        self.data_ids.get(m).copied()
    }

    /// Number of microbatches.
    pub fn microbatches(&self) -> usize {
        self.inputs.len()
    }

    /// The input ids of microbatch `m`.
    pub fn input(&self, m: usize) -> Option<&Tensor> {
        self.inputs.get(m)
    }

    /// The targets of microbatch `m`.
    pub fn target(&self, m: usize) -> Option<&Tensor> {
        self.targets.get(m)
    }

    /// The loss normaliser: non-padding targets of the whole batch.
    pub fn normalizer(&self) -> f64 {
        self.normalizer
    }

    /// Non-padding targets of the whole batch.
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_lives_on_the_given_device_and_counts_non_padding_targets() {
        let inputs = [vec![1, 2, 3, 4], vec![5, 6]];
        let targets = [vec![2, 3, PAD_ID, 5], vec![6, 7]];
        let device = Device::Cpu;
        let batch = StepBatch::on_device(&inputs, &targets, 2, 2, Some(PAD_ID), &device).unwrap();
        assert_eq!(batch.microbatches(), 2);
        assert_eq!(batch.tokens(), 5);
        assert_eq!(batch.normalizer(), 5.0);
        let first = batch.input(0).unwrap();
        assert!(first.device().same_device(&device));
        assert_eq!(first.dims(), [2, 2]);
        assert_eq!(batch.target(1).unwrap().dims(), [2, 1]);
    }

    #[test]
    fn mismatched_or_padding_only_batches_are_refused() {
        let refused = |inputs: &[Vec<u32>], targets: &[Vec<u32>]| {
            StepBatch::new(inputs, targets, 1, 4, Some(PAD_ID)).is_err()
        };
        assert!(refused(&[vec![1, 2]], &[vec![2]]));
        assert!(refused(&[vec![1, 2]], &[vec![PAD_ID, PAD_ID]]));
        assert!(refused(&[vec![1; 5]], &[vec![2; 5]]));
        assert!(!refused(&[vec![1, 2]], &[vec![2, 3]]));
    }
}
