//! [`MoeBlock`]: a pre-norm transformer block with a mixture of experts in place of the MLP,
//! `h = x + attn(ln_1(x))`, then `y = h + moe(ln_2(h))` ([`Moe`]). Its backward differentiates
//! the loss plus the mixture's load-balancing loss ([`MoeBlockSaved::aux_loss`]).
//!
//! Not a registered model layer (yet): the trainer's registration adds it, with its
//! configuration, initialisation and names in the model. It runs the mixture's phases on one
//! rank; a trainer with expert parallelism runs [`Moe`]'s phases itself.
//!
//! Parameters, in order: `ln_1.weight`, `ln_1.bias`, `attn.c_attn.weight`, `attn.c_attn.bias`,
//! `attn.c_proj.weight`, `attn.c_proj.bias`, `ln_2.weight`, `ln_2.bias`, then the mixture's
//! under `moe.` (`moe.router.weight`, `moe.router.bias`, `moe.experts.{e}.c_fc.weight`, ...).

use candle_core::Tensor;

use super::attention::Attention;
use super::attention::{AttentionPendingWeightGrad, AttentionSaved};
use super::layer_norm::LayerNorm;
use super::layer_norm::{LayerNormPendingWeightGrad, LayerNormSaved};
use super::moe::Moe;
use super::moe::{MoePendingWeightGrad, MoeSaved};
use super::protocol::{chunked_passes, composite, composite_weights, held_tensors, Layer};
use crate::check;
use crate::error::{KernelError, Result};
use crate::primitives::Primitives;
use crate::sequence::Chunk;

const LAYER: &str = "MoeBlock";

/// A pre-norm transformer block whose feed-forward half is a mixture of experts.
#[derive(Debug, Clone)]
pub struct MoeBlock {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    moe: Moe,
}

/// What [`MoeBlock::forward`] keeps.
#[derive(Debug)]
pub struct MoeBlockSaved {
    ln_1: LayerNormSaved,
    attn: AttentionSaved,
    ln_2: LayerNormSaved,
    moe: MoeSaved,
    output_dims: Vec<usize>,
}

/// What [`MoeBlock::backward_weight`] needs.
#[derive(Debug)]
pub struct MoeBlockPendingWeightGrad {
    ln_1: LayerNormPendingWeightGrad,
    attn: AttentionPendingWeightGrad,
    ln_2: LayerNormPendingWeightGrad,
    moe: MoePendingWeightGrad,
}

impl MoeBlockSaved {
    /// The mixture's state (its routing).
    pub fn moe(&self) -> &MoeSaved {
        &self.moe
    }

    /// The mixture's load-balancing loss for the forward's tokens, scaled by its coefficient:
    /// what the backward adds to the loss.
    pub fn aux_loss(&self) -> f64 {
        self.moe.aux_loss()
    }
}

impl MoeBlock {
    /// A block from its four sub-layers, which must agree on the width and dtype.
    pub fn new(ln_1: LayerNorm, attn: Attention, ln_2: LayerNorm, moe: Moe) -> Result<Self> {
        let (width, dtype) = (attn.width(), attn.dtype());
        for (name, features, layer_dtype) in [
            ("ln_1.weight", ln_1.features(), ln_1.dtype()),
            ("ln_2.weight", ln_2.features(), ln_2.dtype()),
            ("moe.router.weight", moe.width(), moe.dtype()),
        ] {
            if features != width {
                return Err(KernelError::Shape {
                    layer: LAYER,
                    tensor: name,
                    actual: vec![features],
                    expected: format!("width {width} (the attention's)"),
                });
            }
            if layer_dtype != dtype {
                return Err(KernelError::DType {
                    layer: LAYER,
                    tensor: name,
                    actual: layer_dtype,
                    expected: format!("{dtype:?} (the attention's)"),
                });
            }
        }
        Ok(MoeBlock {
            ln_1,
            attn,
            ln_2,
            moe,
        })
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.attn.width()
    }

    /// The mixture of experts.
    pub fn moe(&self) -> &Moe {
        &self.moe
    }
}

/// `x + sub(norm(x))`, one pre-norm residual half (`sub` run on a sequence chunk where `chunk`
/// says): the output and the states of `norm` and `sub`. (As `Block`'s.)
fn residual<S: Layer<InputGrad = Tensor>>(
    ops: &dyn Primitives,
    norm: &LayerNorm,
    sub: &S,
    x: &Tensor,
    chunk: Chunk<'_>,
) -> Result<(Tensor, LayerNormSaved, S::Saved)> {
    let (normed, norm_saved) = norm.forward(ops, x)?;
    let (branch, sub_saved) = match chunk {
        Some((at, memory)) => sub.forward_chunk(ops, &normed, at, memory)?,
        None => sub.forward(ops, &normed)?,
    };
    Ok((ops.add(x, &branch)?, norm_saved, sub_saved))
}

/// The input backward of [`residual`], `dx = dy + norm'(sub'(dy))`.
fn residual_backward<S: Layer<InputGrad = Tensor>>(
    ops: &dyn Primitives,
    norm: &LayerNorm,
    sub: &S,
    (norm_saved, sub_saved): (LayerNormSaved, S::Saved),
    grad: &Tensor,
    chunk: Chunk<'_>,
) -> Result<(Tensor, LayerNormPendingWeightGrad, S::PendingWeightGrad)> {
    let (grad_normed, sub_pending) = match chunk {
        Some((at, memory)) => sub.backward_input_chunk(ops, sub_saved, grad, at, memory)?,
        None => sub.backward_input(ops, sub_saved, grad)?,
    };
    let (grad_from_branch, norm_pending) = norm.backward_input(ops, norm_saved, &grad_normed)?;
    Ok((ops.add(grad, &grad_from_branch)?, norm_pending, sub_pending))
}

impl Layer for MoeBlock {
    type Saved = MoeBlockSaved;
    type PendingWeightGrad = MoeBlockPendingWeightGrad;
    type InputGrad = Tensor;

    composite_weights!();
    chunked_passes!();
}

impl MoeBlock {
    /// The forward, its attention on a sequence chunk where `chunk` says (the mixture routes
    /// the chunk's tokens as a batch of their own).
    fn run(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, MoeBlockSaved)> {
        check::named(LAYER, "input", input).rank_is(3, "[B, T, d]")?;
        let (hidden, ln_1, attn) = residual(ops, &self.ln_1, &self.attn, input, chunk)?;
        let (output, ln_2, moe) = residual(ops, &self.ln_2, &self.moe, &hidden, None)?;
        let saved = MoeBlockSaved {
            ln_1,
            attn,
            ln_2,
            moe,
            output_dims: input.dims().to_vec(),
        };
        Ok((output, saved))
    }

    /// The input backward, its attention's of a sequence chunk where `chunk` says.
    fn run_backward(
        &self,
        ops: &dyn Primitives,
        saved: MoeBlockSaved,
        grad_output: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, MoeBlockPendingWeightGrad)> {
        check::grad_matches(LAYER, grad_output, &saved.output_dims, self.dtype())?;
        let moe_half = (saved.ln_2, saved.moe);
        let (grad_hidden, ln_2, moe) =
            residual_backward(ops, &self.ln_2, &self.moe, moe_half, grad_output, None)?;
        let attn_half = (saved.ln_1, saved.attn);
        let (grad_input, ln_1, attn) =
            residual_backward(ops, &self.ln_1, &self.attn, attn_half, &grad_hidden, chunk)?;
        let pending = MoeBlockPendingWeightGrad {
            ln_1,
            attn,
            ln_2,
            moe,
        };
        Ok((grad_input, pending))
    }
}

composite!(MoeBlock: MoeBlockPendingWeightGrad { ln_1, attn, ln_2, moe });
held_tensors!(mut MoeBlockSaved { ln_1, attn, ln_2, moe });
held_tensors!(mut MoeBlockPendingWeightGrad {
    ln_1,
    attn,
    ln_2,
    moe
});

#[cfg(test)]
mod tests {
    use candle_core::DType;

    use super::*;
    use crate::config::MoeConfig;
    use crate::layers::moe::oracle::{check_with_aux, moe as moe_oracle};
    use crate::layers::{Linear, Mlp, NamedParameters};
    use crate::oracle;
    use crate::testing::{assert_bit_identical, ops, random, DTYPES};

    /// Random parameters of a block of width `d` with `config`'s mixture, in the block's order.
    fn params(d: usize, config: &MoeConfig, dtype: DType) -> Vec<Tensor> {
        let shapes: [&[usize]; 8] = [&[d], &[d], &[d, 3 * d], &[3 * d], &[d, d], &[d], &[d], &[d]];
        let mut p: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| random(10 + i as u64, shape, 0.4, dtype))
            .collect();
        for ln_weight in [0, 6] {
            p[ln_weight] = p[ln_weight].affine(1.0, 1.0).unwrap();
        }
        let (e, h) = (config.experts(), config.hidden());
        p.push(random(30, &[d, e], 1.0, dtype));
        p.push(random(31, &[e], 0.5, dtype));
        for expert in 0..e as u64 {
            let shapes: [&[usize]; 4] = [&[d, h], &[h], &[h, d], &[d]];
            for (i, shape) in shapes.iter().enumerate() {
                p.push(random(40 + 4 * expert + i as u64, shape, 0.4, dtype));
            }
        }
        p
    }

    fn build(p: &[Tensor], n_head: usize, config: &MoeConfig) -> MoeBlock {
        let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
        let experts = (0..config.experts())
            .map(|e| Mlp::new(linear(10 + 4 * e), linear(12 + 4 * e)).unwrap())
            .collect();
        MoeBlock::new(
            LayerNorm::new(p[0].clone(), p[1].clone()).unwrap(),
            Attention::new(linear(2), linear(4), n_head).unwrap(),
            LayerNorm::new(p[6].clone(), p[7].clone()).unwrap(),
            Moe::new(*config, linear(8), experts).unwrap(),
        )
        .unwrap()
    }

    /// The block written with candle ops: `(output, aux)`.
    fn block_oracle(
        x: &Tensor,
        p: &[Tensor],
        n_head: usize,
        config: &MoeConfig,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let normed = oracle::layer_norm(x, &p[0], &p[1])?;
        let h = (x + oracle::attention(&normed, &p[2..6], n_head)?)?;
        let (branch, aux) = moe_oracle(&oracle::layer_norm(&h, &p[6], &p[7])?, &p[8..], config)?;
        Ok(((&h + branch)?, aux))
    }

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let (d, n_head) = (8, 2);
            let config = MoeConfig::new(4, 2, 16, 0.05).unwrap();
            let p = params(d, &config, dtype);
            let input = random(5, &[2, 5, d], 1.0, dtype);
            let layer = build(&p, n_head, &config);
            check_with_aux(
                "MoeBlock",
                &layer,
                &input,
                &p,
                MoeBlockSaved::aux_loss,
                |x, p| block_oracle(x, p, n_head, &config),
            );
        }
    }

    #[test]
    fn runs_are_deterministic() {
        let config = MoeConfig::new(4, 2, 16, 0.05).unwrap();
        let layer = build(&params(8, &config, DType::F32), 2, &config);
        let input = random(6, &[2, 5, 8], 1.0, DType::F32);
        let run = || {
            let (output, saved) = layer.forward(&ops(), &input).unwrap();
            let (grad_input, pending) = layer.backward_input(&ops(), saved, &output).unwrap();
            let grads = layer.backward_weight(&ops(), pending).unwrap();
            (output, grad_input, grads)
        };
        let (first, second) = (run(), run());
        assert_bit_identical("MoeBlock output", &second.0, &first.0);
        assert_bit_identical("MoeBlock d(input)", &second.1, &first.1);
        for (a, b) in second.2.iter().zip(&first.2) {
            assert_bit_identical("MoeBlock weight gradient", a, b);
        }
    }

    #[test]
    fn parameter_names_put_the_mixture_under_moe() {
        let config = MoeConfig::new(2, 1, 16, 0.05).unwrap();
        let names: Vec<String> = build(&params(8, &config, DType::F64), 2, &config)
            .parameters()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names.len(), 8 + 2 + 2 * 4);
        assert_eq!(
            names[6..12],
            [
                "ln_2.weight",
                "ln_2.bias",
                "moe.router.weight",
                "moe.router.bias",
                "moe.experts.0.c_fc.weight",
                "moe.experts.0.c_fc.bias",
            ]
        );
        assert_eq!(names[17], "moe.experts.1.c_proj.bias");
    }

    #[test]
    fn rejects_a_mixture_of_another_width() {
        let config = MoeConfig::new(2, 1, 16, 0.05).unwrap();
        let p = params(8, &config, DType::F64);
        let narrow = params(4, &config, DType::F64);
        let linear = |p: &[Tensor], i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
        let experts = (0..2)
            .map(|e| Mlp::new(linear(&narrow, 10 + 4 * e), linear(&narrow, 12 + 4 * e)).unwrap())
            .collect();
        let err = MoeBlock::new(
            LayerNorm::new(p[0].clone(), p[1].clone()).unwrap(),
            Attention::new(linear(&p, 2), linear(&p, 4), 2).unwrap(),
            LayerNorm::new(p[6].clone(), p[7].clone()).unwrap(),
            Moe::new(config, linear(&narrow, 8), experts).unwrap(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("moe.router.weight"), "{err}");
    }
}
