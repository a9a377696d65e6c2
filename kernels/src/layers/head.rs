//! [`Head`]: GPT-2's output head, the final layer norm `ln_f` then the logits
//! `h · lm_headᵀ` with an untied `lm_head` weight `[V, d]` (Hugging Face `GPT2LMHeadModel`
//! layout, no bias).
//!
//! Parameters, in order: `ln_f.weight`, `ln_f.bias`, `lm_head.weight`.

use candle_core::Tensor;

use super::layer_norm::LayerNorm;
use super::layer_norm::{LayerNormPendingWeightGrad, LayerNormSaved};
use super::model::{KindDescription, ModelLayer, Placement};
use super::protocol::{concat_grads, held_tensors, parameters, Layer, NamedParameters};
use crate::check;
use crate::config::GptConfig;
use crate::error::Result;
use crate::flops::passes::{head_flops, PassFlops};
use crate::init::{ParameterFactory, INIT_STD};
use crate::primitives::Primitives;

const LAYER: &str = "Head";

/// Final layer norm and vocabulary projection.
#[derive(Debug, Clone)]
pub struct Head {
    ln_f: LayerNorm,
    lm_head: Tensor,
}

/// What [`Head::forward`] keeps.
#[derive(Debug)]
pub struct HeadSaved {
    ln_f: LayerNormSaved,
    normed_rows: Tensor,
    input_dims: Vec<usize>,
}

/// What [`Head::backward_weight`] needs.
#[derive(Debug)]
pub struct HeadPendingWeightGrad {
    ln_f: LayerNormPendingWeightGrad,
    normed_rows: Tensor,
    grad_rows: Tensor,
}

impl Head {
    /// A head from the final layer norm (width `d`) and `lm_head: [V, d]`.
    pub fn new(ln_f: LayerNorm, lm_head: Tensor) -> Result<Self> {
        let checked = check::named(LAYER, "lm_head.weight", &lm_head);
        checked.parameter(2, "[V, d]")?;
        checked.width_and_dtype(ln_f.features(), ln_f.dtype())?;
        Ok(Head { ln_f, lm_head })
    }

    /// The vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.lm_head.dims()[0]
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.lm_head.dims()[1]
    }
}

impl Layer for Head {
    type Saved = HeadSaved;
    type PendingWeightGrad = HeadPendingWeightGrad;
    type InputGrad = Tensor;

    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, HeadSaved)> {
        check::named(LAYER, "input", input).rank_is(3, "[B, T, d]")?;
        let (normed, ln_f) = self.ln_f.forward(ops, input)?;
        let (batch, seq_len) = (input.dims()[0], input.dims()[1]);
        let normed_rows = ops.reshape(&normed, &[batch * seq_len, self.width()])?;
        let logits_rows = ops.matmul_transpose_b(&normed_rows, &self.lm_head)?;
        let logits = ops.reshape(&logits_rows, &[batch, seq_len, self.vocab_size()])?;
        let saved = HeadSaved {
            ln_f,
            normed_rows,
            input_dims: input.dims().to_vec(),
        };
        Ok((logits, saved))
    }

    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: HeadSaved,
        grad_output: &Tensor,
    ) -> Result<(Tensor, HeadPendingWeightGrad)> {
        let (batch, seq_len) = (saved.input_dims[0], saved.input_dims[1]);
        let logits_dims = [batch, seq_len, self.vocab_size()];
        check::grad_matches(LAYER, grad_output, &logits_dims, self.dtype())?;
        let grad_rows = ops.reshape(grad_output, &[batch * seq_len, self.vocab_size()])?;
        let grad_normed_rows = ops.matmul(&grad_rows, &self.lm_head)?;
        let grad_normed = ops.reshape(&grad_normed_rows, &saved.input_dims)?;
        let (grad_input, ln_f) = self.ln_f.backward_input(ops, saved.ln_f, &grad_normed)?;
        let pending = HeadPendingWeightGrad {
            ln_f,
            normed_rows: saved.normed_rows,
            grad_rows,
        };
        Ok((grad_input, pending))
    }

    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: HeadPendingWeightGrad,
    ) -> Result<Vec<Tensor>> {
        Ok(concat_grads([
            self.ln_f.backward_weight(ops, pending.ln_f)?,
            vec![ops.matmul_transpose_a(&pending.grad_rows, &pending.normed_rows)?],
        ]))
    }
}

/// The model's last layer: its logits go to the loss.
impl ModelLayer for Head {
    const KIND: KindDescription = KindDescription::placed("head", Placement::Last);

    /// `ln_f` weight 1 and bias 0, `lm_head` drawn `N(0, 0.02²)`.
    fn build(factory: &ParameterFactory<'_>, config: &GptConfig, _index: usize) -> Result<Self> {
        let (vocab, d) = (config.vocab_size(), config.d_model());
        Head::new(
            factory.layer_norm(d)?,
            factory.normal("lm_head.weight", &[vocab, d], INIT_STD)?,
        )
    }

    fn location(_index: usize) -> String {
        "transformer.ln_f/lm_head".to_string()
    }

    /// `transformer.ln_f.weight`, `transformer.ln_f.bias`, `lm_head.weight`: the final norm
    /// inside `transformer`, the untied projection outside it.
    fn push_model_parameters(&self, _index: usize, out: &mut Vec<(String, Tensor)>) {
        out.extend(self.parameters().into_iter().map(|(name, tensor)| {
            match name.starts_with("ln_f.") {
                true => (format!("transformer.{name}"), tensor),
                false => (name, tensor),
            }
        }));
    }

    fn flops(config: &GptConfig, batch: usize, seq_len: usize) -> PassFlops {
        head_flops(config, batch, seq_len)
    }
}

parameters!(Head { "ln_f" => ln_f, "lm_head.weight" => lm_head });
held_tensors!(mut HeadSaved { normed_rows, ln_f });
held_tensors!(mut HeadPendingWeightGrad {
    normed_rows,
    grad_rows,
    ln_f
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{check_layer_against_oracle, random, DTYPES};

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let p = vec![
                random(1, &[6], 0.5, dtype).affine(1.0, 1.0).unwrap(),
                random(2, &[6], 0.5, dtype),
                random(3, &[11, 6], 0.5, dtype),
            ];
            let ln_f = LayerNorm::new(p[0].clone(), p[1].clone()).unwrap();
            let layer = Head::new(ln_f, p[2].clone()).unwrap();
            let input = random(4, &[2, 3, 6], 1.0, dtype);
            check_layer_against_oracle("Head", &layer, &input, &p, |x, p| {
                oracle::head(x, &p[0], &p[1], &p[2])
            });
        }
    }
}
