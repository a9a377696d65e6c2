//! [`CrossEntropy`]: the token cross-entropy of logits `[.., V]` against U32 targets `[..]`,
//! with padding given by a pad id, normalised Megatron's way.
//!
//! **Padding.** A target equal to the pad id counts for nothing: no loss, zero gradient row. The
//! pad id may lie outside the vocabulary (with the 256-byte vocabulary every byte is a real
//! token, so e.g. 256 is a natural pad id); every other target must be `< V`.
//!
//! **Normalisation.** The loss returned is the *sum* over the non-padding tokens, and the
//! gradient is that of `sum / normalizer`, where `normalizer` is passed in: the number of
//! non-padding tokens of the whole global batch, known before the step (see
//! [`count_non_padding`]). The gradients then do not depend on how the tokens fall into
//! microbatches or ranks: the mean loss of the step is the sum of the returned sums divided by
//! the same normaliser.
//!
//! The log-softmax subtracts the row maximum before exponentiating, so large logits do not
//! overflow.

use candle_core::{DType, Tensor};

use crate::check;
use crate::error::{KernelError, Result};
use crate::primitives::Primitives;

const LAYER: &str = "CrossEntropy";

/// Token cross-entropy with an optional pad id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrossEntropy {
    pad_id: Option<u32>,
}

/// What [`CrossEntropy::loss_and_grad`] returns.
#[derive(Debug)]
pub struct LossOutput {
    /// Sum of the token losses over the non-padding targets, a rank-0 tensor (logits' dtype).
    pub loss_sum: Tensor,
    /// The number of non-padding targets.
    pub counted_tokens: usize,
    /// Gradient of `loss_sum / normalizer` w.r.t. the logits, shape of the logits.
    pub grad_logits: Tensor,
}

impl CrossEntropy {
    /// A cross-entropy where targets equal to `pad_id` (if any) are ignored.
    pub fn new(pad_id: Option<u32>) -> Self {
        CrossEntropy { pad_id }
    }

    /// The pad id, if any.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad_id
    }

    /// The summed loss of `logits: [.., V]` against `targets: [..]` and the gradient of
    /// `sum / normalizer` w.r.t. the logits; `normalizer` must be finite and positive.
    pub fn loss_and_grad(
        &self,
        ops: &dyn Primitives,
        logits: &Tensor,
        targets: &Tensor,
        normalizer: f64,
    ) -> Result<LossOutput> {
        let (rows, vocab_size) = check_logits_and_targets(logits, targets)?;
        check_normalizer(normalizer)?;
        let target_values = ops.u32_values(targets)?;
        let (safe_targets, weights) = self.mask_padding(&target_values, vocab_size)?;
        let counted_tokens = weights.iter().filter(|&&w| w > 0.0).count();
        let out = ops.cross_entropy(
            &ops.reshape(logits, &[rows, vocab_size])?,
            &ops.u32_tensor(&safe_targets, &[rows])?,
            &ops.float_tensor(&weights, &[rows], logits.dtype())?,
            1.0 / normalizer,
        )?;
        Ok(LossOutput {
            loss_sum: out.loss_sum,
            counted_tokens,
            grad_logits: ops.reshape(&out.grad_logits, logits.dims())?,
        })
    }

    /// Per target: the id to gather (0 for padding) and its weight (0 for padding, else 1).
    fn mask_padding(&self, targets: &[u32], vocab_size: usize) -> Result<(Vec<u32>, Vec<f64>)> {
        let is_pad = |id: u32| self.pad_id == Some(id);
        let counted: Vec<u32> = targets
            .iter()
            .map(|&id| if is_pad(id) { 0 } else { id })
            .collect();
        check::ids_below(LAYER, "targets", &counted, vocab_size)?;
        let weights = targets
            .iter()
            .map(|&id| if is_pad(id) { 0.0 } else { 1.0 })
            .collect();
        Ok((counted, weights))
    }
}

/// The number of targets not equal to `pad_id`: the normaliser of a global batch.
pub fn count_non_padding(
    ops: &dyn Primitives,
    targets: &Tensor,
    pad_id: Option<u32>,
) -> Result<usize> {
    check::named(LAYER, "targets", targets).dtype_is(DType::U32)?;
    let values = ops.u32_values(targets)?;
    Ok(values.iter().filter(|&&id| Some(id) != pad_id).count())
}

/// Checks logits `[.., V]` against targets `[..]`; returns the number of rows and `V`.
fn check_logits_and_targets(logits: &Tensor, targets: &Tensor) -> Result<(usize, usize)> {
    let checked = check::named(LAYER, "logits", logits);
    checked.supported_float()?;
    checked.non_empty()?;
    check::named(LAYER, "targets", targets).dtype_is(DType::U32)?;
    let (leading, vocab_size) = match logits.dims().split_last() {
        Some((&vocab_size, leading)) if !leading.is_empty() => (leading, vocab_size),
        _ => {
            return Err(KernelError::Shape {
                layer: LAYER,
                tensor: "logits",
                actual: logits.dims().to_vec(),
                expected: "[.., V] with at least one leading dimension".into(),
            })
        }
    };
    check::named(LAYER, "targets", targets).shape_is(leading)?;
    Ok((targets.elem_count(), vocab_size))
}

fn check_normalizer(normalizer: f64) -> Result<()> {
    if normalizer.is_finite() && normalizer > 0.0 {
        return Ok(());
    }
    Err(KernelError::InvalidArgument {
        field: "normalizer",
        value: normalizer.to_string(),
        reason: "must be finite and positive (the non-padding token count of the global batch)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{
        assert_close, assert_matches, assert_matches_finite_difference, finite_difference,
        invalid_argument, ops, random, random_ids, shape_error, values, DTYPES,
    };
    use candle_core::Device;

    const VOCAB: usize = 11;
    const PAD: u32 = 11; // outside the vocabulary, as with the byte vocabulary

    /// Targets `[2, 4]` with three padding positions.
    fn targets() -> Tensor {
        let mut ids = crate::testing::values(
            &random_ids(7, &[8], VOCAB as u32)
                .to_dtype(DType::F64)
                .unwrap(),
        );
        for pad_at in [2, 5, 7] {
            ids[pad_at] = f64::from(PAD);
        }
        let ids: Vec<u32> = ids.iter().map(|&v| v as u32).collect();
        Tensor::from_vec(ids, (2, 4), &Device::Cpu).unwrap()
    }

    fn pad_mask(targets: &Tensor, dtype: DType) -> Tensor {
        let ids = targets.flatten_all().unwrap().to_vec1::<u32>().unwrap();
        let mask: Vec<f64> = ids
            .iter()
            .map(|&id| if id == PAD { 0.0 } else { 1.0 })
            .collect();
        Tensor::from_vec(mask, ids.len(), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    }

    #[test]
    fn matches_candle_autograd() {
        let normalizer = 9.0; // e.g. the whole global batch's count, not this microbatch's 5
        for dtype in DTYPES {
            let logits = random(1, &[2, 4, VOCAB], 2.0, dtype);
            let targets = targets();
            let out = CrossEntropy::new(Some(PAD))
                .loss_and_grad(&ops(), &logits, &targets, normalizer)
                .unwrap();
            assert_eq!(out.counted_tokens, 5);

            let var = oracle::vars(std::slice::from_ref(&logits)).remove(0);
            let rows = var.as_tensor().reshape((8, VOCAB)).unwrap();
            let safe_targets = targets
                .flatten_all()
                .unwrap()
                .minimum(VOCAB as u32 - 1)
                .unwrap();
            let loss_sum =
                oracle::cross_entropy_sum(&rows, &safe_targets, &pad_mask(&targets, dtype))
                    .unwrap();
            let grads = (&loss_sum / normalizer).unwrap().backward().unwrap();
            assert_close("CrossEntropy loss sum", &out.loss_sum, &loss_sum);
            let expected = grads.get(var.as_tensor()).unwrap();
            assert_close("CrossEntropy d(logits)", &out.grad_logits, expected);
        }
    }

    #[test]
    fn matches_finite_differences() {
        let (logits, targets, normalizer) =
            (random(1, &[2, 4, VOCAB], 2.0, DType::F64), targets(), 9.0);
        let loss = CrossEntropy::new(Some(PAD));
        let out = loss
            .loss_and_grad(&ops(), &logits, &targets, normalizer)
            .unwrap();
        let numeric = finite_difference(&logits, 1e-6, |x| {
            let out = loss.loss_and_grad(&ops(), x, &targets, normalizer).unwrap();
            out.loss_sum.to_scalar::<f64>().unwrap() / normalizer
        });
        assert_matches_finite_difference(
            "CrossEntropy d(logits)",
            &out.grad_logits,
            &numeric,
            1e-8,
        );
    }

    #[test]
    fn padding_contributes_nothing() {
        let (logits, targets) = (random(1, &[2, 4, VOCAB], 2.0, DType::F64), targets());
        let loss = CrossEntropy::new(Some(PAD));
        let out = loss.loss_and_grad(&ops(), &logits, &targets, 5.0).unwrap();
        // Scramble the logits of the padding positions (flat rows 2, 5, 7).
        let mut scrambled = values(&logits);
        for row in [2, 5, 7] {
            for v in &mut scrambled[row * VOCAB..(row + 1) * VOCAB] {
                *v = *v * 30.0 - 4.0;
            }
        }
        let scrambled = Tensor::from_vec(scrambled, logits.dims(), &Device::Cpu).unwrap();
        let again = loss
            .loss_and_grad(&ops(), &scrambled, &targets, 5.0)
            .unwrap();
        let loss_of = |o: &LossOutput| o.loss_sum.to_scalar::<f64>().unwrap();
        assert_eq!(loss_of(&out).to_bits(), loss_of(&again).to_bits());
        let grad = values(&out.grad_logits);
        for row in [2, 5, 7] {
            assert!(grad[row * VOCAB..(row + 1) * VOCAB]
                .iter()
                .all(|&g| g == 0.0));
        }
        assert_eq!(count_non_padding(&ops(), &targets, Some(PAD)).unwrap(), 5);
    }

    #[test]
    fn large_logits_stay_finite() {
        let logits = random(1, &[1, 3, VOCAB], 1.0, DType::F32)
            .affine(1e4, 0.0)
            .unwrap();
        let targets = random_ids(2, &[1, 3], VOCAB as u32);
        let out = CrossEntropy::new(None)
            .loss_and_grad(&ops(), &logits, &targets, 3.0)
            .unwrap();
        assert!(out.loss_sum.to_scalar::<f32>().unwrap().is_finite());
        assert!(values(&out.grad_logits).iter().all(|g| g.is_finite()));
    }

    #[test]
    fn rejects_bad_targets_normalizers_and_shapes() {
        let logits = random(1, &[1, 3, VOCAB], 1.0, DType::F64);
        let ce = CrossEntropy::new(Some(PAD));
        let bad = Tensor::new(&[[0u32, 12, PAD]], &Device::Cpu).unwrap();
        let err = ce.loss_and_grad(&ops(), &logits, &bad, 1.0).unwrap_err();
        assert_matches!(
            err,
            KernelError::TokenOutOfRange {
                id: 12,
                position: 1,
                ..
            }
        );
        let good = Tensor::new(&[[0u32, 1, PAD]], &Device::Cpu).unwrap();
        for normalizer in [0.0, -1.0, f64::NAN] {
            let err = ce
                .loss_and_grad(&ops(), &logits, &good, normalizer)
                .unwrap_err();
            assert_eq!(invalid_argument(&err), "normalizer");
        }
        let short = Tensor::new(&[[0u32, 1]], &Device::Cpu).unwrap();
        let err = ce.loss_and_grad(&ops(), &logits, &short, 1.0).unwrap_err();
        assert_eq!(shape_error(&err), ("CrossEntropy", "targets"));
    }
}
