//! The tiny GPT that the schedule and residency tests train: its config, random byte batches and
//! the bits of a tensor, for comparing runs bit for bit.
#![allow(dead_code)]

use candle_core::Tensor;
use pipeweave_kernels::init::SplitMix64;
use pipeweave_kernels::GptConfig;
use pipeweave_train::StepBatch;

/// Sequences per microbatch.
pub const SEQUENCES: usize = 2;
/// Bytes per sequence.
pub const SEQ_LEN: usize = 8;

/// 4 blocks of width 16, 2 heads, [`SEQ_LEN`]-byte sequences.
pub fn config() -> GptConfig {
    GptConfig::new(4, 16, 2, SEQ_LEN).unwrap()
}

/// Random bytes as inputs and next-byte targets for `microbatches` microbatches.
pub fn batch(microbatches: usize, seed: u64) -> StepBatch {
    let mut rng = SplitMix64::new(seed);
    let mut inputs = Vec::new();
    let mut targets = Vec::new();
    for _ in 0..microbatches {
        let bytes: Vec<u32> = (0..SEQUENCES * (SEQ_LEN + 1))
            .map(|_| (rng.next_u64() % 256) as u32)
            .collect();
        let rows: Vec<&[u32]> = bytes.chunks(SEQ_LEN + 1).collect();
        inputs.push(rows.iter().flat_map(|r| r[..SEQ_LEN].to_vec()).collect());
        targets.push(rows.iter().flat_map(|r| r[1..].to_vec()).collect());
    }
    StepBatch::new(&inputs, &targets, SEQUENCES, SEQ_LEN, None).unwrap()
}

/// The bits of an f32 tensor's values, flattened.
pub fn bits(t: &Tensor) -> Vec<u32> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}
