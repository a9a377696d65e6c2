//! What the training benches share: the sizes of a bench's run ([`BenchRun`]), the GPT they train
//! and its train settings. Included by each bench with `mod common;`.

use pipeweave_kernels::GptConfig;
use pipeweave_train::data::BatchShape;
use pipeweave_train::TrainSettings;

/// The sizes of a training bench's run: the pipeline, its batches, and the steps measured after a
/// warm-up.
#[derive(Clone, Copy, Debug)]
pub struct BenchRun {
    /// Pipeline ranks.
    pub ranks: u32,
    /// Microbatches per step.
    pub microbatches: u32,
    /// Bytes per sequence.
    pub seq_len: usize,
    /// Sequences per microbatch.
    pub sequences: usize,
    /// Steps run before the measured ones.
    pub warm_up: usize,
    /// Steps measured.
    pub steps: usize,
}

impl BenchRun {
    /// The benches' GPT: `blocks` blocks of width 192 with 4 heads, over this run's sequences.
    pub fn model(&self, blocks: usize) -> GptConfig {
        GptConfig::new(blocks, 192, 4, self.seq_len).expect("the bench's model")
    }

    /// The settings that train `model` on this run's batches, evaluating one sequence.
    pub fn settings(&self, model: GptConfig) -> TrainSettings {
        let shape = BatchShape::new(self.seq_len, self.sequences, self.microbatches as usize)
            .expect("valid shape");
        TrainSettings {
            eval_sequences: 1,
            ..TrainSettings::new(model, shape)
        }
    }

    /// Whether step `i` (from 0) is measured: it comes after the warm-up.
    pub fn measured(&self, i: usize) -> bool {
        i >= self.warm_up
    }

    /// Every step the run takes, warm-up included.
    pub fn all_steps(&self) -> std::ops::Range<usize> {
        0..self.warm_up + self.steps
    }
}
