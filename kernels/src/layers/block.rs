//! [`Block`]: GPT-2's pre-norm transformer block, `h = x + attn(ln_1(x))`, then
//! `y = h + mlp(ln_2(h))`. The pre-norm residual halves (`residual`, `residual_backward`)
//! and the sub-layers' agreement check are shared with [`super::MoeBlock`], the same block with a
//! mixture of experts for its MLP (a model's blocks are one or the other: [`GptConfig::moe`]).
//!
//! Parameters, in order (Hugging Face's `GPT2Block` order): `ln_1.weight`, `ln_1.bias`,
//! `attn.c_attn.weight`, `attn.c_attn.bias`, `attn.c_proj.weight`, `attn.c_proj.bias`,
//! `ln_2.weight`, `ln_2.bias`, `mlp.c_fc.weight`, `mlp.c_fc.bias`, `mlp.c_proj.weight`,
//! `mlp.c_proj.bias`.

use candle_core::{DType, Tensor};

use super::attention::Attention;
use super::attention::{AttentionPendingWeightGrad, AttentionSaved};
use super::layer_norm::LayerNorm;
use super::layer_norm::{LayerNormPendingWeightGrad, LayerNormSaved};
use super::mlp::Mlp;
use super::mlp::{MlpPendingWeightGrad, MlpSaved};
use super::model::{KindDescription, ModelLayer, Placement};
use super::protocol::{chunked_passes, composite, composite_weights, held_tensors, Layer};
use crate::check;
use crate::config::GptConfig;
use crate::error::Result;
use crate::flops::passes::{block_flops, PassFlops};
use crate::init::{ParameterFactory, INIT_STD};
use crate::primitives::Primitives;
use crate::sequence::Chunk;

const LAYER: &str = "Block";

/// A pre-norm transformer block.
#[derive(Debug, Clone)]
pub struct Block {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    mlp: Mlp,
}

/// What [`Block::forward`] keeps.
#[derive(Debug)]
pub struct BlockSaved {
    ln_1: LayerNormSaved,
    attn: AttentionSaved,
    ln_2: LayerNormSaved,
    mlp: MlpSaved,
    output_dims: Vec<usize>,
}

/// What [`Block::backward_weight`] needs.
#[derive(Debug)]
pub struct BlockPendingWeightGrad {
    ln_1: LayerNormPendingWeightGrad,
    attn: AttentionPendingWeightGrad,
    ln_2: LayerNormPendingWeightGrad,
    mlp: MlpPendingWeightGrad,
}

impl Block {
    /// A block from its four sub-layers, which must agree on the width and dtype.
    pub fn new(ln_1: LayerNorm, attn: Attention, ln_2: LayerNorm, mlp: Mlp) -> Result<Self> {
        let width = attn.width();
        let dtype = attn.dtype();
        for (name, features, layer_dtype) in [
            ("ln_1.weight", ln_1.features(), ln_1.dtype()),
            ("ln_2.weight", ln_2.features(), ln_2.dtype()),
            ("mlp.c_fc.weight", mlp.width(), mlp.dtype()),
        ] {
            check_agrees(LAYER, name, (features, layer_dtype), (width, dtype))?;
        }
        Ok(Block {
            ln_1,
            attn,
            ln_2,
            mlp,
        })
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.attn.width()
    }
}

/// Fails unless a sub-layer's `(width, dtype)` (named by its first parameter) is the attention's,
/// in a block `layer`.
pub(super) fn check_agrees(
    layer: &'static str,
    name: &'static str,
    (features, actual): (usize, DType),
    (width, expected): (usize, DType),
) -> Result<()> {
    if features != width {
        return Err(crate::KernelError::Shape {
            layer,
            tensor: name,
            actual: vec![features],
            expected: format!("width {width} (the attention's)"),
        });
    }
    if actual != expected {
        return Err(crate::KernelError::DType {
            layer,
            tensor: name,
            actual,
            expected: format!("{expected:?} (the attention's)"),
        });
    }
    Ok(())
}

/// `x + sub(norm(x))`, one pre-norm residual half of the block (`sub` run on a sequence chunk
/// where `chunk` says): the output and the states of `norm` and `sub`.
pub(super) fn residual<S: Layer<InputGrad = Tensor>>(
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

/// The input backward of [`residual`], `dx = dy + norm'(sub'(dy))`: the input gradient and the
/// pending states of `norm` and `sub`.
pub(super) fn residual_backward<S: Layer<InputGrad = Tensor>>(
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

impl Layer for Block {
    type Saved = BlockSaved;
    type PendingWeightGrad = BlockPendingWeightGrad;
    type InputGrad = Tensor;

    composite_weights!();
    chunked_passes!();
}

impl Block {
    /// The forward, its attention on a sequence chunk where `chunk` says.
    fn run(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, BlockSaved)> {
        check::named(LAYER, "input", input).rank_is(3, "[B, T, d]")?;
        let (hidden, ln_1, attn) = residual(ops, &self.ln_1, &self.attn, input, chunk)?;
        let (output, ln_2, mlp) = residual(ops, &self.ln_2, &self.mlp, &hidden, None)?;
        let saved = BlockSaved {
            ln_1,
            attn,
            ln_2,
            mlp,
            output_dims: input.dims().to_vec(),
        };
        Ok((output, saved))
    }

    /// The input backward, its attention's of a sequence chunk where `chunk` says.
    fn run_backward(
        &self,
        ops: &dyn Primitives,
        saved: BlockSaved,
        grad_output: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, BlockPendingWeightGrad)> {
        check::grad_matches(LAYER, grad_output, &saved.output_dims, self.dtype())?;
        let mlp_half = (saved.ln_2, saved.mlp);
        let (grad_hidden, ln_2, mlp) =
            residual_backward(ops, &self.ln_2, &self.mlp, mlp_half, grad_output, None)?;
        let attn_half = (saved.ln_1, saved.attn);
        let (grad_input, ln_1, attn) =
            residual_backward(ops, &self.ln_1, &self.attn, attn_half, &grad_hidden, chunk)?;
        let pending = BlockPendingWeightGrad {
            ln_1,
            attn,
            ln_2,
            mlp,
        };
        Ok((grad_input, pending))
    }
}

/// The model's free layers, `n_layer` of them, spread over the stages (none where the model's
/// blocks have a mixture of experts: [`super::MoeBlock`]s instead).
impl ModelLayer for Block {
    const KIND: KindDescription = KindDescription::placed("block", Placement::Any);

    fn count(config: &GptConfig) -> usize {
        match config.moe() {
            Some(_) => 0,
            None => config.n_layer(),
        }
    }

    /// Layer norms weight 1 and bias 0, linear biases 0, linear weights drawn `N(0, 0.02²)`,
    /// the two `c_proj.weight`s `N(0, (0.02 / √(2·n_layer))²)`.
    fn build(factory: &ParameterFactory<'_>, config: &GptConfig, index: usize) -> Result<Self> {
        let d = config.d_model();
        let prefix = Self::location(index);
        let residual_std = INIT_STD / (2.0 * config.n_layer() as f64).sqrt();
        let c_attn = factory.linear(&format!("{prefix}.attn.c_attn"), d, 3 * d, INIT_STD)?;
        let c_proj = factory.linear(&format!("{prefix}.attn.c_proj"), d, d, residual_std)?;
        let hidden = config.mlp_hidden();
        let c_fc = factory.linear(&format!("{prefix}.mlp.c_fc"), d, hidden, INIT_STD)?;
        let mlp_proj = factory.linear(&format!("{prefix}.mlp.c_proj"), hidden, d, residual_std)?;
        Block::new(
            factory.layer_norm(d)?,
            Attention::new(c_attn, c_proj, config.n_head())?,
            factory.layer_norm(d)?,
            Mlp::new(c_fc, mlp_proj)?,
        )
    }

    /// `transformer.h.{index}`, `index` the block's global index.
    fn location(index: usize) -> String {
        format!("transformer.h.{index}")
    }

    fn flops(config: &GptConfig, batch: usize, seq_len: usize) -> PassFlops {
        block_flops(config, batch, seq_len)
    }
}

composite!(Block: BlockPendingWeightGrad { ln_1, attn, ln_2, mlp });
held_tensors!(mut BlockSaved { ln_1, attn, ln_2, mlp });
held_tensors!(mut BlockPendingWeightGrad {
    ln_1,
    attn,
    ln_2,
    mlp
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::{Linear, NamedParameters};
    use crate::oracle;
    use crate::testing::{check_multi_head_layer, random};

    /// Random block parameters (in Hugging Face order) of width `d`.
    pub(crate) fn params(d: usize, dtype: DType) -> Vec<Tensor> {
        let shapes: [&[usize]; 12] = [
            &[d],
            &[d],
            &[d, 3 * d],
            &[3 * d],
            &[d, d],
            &[d],
            &[d],
            &[d],
            &[d, 4 * d],
            &[4 * d],
            &[4 * d, d],
            &[d],
        ];
        let mut p: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| random(10 + i as u64, shape, 0.4, dtype))
            .collect();
        for ln_weight in [0, 6] {
            p[ln_weight] = p[ln_weight].affine(1.0, 1.0).unwrap();
        }
        p
    }

    fn build(p: &[Tensor], n_head: usize) -> Block {
        let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
        Block::new(
            LayerNorm::new(p[0].clone(), p[1].clone()).unwrap(),
            Attention::new(linear(2), linear(4), n_head).unwrap(),
            LayerNorm::new(p[6].clone(), p[7].clone()).unwrap(),
            Mlp::new(linear(8), linear(10)).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn matches_candle_autograd() {
        check_multi_head_layer("Block", params, build, oracle::block);
    }

    #[test]
    fn parameter_names_follow_hugging_face() {
        let names: Vec<String> = build(&params(4, DType::F64), 2)
            .parameters()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            names,
            [
                "ln_1.weight",
                "ln_1.bias",
                "attn.c_attn.weight",
                "attn.c_attn.bias",
                "attn.c_proj.weight",
                "attn.c_proj.bias",
                "ln_2.weight",
                "ln_2.bias",
                "mlp.c_fc.weight",
                "mlp.c_fc.bias",
                "mlp.c_proj.weight",
                "mlp.c_proj.bias",
            ]
        );
    }
}
