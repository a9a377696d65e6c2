//! The weight-gradient recompute (an `RW` of a plan's `recompute` pass): for each pair the
//! program recomputes for its W, the store keeps its stage input (from its forward) and, once
//! its I ran, the output gradient it received; after the I, what the W needs is released, and
//! before the W it is rebuilt from those two by running the forward and the input-gradient
//! backward again ([`rebuild`]).

use super::ledger::tensor_bytes;
use candle_core::Tensor;
use pipeweave_core::Work;
use pipeweave_kernels::{KernelError, StageModel, StagePendingWeightGrad};
use std::collections::{HashMap, HashSet};

/// The pairs a program recomputes for their Ws and what is kept for each.
#[derive(Debug, Default)]
pub(crate) struct WeightRecomputes {
    /// The pairs the program recomputes for their Ws (its `RW` tasks).
    recomputed: HashSet<Work>,
    /// Per such pair, its stage input (from its forward) and, once its I ran, the output
    /// gradient it received.
    kept: HashMap<Work, (Tensor, Option<Tensor>)>,
}

impl WeightRecomputes {
    /// The program recomputes `work`'s W state: keep what it needs.
    pub(crate) fn mark(&mut self, work: Work) {
        self.recomputed.insert(work);
    }

    /// `work`'s forward ran on `input`: kept where `work` is recomputed.
    pub(crate) fn keep_input(&mut self, work: Work, input: &Tensor) {
        if self.recomputed.contains(&work) {
            self.kept.insert(work, (input.clone(), None));
        }
    }

    /// `work`'s I received `grad_output`: kept beside its input, if that was kept.
    pub(crate) fn keep_grad(&mut self, work: Work, grad_output: Tensor) {
        if let Some((_, grad)) = self.kept.get_mut(&work) {
            *grad = Some(grad_output);
        }
    }

    /// The bytes kept for `work` once both its input and its output gradient are (None before).
    pub(crate) fn checkpoint_bytes(&self, work: Work) -> Option<usize> {
        match self.kept.get(&work) {
            Some((input, Some(grad))) => Some(tensor_bytes(input) + tensor_bytes(grad)),
            _ => None,
        }
    }

    /// Takes what was kept for `work`: its input and output gradient (None where either is
    /// missing; what there was is gone either way).
    pub(crate) fn take(&mut self, work: Work) -> Option<(Tensor, Tensor)> {
        match self.kept.remove(&work) {
            Some((input, Some(grad))) => Some((input, grad)),
            _ => None,
        }
    }
}

/// What `model`'s I keeps for the W of the microbatch whose stage input was `input` and output
/// gradient `grad_output`: the forward and the I run again (the input gradient they compute is
/// not used: the I sent it already).
pub(crate) fn rebuild(
    model: &StageModel,
    input: &Tensor,
    grad_output: &Tensor,
) -> Result<StagePendingWeightGrad, KernelError> {
    let saved = model.recompute_state(model.checkpoint(input))?;
    let (_, pending) = model.backward_input(saved, grad_output)?;
    Ok(pending)
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{block, hidden};
    use super::*;

    fn bits(grads: &[Tensor]) -> Vec<Vec<u32>> {
        grads
            .iter()
            .map(|g| {
                let values = g.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                values.iter().map(|x| x.to_bits()).collect()
            })
            .collect()
    }

    #[test]
    fn only_marked_pairs_keep_their_input_and_output_gradient() {
        let mut store = WeightRecomputes::default();
        let (marked, other) = (Work::new(0, 0), Work::new(0, 1));
        store.mark(marked);
        store.keep_input(marked, &hidden(1));
        store.keep_input(other, &hidden(2));
        store.keep_grad(other, hidden(3));
        assert_eq!(store.checkpoint_bytes(marked), None);
        assert_eq!(store.checkpoint_bytes(other), None);
        store.keep_grad(marked, hidden(4));
        let one = tensor_bytes(&hidden(1));
        assert_eq!(store.checkpoint_bytes(marked), Some(2 * one));
        assert!(store.take(other).is_none());
        assert!(store.take(marked).is_some());
        assert!(store.take(marked).is_none());
    }

    #[test]
    fn taking_before_the_output_gradient_drops_the_input() {
        let mut store = WeightRecomputes::default();
        let work = Work::new(1, 0);
        store.mark(work);
        store.keep_input(work, &hidden(1));
        assert!(store.take(work).is_none());
        store.keep_grad(work, hidden(2));
        assert_eq!(store.checkpoint_bytes(work), None);
    }

    #[test]
    fn the_rebuilt_state_gives_the_weight_gradients_bit_for_bit() {
        let model = block();
        let (input, grad_output) = (hidden(5), hidden(6));
        let (_, saved) = model.forward(&input).unwrap();
        let (_, pending) = model.backward_input(saved, &grad_output).unwrap();
        let direct = model.backward_weight(pending).unwrap();
        let rebuilt = rebuild(&model, &input, &grad_output).unwrap();
        let again = model.backward_weight(rebuilt).unwrap();
        assert_eq!(bits(&direct), bits(&again));
    }
}
