//! [`Attention`]: causal multi-head self-attention exactly as Hugging Face's `GPT2Attention`
//! (no dropout): `c_attn` maps `d -> 3d`, split along the last dimension into q, k, v in that
//! order; heads split as `[B, T, H, D]` (then `[B, H, T, D]`); scores `q·kᵀ / √D`; causal mask;
//! softmax; weighted sum of v; heads merged; `c_proj` maps `d -> d`. The core (from `qkv` to the
//! merged context) is one primitive, [`Primitives::causal_attention`], which reads the heads in
//! place: no split or merged copies exist.
//!
//! Parameters, in order: `c_attn.weight`, `c_attn.bias`, `c_proj.weight`, `c_proj.bias`.

use candle_core::Tensor;

use super::linear::Linear;
use super::linear::{LinearPendingWeightGrad, LinearSaved};
use super::protocol::{chunked_passes, composite, composite_weights, held_tensors, Layer};
use crate::check;
use crate::error::{KernelError, Result};
use crate::primitives::Primitives;
use crate::sequence::Chunk;

const LAYER: &str = "Attention";

/// Causal multi-head self-attention with `c_attn: d -> 3d` and `c_proj: d -> d`.
#[derive(Debug, Clone)]
pub struct Attention {
    c_attn: Linear,
    c_proj: Linear,
    n_head: usize,
}

/// What the attention core's backward needs: `qkv: [B, T, 3d]` (the heads read in place; of a
/// sequence chunk, its own positions', the earlier ones kept in its
/// [`crate::sequence::ChunkMemory`]) and the attention weights `[B, H, T, T]` (of a chunk,
/// `[B, H, T_c, start + T_c]`).
#[derive(Debug)]
struct CoreSaved {
    qkv: Tensor,
    probs: Tensor,
}

/// What [`Attention::forward`] keeps.
#[derive(Debug)]
pub struct AttentionSaved {
    c_attn: LinearSaved,
    core: CoreSaved,
    c_proj: LinearSaved,
}

/// What [`Attention::backward_weight`] needs.
#[derive(Debug)]
pub struct AttentionPendingWeightGrad {
    c_attn: LinearPendingWeightGrad,
    c_proj: LinearPendingWeightGrad,
}

impl Attention {
    /// Attention from `c_attn: d -> 3d`, `c_proj: d -> d` and `n_head` dividing `d`.
    pub fn new(c_attn: Linear, c_proj: Linear, n_head: usize) -> Result<Self> {
        let width = c_attn.in_features();
        check::named(LAYER, "c_attn.weight", c_attn.weight()).shape_is(&[width, 3 * width])?;
        check::named(LAYER, "c_proj.weight", c_proj.weight())
            .shaped_like(&[width, width], c_attn.dtype())?;
        if n_head == 0 || width % n_head != 0 {
            return Err(KernelError::InvalidArgument {
                field: "n_head",
                value: n_head.to_string(),
                reason: "must be positive and divide the model width",
            });
        }
        Ok(Attention {
            c_attn,
            c_proj,
            n_head,
        })
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.c_attn.in_features()
    }

    /// The number of heads `H`.
    pub fn n_head(&self) -> usize {
        self.n_head
    }

    /// `1 / √D`, the score scale.
    fn score_scale(&self) -> f64 {
        1.0 / ((self.width() / self.n_head) as f64).sqrt()
    }

    /// The attention core on `qkv: [B, T, 3d]`: returns the merged context `[B, T, d]`. Of a
    /// sequence chunk (where `chunk` says), `qkv` is the chunk's own `[B, T_c, 3d]`: it reads the
    /// earlier chunks' keys and values in the chunk's memory and keeps its own there.
    fn attend(
        &self,
        ops: &dyn Primitives,
        qkv: Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, CoreSaved)> {
        let out = match chunk {
            None => ops.causal_attention(&qkv, 0, self.n_head, self.score_scale())?,
            Some((at, memory)) => {
                memory.keep(at, &qkv)?;
                let prefix = memory.prefix(ops, at)?;
                ops.causal_attention(&prefix, at.start, self.n_head, self.score_scale())?
            }
        };
        let core = CoreSaved {
            qkv,
            probs: out.probs,
        };
        Ok((out.context, core))
    }

    /// Backward of [`Self::attend`]: context gradient `[B, T, d]` -> qkv gradient `[B, T, 3d]`.
    /// Of a chunk, its own qkv gradient (with what the later chunks sent back to its keys and
    /// values); what it sends back to the earlier chunks stays in its memory.
    fn attend_backward(
        &self,
        ops: &dyn Primitives,
        core: CoreSaved,
        grad_context: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<Tensor> {
        let (qkv, start) = match &chunk {
            None => (core.qkv, 0),
            Some((at, memory)) => (memory.prefix(ops, *at)?, at.start),
        };
        let grad = ops.causal_attention_backward(
            &qkv,
            &core.probs,
            grad_context,
            start,
            self.n_head,
            self.score_scale(),
        )?;
        match chunk {
            None => Ok(grad),
            Some((at, memory)) => memory.take_gradient(ops, at, &grad),
        }
    }

    /// The forward, of a sequence chunk where `chunk` says.
    fn run(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, AttentionSaved)> {
        let checked = check::named(LAYER, "input", input);
        checked.rank_is(3, "[B, T, d]")?;
        checked.width_and_dtype(self.width(), self.dtype())?;
        let (qkv, c_attn) = self.c_attn.forward(ops, input)?;
        let (context, core) = self.attend(ops, qkv, chunk)?;
        let (output, c_proj) = self.c_proj.forward(ops, &context)?;
        let saved = AttentionSaved {
            c_attn,
            core,
            c_proj,
        };
        Ok((output, saved))
    }

    /// The input backward, of a sequence chunk where `chunk` says.
    fn run_backward(
        &self,
        ops: &dyn Primitives,
        saved: AttentionSaved,
        grad_output: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, AttentionPendingWeightGrad)> {
        let (grad_context, c_proj) = self.c_proj.backward_input(ops, saved.c_proj, grad_output)?;
        let grad_qkv = self.attend_backward(ops, saved.core, &grad_context, chunk)?;
        let (grad_input, c_attn) = self.c_attn.backward_input(ops, saved.c_attn, &grad_qkv)?;
        Ok((grad_input, AttentionPendingWeightGrad { c_attn, c_proj }))
    }
}

impl Layer for Attention {
    type Saved = AttentionSaved;
    type PendingWeightGrad = AttentionPendingWeightGrad;
    type InputGrad = Tensor;

    composite_weights!();
    chunked_passes!();
}

composite!(Attention: AttentionPendingWeightGrad { c_attn, c_proj });
held_tensors!(mut CoreSaved { qkv, probs });
held_tensors!(mut AttentionSaved { c_attn, core, c_proj });
held_tensors!(mut AttentionPendingWeightGrad { c_attn, c_proj });

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{
        assert_matches_finite_difference, check_multi_head_layer, finite_difference,
        invalid_argument, ops, random, run_split, shape_error, weighted_sum,
    };
    use candle_core::DType;

    fn params(d: usize, dtype: DType) -> Vec<Tensor> {
        vec![
            random(1, &[d, 3 * d], 0.5, dtype),
            random(2, &[3 * d], 0.5, dtype),
            random(3, &[d, d], 0.5, dtype),
            random(4, &[d], 0.5, dtype),
        ]
    }

    fn build(p: &[Tensor], n_head: usize) -> Attention {
        let c_attn = Linear::new(p[0].clone(), p[1].clone()).unwrap();
        let c_proj = Linear::new(p[2].clone(), p[3].clone()).unwrap();
        Attention::new(c_attn, c_proj, n_head).unwrap()
    }

    #[test]
    fn matches_candle_autograd() {
        check_multi_head_layer("Attention", params, build, oracle::attention);
    }

    #[test]
    fn matches_finite_differences() {
        let (d, n_head, dtype) = (4, 2, DType::F64);
        let p = params(d, dtype);
        let input = random(5, &[1, 3, d], 1.0, dtype);
        let grad_output = random(6, &[1, 3, d], 1.0, dtype);
        let run = run_split(&build(&p, n_head), &input, |_| grad_output.clone());
        let loss = |params: &[Tensor], x: &Tensor| {
            let (y, _) = build(params, n_head).forward(&ops(), x).unwrap();
            weighted_sum(&y, &grad_output)
        };
        let numeric = finite_difference(&input, 1e-6, |x| loss(&p, x));
        assert_matches_finite_difference("Attention d(input)", &run.grad_input, &numeric, 1e-7);
        for i in 0..p.len() {
            let numeric = finite_difference(&p[i], 1e-6, |value| {
                let mut perturbed = p.clone();
                perturbed[i] = value.clone();
                loss(&perturbed, &input)
            });
            let what = format!("Attention d(param {i})");
            assert_matches_finite_difference(&what, &run.grad_weights[i], &numeric, 1e-7);
        }
    }

    #[test]
    fn the_future_does_not_leak_into_the_past() {
        let (d, dtype) = (8, DType::F64);
        let attention = build(&params(d, dtype), 2);
        let input = random(5, &[1, 4, d], 1.0, dtype);
        let mut changed = crate::testing::values(&input);
        changed[3 * d] += 1.0; // the last position only
        let changed = Tensor::from_vec(changed, input.dims(), input.device()).unwrap();
        let (before, _) = attention.forward(&ops(), &input).unwrap();
        let (after, _) = attention.forward(&ops(), &changed).unwrap();
        let first_three = |t: &Tensor| crate::testing::values(&t.narrow(1, 0, 3).unwrap());
        assert_eq!(first_three(&before), first_three(&after));
    }

    #[test]
    fn rejects_bad_inputs() {
        let attention = build(&params(8, DType::F64), 2);
        let flat = random(5, &[4, 8], 1.0, DType::F64);
        let err = attention.forward(&ops(), &flat).unwrap_err();
        assert_eq!(shape_error(&err), ("Attention", "input"));
        let p = params(8, DType::F64);
        let c_attn = Linear::new(p[0].clone(), p[1].clone()).unwrap();
        let c_proj = Linear::new(p[2].clone(), p[3].clone()).unwrap();
        let err = Attention::new(c_attn, c_proj, 3).unwrap_err();
        assert_eq!(invalid_argument(&err), "n_head");
    }
}
