//! Tests of [`StageModel`] over sequence chunks (Seq1F1B, [`crate::sequence`]): the chunks of a
//! sequence, run forward in order and backward last first through two stages, give the whole
//! sequence's loss and gradients; recomputation gives the same bits; out-of-order chunks are
//! refused.

use candle_core::{DType, Tensor};

use super::tests::{batch, config, stage_layout, step, PAD};
use super::*;
use crate::layers::CrossEntropy;
use crate::testing::{assert_bit_identical, assert_close, invalid_argument, DTYPES};

/// Loss sum and gradients of a step over `bounds` chunks of each sequence through `stages`,
/// each stage keeping its own [`SequenceState`]; weight gradients summed in chunk order.
fn chunked_step(
    stages: &[&StageModel],
    ids: &Tensor,
    targets: &Tensor,
    normalizer: f64,
    bounds: &[usize],
) -> (f64, Vec<Tensor>) {
    let mut states: Vec<SequenceState> = stages
        .iter()
        .map(|s| SequenceState::new(s.layout().layers().len()))
        .collect();
    let chunks: Vec<(ChunkAt, usize)> = bounds
        .windows(2)
        .enumerate()
        .map(|(index, w)| (ChunkAt { index, start: w[0] }, w[1] - w[0]))
        .collect();
    let ops = stages[0].primitives();
    let mut saved = Vec::new();
    let mut loss_sum = 0.0;
    let mut grads_out = Vec::new();
    for &(at, len) in &chunks {
        let mut activation = ids.narrow(1, at.start, len).unwrap();
        let mut kept = Vec::new();
        for (stage, state) in stages.iter().zip(&mut states) {
            let (output, s) = stage.forward_chunk(&activation, at, state).unwrap();
            kept.push(s);
            activation = output;
        }
        let chunk_targets = targets.narrow(1, at.start, len).unwrap();
        let loss = CrossEntropy::new(Some(PAD))
            .loss_and_grad(ops, &activation, &chunk_targets, normalizer)
            .unwrap();
        loss_sum += loss
            .loss_sum
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        saved.push(kept);
        grads_out.push(loss.grad_logits);
    }
    let mut pending: Vec<Vec<StagePendingWeightGrad>> =
        (0..chunks.len()).map(|_| Vec::new()).collect();
    for (c, &(at, _)) in chunks.iter().enumerate().rev() {
        let mut grad = Some(grads_out[c].clone());
        let kept = std::mem::take(&mut saved[c]);
        for ((stage, state), s) in stages.iter().zip(&mut states).zip(kept).rev() {
            let (grad_input, weight) = stage
                .backward_input_chunk(s, &grad.take().unwrap(), at, state)
                .unwrap();
            grad = grad_input;
            pending[c].push(weight);
        }
        pending[c].reverse();
    }
    assert!(
        states.iter().all(SequenceState::is_empty),
        "every chunk's memory released"
    );
    let mut sums: Option<Vec<Tensor>> = None;
    for per_chunk in pending {
        let grads: Vec<Tensor> = stages
            .iter()
            .zip(per_chunk)
            .flat_map(|(stage, p)| stage.backward_weight(p).unwrap())
            .collect();
        sums = Some(match sums {
            None => grads,
            Some(sum) => sum
                .iter()
                .zip(&grads)
                .map(|(a, b)| (a + b).unwrap())
                .collect(),
        });
    }
    (loss_sum, sums.unwrap())
}

fn two_stages(dtype: DType, recompute: bool) -> (StageModel, StageModel) {
    let config = config();
    let first = StageModel::new(config, stage_layout(&config, true, 0..1, false), 5, dtype)
        .unwrap()
        .with_recompute(recompute);
    let second = StageModel::new(config, stage_layout(&config, false, 1..2, true), 5, dtype)
        .unwrap()
        .with_recompute(recompute);
    (first, second)
}

#[test]
fn chunks_give_the_whole_sequences_loss_and_gradients() {
    let (ids, targets) = batch();
    let normalizer = 9.0;
    for dtype in DTYPES {
        let (first, second) = two_stages(dtype, false);
        let whole = step(&[&first, &second], &ids, &targets, normalizer);
        for bounds in [&[0, 2, 6][..], &[0, 1, 3, 6], &[0, 6]] {
            let (loss, grads) =
                chunked_step(&[&first, &second], &ids, &targets, normalizer, bounds);
            // Compared at the dtype's tolerance (the sums were made in it).
            let as_tensor = |x: f64| {
                let t = Tensor::new(x, &candle_core::Device::Cpu).unwrap();
                t.to_dtype(dtype).unwrap()
            };
            assert_close("chunked loss", &as_tensor(loss), &as_tensor(whole.loss_sum));
            for (got, want) in grads.iter().zip(&whole.grads) {
                assert_close(&format!("chunks {bounds:?}"), got, want);
            }
        }
    }
}

#[test]
fn recomputed_chunks_give_the_same_bits() {
    let (ids, targets) = batch();
    let (first, second) = two_stages(DType::F32, false);
    let (again_first, again_second) = two_stages(DType::F32, true);
    let bounds = [0, 2, 4, 6];
    let (loss, grads) = chunked_step(&[&first, &second], &ids, &targets, 9.0, &bounds);
    let (loss_r, grads_r) =
        chunked_step(&[&again_first, &again_second], &ids, &targets, 9.0, &bounds);
    assert_eq!(loss.to_bits(), loss_r.to_bits());
    for (a, b) in grads.iter().zip(&grads_r) {
        assert_bit_identical("recomputed chunk", a, b);
    }
}

#[test]
fn chunks_out_of_order_are_refused() {
    let (ids, _) = batch();
    let (first, _) = two_stages(DType::F64, false);
    let mut state = SequenceState::new(first.layout().layers().len());
    let later = ChunkAt { index: 1, start: 2 };
    let err = first
        .forward_chunk(&ids.narrow(1, 2, 2).unwrap(), later, &mut state)
        .unwrap_err();
    assert_eq!(invalid_argument(root_of(&err)), "chunk");
    let at = ChunkAt { index: 0, start: 0 };
    let (_, saved0) = first
        .forward_chunk(&ids.narrow(1, 0, 2).unwrap(), at, &mut state)
        .unwrap();
    let (out1, saved1) = first
        .forward_chunk(&ids.narrow(1, 2, 2).unwrap(), later, &mut state)
        .unwrap();
    // Chunk 0's backward before chunk 1's: its keys' gradients are not complete yet.
    let grad = Tensor::ones(out1.dims(), DType::F64, &candle_core::Device::Cpu).unwrap();
    let err = first
        .backward_input_chunk(saved0, &grad, at, &mut state)
        .unwrap_err();
    assert_eq!(invalid_argument(root_of(&err)), "chunk");
    drop(saved1);
}

fn root_of(err: &KernelError) -> &KernelError {
    crate::testing::root_cause(err)
}
