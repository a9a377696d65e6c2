//! [`LayerNorm`]: normalisation over the last dimension with a learned scale and shift,
//! `y = (x - mean) / sqrt(var + 1e-5) · weight + bias` (GPT-2's `layer_norm_epsilon`).
//!
//! The forward saves the normalised input `x̂` and the per-row `rstd`; the input backward needs
//! both and the weight, the weight backward needs `x̂` and the output gradient.

use candle_core::Tensor;

use super::protocol::{held_tensors, parameters, Layer};
use crate::check;
use crate::error::Result;
use crate::init::ParameterFactory;
use crate::primitives::Primitives;

const LAYER: &str = "LayerNorm";

/// Layer normalisation over the last dimension, with `weight: [n]` and `bias: [n]`.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
}

/// What [`LayerNorm::forward`] keeps: `x̂` and `rstd`.
#[derive(Debug)]
pub struct LayerNormSaved {
    normalized: Tensor,
    rstd: Tensor,
}

/// What [`LayerNorm::backward_weight`] needs: `x̂` and the output gradient.
#[derive(Debug)]
pub struct LayerNormPendingWeightGrad {
    normalized: Tensor,
    grad_output: Tensor,
}

impl LayerNormSaved {
    /// The dims of the input the forward normalised (and of its output).
    pub(crate) fn dims(&self) -> &[usize] {
        self.normalized.dims()
    }
}

impl LayerNorm {
    /// GPT-2's `layer_norm_epsilon`.
    pub const EPS: f64 = 1e-5;

    /// A layer norm from `weight: [n]` and `bias: [n]` (F32 or F64, same dtype).
    pub fn new(weight: Tensor, bias: Tensor) -> Result<Self> {
        check::named(LAYER, "weight", &weight).first_parameter(1, "[n]")?;
        check::named(LAYER, "bias", &bias).shaped_like(weight.dims(), weight.dtype())?;
        Ok(LayerNorm { weight, bias })
    }

    /// The normalised width `n`.
    pub fn features(&self) -> usize {
        self.weight.dims()[0]
    }
}

impl Layer for LayerNorm {
    type Saved = LayerNormSaved;
    type PendingWeightGrad = LayerNormPendingWeightGrad;
    type InputGrad = Tensor;

    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, LayerNormSaved)> {
        check::named(LAYER, "input", input).rows_of(self.features(), self.dtype())?;
        let out = ops.layer_norm(input, &self.weight, &self.bias, Self::EPS)?;
        let saved = LayerNormSaved {
            normalized: out.normalized,
            rstd: out.rstd,
        };
        Ok((out.output, saved))
    }

    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: LayerNormSaved,
        grad_output: &Tensor,
    ) -> Result<(Tensor, LayerNormPendingWeightGrad)> {
        check::grad_matches(LAYER, grad_output, saved.normalized.dims(), self.dtype())?;
        let grad_input = ops.layer_norm_backward_input(
            grad_output,
            &self.weight,
            &saved.normalized,
            &saved.rstd,
        )?;
        let pending = LayerNormPendingWeightGrad {
            normalized: saved.normalized,
            grad_output: grad_output.clone(),
        };
        Ok((grad_input, pending))
    }

    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: LayerNormPendingWeightGrad,
    ) -> Result<Vec<Tensor>> {
        let (grad_weight, grad_bias) =
            ops.layer_norm_backward_weight(&pending.grad_output, &pending.normalized)?;
        Ok(vec![grad_weight, grad_bias])
    }
}

parameters!(LayerNorm { "weight" => weight, "bias" => bias });
held_tensors!(mut LayerNormSaved { normalized, rstd });
held_tensors!(mut LayerNormPendingWeightGrad {
    normalized,
    grad_output
});

/// The factory's GPT-2 initialisation of a [`LayerNorm`].
impl ParameterFactory<'_> {
    /// A layer norm of width `features`: weight 1, bias 0.
    pub(crate) fn layer_norm(&self, features: usize) -> Result<LayerNorm> {
        LayerNorm::new(
            self.constant(&[features], 1.0)?,
            self.constant(&[features], 0.0)?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{check_layer_against_oracle, random, DTYPES};

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            // Non-trivial affine parameters, and inputs with an offset and uneven scale.
            let p = vec![random(1, &[6], 0.5, dtype), random(2, &[6], 0.5, dtype)];
            let layer = LayerNorm::new(p[0].clone(), p[1].clone()).unwrap();
            let input = random(3, &[2, 3, 6], 2.0, dtype).affine(1.0, 0.7).unwrap();
            check_layer_against_oracle("LayerNorm", &layer, &input, &p, |x, p| {
                oracle::layer_norm(x, &p[0], &p[1])
            });
        }
    }
}
