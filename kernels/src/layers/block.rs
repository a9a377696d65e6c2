//! [`PreNormBlock`]: GPT-2's pre-norm transformer block, `h = x + attn(ln_1(x))`, then
//! `y = h + ff(ln_2(h))`, generic over its feed-forward sub-layer `ff` ([`FeedForward`]):
//! [`Block`], GPT-2's block, with an [`Mlp`]; [`super::MoeBlock`], with a mixture of experts
//! (a model's blocks are one or the other: [`GptConfig::moe`]). The passes, the parameters and
//! the construction are written once here; each block's file says what is its own (its model
//! layer, and for the mixture its load-balancing loss and expert shards).
//!
//! [`Block`]'s parameters, in order (Hugging Face's `GPT2Block` order): `ln_1.weight`,
//! `ln_1.bias`, `attn.c_attn.weight`, `attn.c_attn.bias`, `attn.c_proj.weight`,
//! `attn.c_proj.bias`, `ln_2.weight`, `ln_2.bias`, `mlp.c_fc.weight`, `mlp.c_fc.bias`,
//! `mlp.c_proj.weight`, `mlp.c_proj.bias`: any block's are those of `ln_1`, `attn` and `ln_2`,
//! then its feed-forward's under its name ([`FeedForward::NAME`]).

use std::fmt::Debug;

use candle_core::{DType, Tensor};

use super::attention::Attention;
use super::attention::{AttentionPendingWeightGrad, AttentionSaved};
use super::layer_norm::LayerNorm;
use super::layer_norm::{LayerNormPendingWeightGrad, LayerNormSaved};
use super::linear::Linear;
use super::mlp::Mlp;
use super::mlp::{MlpPendingWeightGrad, MlpSaved};
use super::model::{KindDescription, ModelLayer, Placement};
use super::protocol::{chunked_passes, concat_grads, held_tensors, joined, Layer};
use super::protocol::{NamedParameters, ParameterSlots};
use crate::check;
use crate::config::GptConfig;
use crate::error::Result;
use crate::flops::passes::{block_flops, PassFlops};
use crate::init::{ParameterFactory, INIT_STD};
use crate::primitives::Primitives;
use crate::sequence::Chunk;

/// The feed-forward half of a [`PreNormBlock`]: GPT-2's [`Mlp`], or a mixture of experts.
pub trait FeedForward: Layer<InputGrad = Tensor> + Clone + Debug {
    /// The block's name in errors (`Block`).
    const BLOCK: &'static str;
    /// The sub-layer's name in the block, the prefix of its parameters (`mlp`).
    const NAME: &'static str;

    /// The linear that reads the block's normed hidden state (an MLP's `c_fc`, a mixture's
    /// router), with its weight's name in the block (`mlp.c_fc.weight`), which names the
    /// sub-layer in errors: its width and dtype are the sub-layer's, which must be the block's.
    fn input(&self) -> (&'static str, &Linear);
}

/// A pre-norm transformer block whose feed-forward half is an `F`.
#[derive(Debug, Clone)]
pub struct PreNormBlock<F> {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    feed_forward: F,
}

/// What [`PreNormBlock::forward`] keeps, its feed-forward's state an `S`.
#[derive(Debug)]
pub struct PreNormSaved<S> {
    ln_1: LayerNormSaved,
    attn: AttentionSaved,
    ln_2: LayerNormSaved,
    feed_forward: S,
}

/// What [`PreNormBlock::backward_weight`] needs, its feed-forward's pending state a `P`.
#[derive(Debug)]
pub struct PreNormPending<P> {
    ln_1: LayerNormPendingWeightGrad,
    attn: AttentionPendingWeightGrad,
    ln_2: LayerNormPendingWeightGrad,
    feed_forward: P,
}

/// GPT-2's pre-norm transformer block.
pub type Block = PreNormBlock<Mlp>;
/// What a [`Block`]'s forward keeps.
pub type BlockSaved = PreNormSaved<MlpSaved>;
/// What a [`Block`]'s weight backward needs.
pub type BlockPendingWeightGrad = PreNormPending<MlpPendingWeightGrad>;

impl<S> PreNormSaved<S> {
    /// The feed-forward's state.
    pub fn feed_forward(&self) -> &S {
        &self.feed_forward
    }
}

impl<F: FeedForward> PreNormBlock<F> {
    /// A block from its four sub-layers, which must agree on the width and dtype.
    pub fn new(ln_1: LayerNorm, attn: Attention, ln_2: LayerNorm, feed_forward: F) -> Result<Self> {
        let (width, dtype) = (attn.width(), attn.dtype());
        let (input_name, input) = feed_forward.input();
        for (name, features, layer_dtype) in [
            ("ln_1.weight", ln_1.features(), ln_1.dtype()),
            ("ln_2.weight", ln_2.features(), ln_2.dtype()),
            (input_name, input.in_features(), input.dtype()),
        ] {
            check_agrees(F::BLOCK, name, (features, layer_dtype), (width, dtype))?;
        }
        Ok(PreNormBlock {
            ln_1,
            attn,
            ln_2,
            feed_forward,
        })
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.attn.width()
    }

    /// The element type of the parameters (and of the activations), which the sub-layers share.
    pub fn dtype(&self) -> DType {
        self.ln_1.dtype()
    }

    /// The feed-forward sub-layer.
    pub fn feed_forward(&self) -> &F {
        &self.feed_forward
    }

    /// The same block with `feed_forward` in place of its own (of the same width and dtype).
    pub(super) fn with_feed_forward(&self, feed_forward: F) -> Self {
        PreNormBlock {
            feed_forward,
            ..self.clone()
        }
    }

    /// Block `index` of the model of `config`, GPT-2-initialised: layer norms weight 1 and bias
    /// 0, linear biases 0, linear weights drawn `N(0, 0.02²)`, `attn.c_proj.weight`
    /// `N(0, (0.02 / √(2·n_layer))²)`; its feed-forward made by `feed_forward` from its
    /// parameters' prefix (`transformer.h.{index}.mlp`) and that residual standard deviation.
    pub(super) fn build_with(
        factory: &ParameterFactory<'_>,
        config: &GptConfig,
        index: usize,
        feed_forward: impl FnOnce(&str, f64) -> Result<F>,
    ) -> Result<Self> {
        let d = config.d_model();
        let prefix = location(index);
        let residual_std = INIT_STD / (2.0 * config.n_layer() as f64).sqrt();
        let c_attn = factory.linear(&format!("{prefix}.attn.c_attn"), d, 3 * d, INIT_STD)?;
        let c_proj = factory.linear(&format!("{prefix}.attn.c_proj"), d, d, residual_std)?;
        PreNormBlock::new(
            factory.layer_norm(d)?,
            Attention::new(c_attn, c_proj, config.n_head())?,
            factory.layer_norm(d)?,
            feed_forward(&format!("{prefix}.{}", F::NAME), residual_std)?,
        )
    }

    /// The forward, its attention on a sequence chunk where `chunk` says (the feed-forward
    /// takes the chunk's tokens as any input).
    fn run(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, PreNormSaved<F::Saved>)> {
        check::named(F::BLOCK, "input", input).rank_is(3, "[B, T, d]")?;
        let (hidden, ln_1, attn) = residual(ops, &self.ln_1, &self.attn, input, chunk)?;
        let (output, ln_2, feed_forward) =
            residual(ops, &self.ln_2, &self.feed_forward, &hidden, None)?;
        let saved = PreNormSaved {
            ln_1,
            attn,
            ln_2,
            feed_forward,
        };
        Ok((output, saved))
    }

    /// The input backward, its attention's of a sequence chunk where `chunk` says.
    fn run_backward(
        &self,
        ops: &dyn Primitives,
        saved: PreNormSaved<F::Saved>,
        grad_output: &Tensor,
        chunk: Chunk<'_>,
    ) -> Result<(Tensor, PreNormPending<F::PendingWeightGrad>)> {
        // The output has the shape of the hidden state `ln_2` normalised.
        check::grad_matches(F::BLOCK, grad_output, saved.ln_2.dims(), self.dtype())?;
        let ff_half = (saved.ln_2, saved.feed_forward);
        let (grad_hidden, ln_2, feed_forward) = residual_backward(
            ops,
            &self.ln_2,
            &self.feed_forward,
            ff_half,
            grad_output,
            None,
        )?;
        let attn_half = (saved.ln_1, saved.attn);
        let (grad_input, ln_1, attn) =
            residual_backward(ops, &self.ln_1, &self.attn, attn_half, &grad_hidden, chunk)?;
        let pending = PreNormPending {
            ln_1,
            attn,
            ln_2,
            feed_forward,
        };
        Ok((grad_input, pending))
    }
}

/// Fails unless a sub-layer's `(width, dtype)` (named by its first parameter) is the attention's,
/// in a block `layer`.
fn check_agrees(
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
    check::dtype_follows(layer, name, actual, (expected, "the attention's"))
}

/// `x + sub(norm(x))`, one pre-norm residual half of the block (`sub` run on a sequence chunk
/// where `chunk` says): the output and the states of `norm` and `sub`.
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

/// The input backward of [`residual`], `dx = dy + norm'(sub'(dy))`: the input gradient and the
/// pending states of `norm` and `sub`.
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

/// `transformer.h.{index}`, where block `index` (its global index) of either kind is located.
pub(super) fn location(index: usize) -> String {
    format!("transformer.h.{index}")
}

impl<F: FeedForward> Layer for PreNormBlock<F> {
    type Saved = PreNormSaved<F::Saved>;
    type PendingWeightGrad = PreNormPending<F::PendingWeightGrad>;
    type InputGrad = Tensor;

    /// The sub-layers' weight gradients, one after another.
    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: Self::PendingWeightGrad,
    ) -> Result<Vec<Tensor>> {
        Ok(concat_grads([
            self.ln_1.backward_weight(ops, pending.ln_1)?,
            self.attn.backward_weight(ops, pending.attn)?,
            self.ln_2.backward_weight(ops, pending.ln_2)?,
            self.feed_forward
                .backward_weight(ops, pending.feed_forward)?,
        ]))
    }

    chunked_passes!();
}

/// The sub-layers' parameters, each under its name in the block.
impl<F: FeedForward> NamedParameters for PreNormBlock<F> {
    fn push_parameters(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.ln_1.push_parameters(&joined(prefix, "ln_1"), out);
        self.attn.push_parameters(&joined(prefix, "attn"), out);
        self.ln_2.push_parameters(&joined(prefix, "ln_2"), out);
        self.feed_forward
            .push_parameters(&joined(prefix, F::NAME), out);
    }
}

impl<F: ParameterSlots> ParameterSlots for PreNormBlock<F> {
    fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        self.ln_1.push_slots(out);
        self.attn.push_slots(out);
        self.ln_2.push_slots(out);
        self.feed_forward.push_slots(out);
    }
}

held_tensors!(mut PreNormSaved<S> { ln_1, attn, ln_2, feed_forward });
held_tensors!(mut PreNormPending<P> { ln_1, attn, ln_2, feed_forward });

/// GPT-2's feed-forward half.
impl FeedForward for Mlp {
    const BLOCK: &'static str = "Block";
    const NAME: &'static str = "mlp";

    fn input(&self) -> (&'static str, &Linear) {
        ("mlp.c_fc.weight", self.c_fc())
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

    /// [`PreNormBlock::build_with`] an MLP of `c_fc.weight` `N(0, 0.02²)` and `c_proj.weight`
    /// `N(0, (0.02 / √(2·n_layer))²)`, biases 0.
    fn build(factory: &ParameterFactory<'_>, config: &GptConfig, index: usize) -> Result<Self> {
        let (d, hidden) = (config.d_model(), config.mlp_hidden());
        Block::build_with(factory, config, index, |prefix, residual_std| {
            factory.mlp(prefix, d, hidden, residual_std)
        })
    }

    /// `transformer.h.{index}`, `index` the block's global index.
    fn location(index: usize) -> String {
        location(index)
    }

    fn flops(config: &GptConfig, batch: usize, seq_len: usize) -> PassFlops {
        block_flops(config, batch, seq_len)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{check_multi_head_layer, random};

    /// Random parameters of a block's `ln_1`, `attn` and `ln_2` (in Hugging Face order) of width
    /// `d`: the first 8 of any block's.
    pub(crate) fn attention_params(d: usize, dtype: DType) -> Vec<Tensor> {
        let shapes: [&[usize]; 8] = [&[d], &[d], &[d, 3 * d], &[3 * d], &[d, d], &[d], &[d], &[d]];
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

    /// The block of `feed_forward` whose other sub-layers are those of `p`
    /// ([`attention_params`]) with `n_head` heads.
    pub(crate) fn pre_norm<F: FeedForward>(
        p: &[Tensor],
        n_head: usize,
        feed_forward: F,
    ) -> Result<PreNormBlock<F>> {
        let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
        PreNormBlock::new(
            LayerNorm::new(p[0].clone(), p[1].clone()).unwrap(),
            Attention::new(linear(2), linear(4), n_head).unwrap(),
            LayerNorm::new(p[6].clone(), p[7].clone()).unwrap(),
            feed_forward,
        )
    }

    /// Random block parameters (in Hugging Face order) of width `d`.
    fn params(d: usize, dtype: DType) -> Vec<Tensor> {
        let mut p = attention_params(d, dtype);
        let mlp: [&[usize]; 4] = [&[d, 4 * d], &[4 * d], &[4 * d, d], &[d]];
        for (i, shape) in mlp.iter().enumerate() {
            p.push(random(18 + i as u64, shape, 0.4, dtype));
        }
        p
    }

    fn build(p: &[Tensor], n_head: usize) -> Block {
        let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
        pre_norm(p, n_head, Mlp::new(linear(8), linear(10)).unwrap()).unwrap()
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
