//! [`StageModel`]: what one pipeline stage of a GPT holds — an optional [`Embedding`] (first
//! stage), a run of consecutive [`Block`]s (possibly none), an optional [`Head`] (last stage) —
//! with the split backward of [`crate::layers`] chained through its layers.
//!
//! **Parameter order** (of [`StageModel::parameters`], of the gradients of
//! [`StageModel::backward_weight`], and of [`StageModel::set_parameters`]): `transformer.wte.weight`,
//! `transformer.wpe.weight` (if the stage has the embedding); then for each block `i` in order
//! its 12 parameters `transformer.h.{i}.*` in [`Block`] order; then `transformer.ln_f.weight`,
//! `transformer.ln_f.bias`, `lm_head.weight` (if it has the head). Names and layouts are those
//! of Hugging Face's `GPT2LMHeadModel` (with an untied `lm_head`), `i` being the global index.
//!
//! **Recomputation.** With `recompute` on, the forward keeps only the stage input and the input
//! backward re-runs the forward to rebuild the saved state first. The forward is deterministic,
//! so the gradients are bit-identical to those with recomputation off. Per forward, a plan's
//! `recompute` pass drops a saved state to its input ([`StageModel::checkpoint`]) and rebuilds it
//! before the backward ([`StageModel::recompute_state`]); its `offload` pass moves a saved state to
//! host memory and back ([`StageSaved::to_host`], [`HostSaved::to_device`]); see `residency.rs`.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{DType, Tensor};

use crate::check;
use crate::config::GptConfig;
use crate::error::{KernelError, Result};
use crate::init::{block_prefix, ParameterFactory};
use crate::layers::block::{BlockPendingWeightGrad, BlockSaved};
use crate::layers::embedding::{EmbeddingPendingWeightGrad, EmbeddingSaved};
use crate::layers::head::{HeadPendingWeightGrad, HeadSaved};
use crate::layers::{
    held_bytes, held_tensors, Block, Embedding, Head, Layer, NamedParameters, ParameterSlots,
};
use crate::primitives::{CpuPrimitives, Primitives};

const LAYER: &str = "StageModel";
const EMBEDDING_LOCATION: &str = "transformer.wte/wpe";
const HEAD_LOCATION: &str = "transformer.ln_f/lm_head";

/// Which part of the model a stage holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageLayout {
    has_embedding: bool,
    blocks: Range<usize>,
    has_head: bool,
}

impl StageLayout {
    /// A stage with the embedding (if `has_embedding`), the blocks with global indices
    /// `blocks` (within `0..n_layer`, possibly empty) and the head (if `has_head`).
    pub fn new(
        config: &GptConfig,
        has_embedding: bool,
        blocks: Range<usize>,
        has_head: bool,
    ) -> Result<Self> {
        if blocks.start > blocks.end || blocks.end > config.n_layer() {
            return Err(KernelError::InvalidArgument {
                field: "blocks",
                value: format!("{blocks:?}"),
                reason: "must be an ascending range within 0..n_layer",
            });
        }
        Ok(StageLayout {
            has_embedding,
            blocks,
            has_head,
        })
    }

    /// The whole model in one stage.
    pub fn whole_model(config: &GptConfig) -> Self {
        StageLayout {
            has_embedding: true,
            blocks: 0..config.n_layer(),
            has_head: true,
        }
    }

    /// Whether the stage holds the embedding (and so takes token ids).
    pub fn has_embedding(&self) -> bool {
        self.has_embedding
    }

    /// The global indices of the stage's blocks.
    pub fn blocks(&self) -> Range<usize> {
        self.blocks.clone()
    }

    /// Whether the stage holds the head (and so returns logits).
    pub fn has_head(&self) -> bool {
        self.has_head
    }
}

/// One pipeline stage of a GPT: optional embedding, blocks, optional head.
#[derive(Debug, Clone)]
pub struct StageModel {
    config: GptConfig,
    layout: StageLayout,
    dtype: DType,
    recompute: bool,
    ops: Arc<dyn Primitives>,
    embedding: Option<Embedding>,
    blocks: Vec<Block>,
    head: Option<Head>,
}

/// One entry per layer of a stage, in forward order: the layers' saved states or their pending
/// weight-gradient states.
#[derive(Debug)]
struct PerLayer<E, B, H> {
    embedding: Option<E>,
    blocks: Vec<B>,
    head: Option<H>,
}

impl<E, B, H> PerLayer<E, B, H> {
    fn empty() -> Self {
        PerLayer {
            embedding: None,
            blocks: Vec::new(),
            head: None,
        }
    }

    /// Whether there is an embedding entry, the number of block entries, whether there is a head
    /// entry.
    fn layout(&self) -> (bool, usize, bool) {
        let (embedding, head) = (self.embedding.is_some(), self.head.is_some());
        (embedding, self.blocks.len(), head)
    }
}

/// The saved states of every layer of a stage, in forward order.
type LayerStates = PerLayer<EmbeddingSaved, BlockSaved, HeadSaved>;

#[derive(Debug)]
enum SavedKind {
    Full(LayerStates),
    InputOnly(Tensor),
}

/// What [`StageModel::forward`] keeps: every layer's state, or (recomputing) only the input.
#[derive(Debug)]
pub struct StageSaved {
    kind: SavedKind,
}

/// What [`StageModel::backward_weight`] needs, per layer.
#[derive(Debug)]
pub struct StagePendingWeightGrad {
    layers: PerLayer<EmbeddingPendingWeightGrad, BlockPendingWeightGrad, HeadPendingWeightGrad>,
}

held_tensors!(mut PerLayer<E, B, H> { embedding, blocks, head });
held_tensors!(mut StageSaved { kind });
held_tensors!(StagePendingWeightGrad { layers });

held_tensors!(mut enum SavedKind { Full(states), InputOnly(input) });

impl StageSaved {
    /// Bytes of the distinct tensors this state keeps for the backward (activation memory).
    pub fn held_bytes(&self) -> usize {
        held_bytes(self)
    }
}

impl StagePendingWeightGrad {
    /// Bytes of the distinct tensors kept until the weight gradient.
    pub fn held_bytes(&self) -> usize {
        held_bytes(self)
    }
}

impl StageModel {
    /// A stage of `config` holding `layout`, GPT-2-initialised from `seed` in `dtype` (F32 or
    /// F64), on the CPU primitives, with recomputation off.
    pub fn new(config: GptConfig, layout: StageLayout, seed: u64, dtype: DType) -> Result<Self> {
        Self::with_primitives(config, layout, seed, dtype, Arc::new(CpuPrimitives::new()))
    }

    /// As [`StageModel::new`], on the given primitive ops.
    pub fn with_primitives(
        config: GptConfig,
        layout: StageLayout,
        seed: u64,
        dtype: DType,
        ops: Arc<dyn Primitives>,
    ) -> Result<Self> {
        check_dtype(dtype)?;
        StageLayout::new(
            &config,
            layout.has_embedding,
            layout.blocks(),
            layout.has_head,
        )?;
        let factory = ParameterFactory::new(ops.as_ref(), seed, dtype);
        let embedding = match layout.has_embedding {
            true => Some(factory.embedding(&config)?),
            false => None,
        };
        let blocks = layout
            .blocks()
            .map(|index| factory.block(&config, index))
            .collect::<Result<Vec<_>>>()?;
        let head = match layout.has_head {
            true => Some(factory.head(&config)?),
            false => None,
        };
        Ok(StageModel {
            config,
            layout,
            dtype,
            recompute: false,
            ops,
            embedding,
            blocks,
            head,
        })
    }

    /// The same stage with recomputation on or off.
    pub fn with_recompute(mut self, recompute: bool) -> Self {
        self.recompute = recompute;
        self
    }

    /// Turns recomputation on or off for later forwards.
    pub fn set_recompute(&mut self, recompute: bool) {
        self.recompute = recompute;
    }

    /// Whether the forward keeps only the input and the backward recomputes.
    pub fn recompute(&self) -> bool {
        self.recompute
    }

    /// The model's configuration.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Which part of the model this stage holds.
    pub fn layout(&self) -> &StageLayout {
        &self.layout
    }

    /// The element type of parameters and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The primitive ops the stage runs on.
    pub fn primitives(&self) -> &dyn Primitives {
        self.ops.as_ref()
    }

    /// Runs the stage on token ids `[B, T]` (U32, first stage) or hidden states `[B, T, d]`;
    /// returns logits `[B, T, V]` (last stage) or hidden states `[B, T, d]`.
    pub fn forward(&self, input: &Tensor) -> Result<(Tensor, StageSaved)> {
        if self.recompute {
            let output = self.run_layers(input, false)?.0;
            let kind = SavedKind::InputOnly(input.clone());
            return Ok((output, StageSaved { kind }));
        }
        let (output, states) = self.run_layers(input, true)?;
        Ok((
            output,
            StageSaved {
                kind: SavedKind::Full(states),
            },
        ))
    }

    /// Gradient w.r.t. the stage input (`None` for token ids) from the output gradient.
    pub fn backward_input(
        &self,
        saved: StageSaved,
        grad_output: &Tensor,
    ) -> Result<(Option<Tensor>, StagePendingWeightGrad)> {
        let states = match saved.kind {
            SavedKind::Full(states) => states,
            SavedKind::InputOnly(input) => self.run_layers(&input, true)?.1,
        };
        self.check_layer_count("saved", states.layout())?;
        let ops = self.ops.as_ref();
        let mut grad = grad_output.clone();
        let head = match (&self.head, states.head) {
            (Some(layer), Some(saved)) => Some(backward_input_at(
                ops,
                layer,
                saved,
                &mut grad,
                HEAD_LOCATION,
            )?),
            _ => None,
        };
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for (offset, (layer, saved)) in self.blocks.iter().zip(states.blocks).enumerate().rev() {
            let location = self.block_location(offset);
            blocks.push(backward_input_at(ops, layer, saved, &mut grad, &location)?);
        }
        blocks.reverse();
        let (grad_input, embedding) = match (&self.embedding, states.embedding) {
            (Some(layer), Some(saved)) => {
                let ((), pending) = layer
                    .backward_input(ops, saved, &grad)
                    .map_err(|e| e.at(EMBEDDING_LOCATION))?;
                (None, Some(pending))
            }
            _ => (Some(grad), None),
        };
        let layers = PerLayer {
            embedding,
            blocks,
            head,
        };
        Ok((grad_input, StagePendingWeightGrad { layers }))
    }

    /// The weight gradients, one per parameter in the order of [`StageModel::parameters`].
    pub fn backward_weight(&self, pending: StagePendingWeightGrad) -> Result<Vec<Tensor>> {
        let pending = pending.layers;
        self.check_layer_count("pending", pending.layout())?;
        let ops = self.ops.as_ref();
        let mut grads = Vec::new();
        if let (Some(layer), Some(pending)) = (&self.embedding, pending.embedding) {
            let layer_grads = layer.backward_weight(ops, pending);
            grads.extend(layer_grads.map_err(|e| e.at(EMBEDDING_LOCATION))?);
        }
        for (offset, (layer, pending)) in self.blocks.iter().zip(pending.blocks).enumerate() {
            let layer_grads = layer.backward_weight(ops, pending);
            grads.extend(layer_grads.map_err(|e| e.at(self.block_location(offset)))?);
        }
        if let (Some(layer), Some(pending)) = (&self.head, pending.head) {
            let layer_grads = layer.backward_weight(ops, pending);
            grads.extend(layer_grads.map_err(|e| e.at(HEAD_LOCATION))?);
        }
        Ok(grads)
    }

    /// The parameters with their Hugging Face `GPT2LMHeadModel` names, in order.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut params = Vec::new();
        if let Some(embedding) = &self.embedding {
            embedding.push_parameters("transformer", &mut params);
        }
        for (offset, block) in self.blocks.iter().enumerate() {
            block.push_parameters(&self.block_location(offset), &mut params);
        }
        if let Some(head) = &self.head {
            params.extend(head.parameters().into_iter().map(|(name, tensor)| {
                match name.starts_with("ln_f.") {
                    true => (format!("transformer.{name}"), tensor),
                    false => (name, tensor),
                }
            }));
        }
        params
    }

    /// The parameter names, in order.
    pub fn parameter_names(&self) -> Vec<String> {
        self.parameters()
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// Replaces every parameter (e.g. after an optimiser step or from a checkpoint), in the
    /// order of [`StageModel::parameters`]; each must keep its shape and dtype. On error
    /// nothing is replaced.
    pub fn set_parameters(&mut self, values: Vec<Tensor>) -> Result<()> {
        let current = self.parameters();
        if values.len() != current.len() {
            return Err(KernelError::ParameterCount {
                layer: LAYER,
                actual: values.len(),
                expected: current.len(),
            });
        }
        for ((name, old), new) in current.iter().zip(&values) {
            check::named(LAYER, "parameter", new)
                .shaped_like(old.dims(), self.dtype)
                .map_err(|e| e.at(name))?;
        }
        let mut slots = Vec::new();
        self.embedding.push_slots(&mut slots);
        self.blocks.push_slots(&mut slots);
        self.head.push_slots(&mut slots);
        for (slot, value) in slots.into_iter().zip(values) {
            *slot = value;
        }
        Ok(())
    }

    /// The GPT-2 name of the stage's block at `offset` (its global index is shifted).
    fn block_location(&self, offset: usize) -> String {
        block_prefix(self.layout.blocks.start + offset)
    }

    /// Fails unless a saved or pending state has one entry per layer of this stage.
    fn check_layer_count(
        &self,
        field: &'static str,
        (has_embedding, blocks, has_head): (bool, usize, bool),
    ) -> Result<()> {
        let matches = has_embedding == self.embedding.is_some()
            && blocks == self.blocks.len()
            && has_head == self.head.is_some();
        if matches {
            return Ok(());
        }
        Err(KernelError::InvalidArgument {
            field,
            value: format!(
                "state of (embedding: {has_embedding}, blocks: {blocks}, head: {has_head})"
            ),
            reason: "was produced by a stage with another layout",
        })
    }

    /// Checks the stage input: token ids for a first stage, else hidden states `[B, T, d]`.
    fn check_input(&self, input: &Tensor) -> Result<()> {
        if self.embedding.is_some() {
            return Ok(()); // the embedding checks its ids itself
        }
        let checked = check::named(LAYER, "input", input);
        checked.rank_is(3, "[B, T, d] hidden states")?;
        checked.width_and_dtype(self.config.d_model(), self.dtype)?;
        checked.non_empty()?;
        let seq_len = input.dims()[1];
        if seq_len > self.config.max_seq_len() {
            return Err(KernelError::SequenceTooLong {
                layer: LAYER,
                seq_len,
                max_seq_len: self.config.max_seq_len(),
            });
        }
        Ok(())
    }

    /// The forward through every layer; keeps the layer states only if `keep_states`.
    fn run_layers(&self, input: &Tensor, keep_states: bool) -> Result<(Tensor, LayerStates)> {
        self.check_input(input)?;
        let ops = self.ops.as_ref();
        let mut states = LayerStates::empty();
        let mut hidden = input.clone();
        if let Some(embedding) = &self.embedding {
            let saved = forward_at(ops, embedding, &mut hidden, EMBEDDING_LOCATION)?;
            states.embedding = keep_states.then_some(saved);
        }
        for (offset, block) in self.blocks.iter().enumerate() {
            let saved = forward_at(ops, block, &mut hidden, &self.block_location(offset))?;
            if keep_states {
                states.blocks.push(saved);
            }
        }
        if let Some(head) = &self.head {
            let saved = forward_at(ops, head, &mut hidden, HEAD_LOCATION)?;
            states.head = keep_states.then_some(saved);
        }
        Ok((hidden, states))
    }
}

/// `layer`'s forward on `hidden`, which becomes the output; errors located at `location`.
fn forward_at<L: Layer>(
    ops: &dyn Primitives,
    layer: &L,
    hidden: &mut Tensor,
    location: &str,
) -> Result<L::Saved> {
    let (output, saved) = layer.forward(ops, hidden).map_err(|e| e.at(location))?;
    *hidden = output;
    Ok(saved)
}

/// `layer`'s input backward from `grad`, which becomes the input gradient; errors located at
/// `location`.
fn backward_input_at<L: Layer<InputGrad = Tensor>>(
    ops: &dyn Primitives,
    layer: &L,
    saved: L::Saved,
    grad: &mut Tensor,
    location: &str,
) -> Result<L::PendingWeightGrad> {
    let (grad_input, pending) = layer
        .backward_input(ops, saved, grad)
        .map_err(|e| e.at(location))?;
    *grad = grad_input;
    Ok(pending)
}

fn check_dtype(dtype: DType) -> Result<()> {
    if matches!(dtype, DType::F32 | DType::F64) {
        return Ok(());
    }
    Err(KernelError::InvalidArgument {
        field: "dtype",
        value: format!("{dtype:?}"),
        reason: "StageModel supports F32 and F64",
    })
}

mod residency;
#[cfg(test)]
mod tests;

pub use residency::HostSaved;
