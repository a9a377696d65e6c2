//! [`Mlp`]: GPT-2's feed-forward sub-layer, `c_proj(gelu_new(c_fc(x)))` with `c_fc: d -> h`
//! and `c_proj: h -> d` (`h = 4d` in GPT-2).
//!
//! Parameters, in order: `c_fc.weight`, `c_fc.bias`, `c_proj.weight`, `c_proj.bias`.

use candle_core::Tensor;

use super::gelu::Gelu;
use super::gelu::GeluSaved;
use super::linear::Linear;
use super::linear::{LinearPendingWeightGrad, LinearSaved};
use super::protocol::{composite, composite_weights, held_tensors, Layer};
use crate::check;
use crate::error::Result;
use crate::init::{ParameterFactory, INIT_STD};
use crate::primitives::Primitives;

const LAYER: &str = "Mlp";

/// The feed-forward sub-layer `c_proj(gelu_new(c_fc(x)))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    c_fc: Linear,
    c_proj: Linear,
}

/// What [`Mlp::forward`] keeps.
#[derive(Debug)]
pub struct MlpSaved {
    c_fc: LinearSaved,
    gelu: GeluSaved,
    c_proj: LinearSaved,
}

/// What [`Mlp::backward_weight`] needs.
#[derive(Debug)]
pub struct MlpPendingWeightGrad {
    c_fc: LinearPendingWeightGrad,
    c_proj: LinearPendingWeightGrad,
}

impl Mlp {
    /// An MLP from `c_fc: d -> h` and `c_proj: h -> d`.
    pub fn new(c_fc: Linear, c_proj: Linear) -> Result<Self> {
        let (width, hidden) = (c_fc.in_features(), c_fc.out_features());
        check::named(LAYER, "c_proj.weight", c_proj.weight())
            .shaped_like(&[hidden, width], c_fc.dtype())?;
        Ok(Mlp { c_fc, c_proj })
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.c_fc.in_features()
    }

    /// The hidden width `h`.
    pub fn hidden(&self) -> usize {
        self.c_fc.out_features()
    }

    /// The first linear, `c_fc: d -> h`.
    pub fn c_fc(&self) -> &Linear {
        &self.c_fc
    }
}

impl Layer for Mlp {
    type Saved = MlpSaved;
    type PendingWeightGrad = MlpPendingWeightGrad;
    type InputGrad = Tensor;

    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, MlpSaved)> {
        let (hidden, c_fc) = self.c_fc.forward(ops, input)?;
        let (activated, gelu) = Gelu.forward(ops, &hidden)?;
        let (output, c_proj) = self.c_proj.forward(ops, &activated)?;
        Ok((output, MlpSaved { c_fc, gelu, c_proj }))
    }

    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: MlpSaved,
        grad_output: &Tensor,
    ) -> Result<(Tensor, MlpPendingWeightGrad)> {
        let (grad_activated, c_proj) =
            self.c_proj.backward_input(ops, saved.c_proj, grad_output)?;
        let (grad_hidden, ()) = Gelu.backward_input(ops, saved.gelu, &grad_activated)?;
        let (grad_input, c_fc) = self.c_fc.backward_input(ops, saved.c_fc, &grad_hidden)?;
        Ok((grad_input, MlpPendingWeightGrad { c_fc, c_proj }))
    }

    composite_weights!();
}

/// The factory's GPT-2 initialisation of an [`Mlp`].
impl ParameterFactory<'_> {
    /// An MLP `d -> hidden -> d` named `prefix`: `c_fc.weight` `N(0, 0.02²)`, `c_proj.weight`
    /// `N(0, residual_std²)` (a block's residual projection), biases 0.
    pub(crate) fn mlp(
        &self,
        prefix: &str,
        d: usize,
        hidden: usize,
        residual_std: f64,
    ) -> Result<Mlp> {
        let c_fc = self.linear(&format!("{prefix}.c_fc"), d, hidden, INIT_STD)?;
        let c_proj = self.linear(&format!("{prefix}.c_proj"), hidden, d, residual_std)?;
        Mlp::new(c_fc, c_proj)
    }
}

composite!(Mlp: MlpPendingWeightGrad { c_fc, c_proj });
held_tensors!(mut MlpSaved { c_fc, gelu, c_proj });
held_tensors!(mut MlpPendingWeightGrad { c_fc, c_proj });

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{check_layer_against_oracle, random, DTYPES};

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let (d, h) = (4, 16);
            let p = vec![
                random(1, &[d, h], 0.5, dtype),
                random(2, &[h], 0.5, dtype),
                random(3, &[h, d], 0.5, dtype),
                random(4, &[d], 0.5, dtype),
            ];
            let c_fc = Linear::new(p[0].clone(), p[1].clone()).unwrap();
            let c_proj = Linear::new(p[2].clone(), p[3].clone()).unwrap();
            let layer = Mlp::new(c_fc, c_proj).unwrap();
            let input = random(5, &[2, 3, d], 1.0, dtype);
            check_layer_against_oracle("Mlp", &layer, &input, &p, oracle::mlp);
        }
    }
}
