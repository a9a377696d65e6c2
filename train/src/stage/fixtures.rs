//! A one-block stage and its inputs, for the unit tests of the stage's parts.

use candle_core::{DType, Device, Tensor};
use pipeweave_kernels::{GptConfig, StageLayout, StageModel};

/// Sequences of a test microbatch, and tokens per sequence.
pub(crate) const SHAPE: (usize, usize) = (2, 4);

/// A stage holding the first block of a tiny GPT (width 8, 2 heads), in f32.
pub(crate) fn block() -> StageModel {
    let config = GptConfig::new(2, 8, 2, SHAPE.1).unwrap();
    let layout = StageLayout::new(&config, 1..2).unwrap();
    StageModel::new(config, layout, 7, DType::F32).unwrap()
}

/// Hidden states `[B, T, 8]` drawn from `seed`.
pub(crate) fn hidden(seed: u64) -> Tensor {
    let (b, t) = SHAPE;
    let values: Vec<f32> = (0..b * t * 8)
        .map(|i| ((i as u64 * 2_654_435_761 + seed) % 97) as f32 / 97.0 - 0.5)
        .collect();
    Tensor::from_vec(values, (b, t, 8), &Device::Cpu).unwrap()
}
