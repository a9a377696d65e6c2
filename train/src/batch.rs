//! One step's data as the stages see it: every microbatch's input tokens and targets as tensors,
//! and the loss normaliser of the whole global batch.
//!
//! Loss the way Megatron computes it: every microbatch's token losses are summed and divided by
//! the number of non-padding targets of the whole global batch (all microbatches, all
//! data-parallel replicas), known before the step, so the gradients do not depend on how tokens
//! fall into microbatches.

use crate::error::TrainError;
use candle_core::{Device, Tensor};

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
    /// Microbatch `m` feeds `inputs[m]` and predicts `targets[m]`, each `sequences × T_m` ids
    /// row-major with `0 < T_m <= seq_len` (every microbatch its own length: variable-length
    /// batches); targets equal to `pad_id` count for nothing.
    pub fn new(
        inputs: &[Vec<u32>],
        targets: &[Vec<u32>],
        sequences: usize,
        seq_len: usize,
        pad_id: Option<u32>,
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
            Tensor::from_slice(ids, (sequences, t), &Device::Cpu)
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
