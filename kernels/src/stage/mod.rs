//! [`StageModel`]: what one pipeline stage of a GPT holds — a run of consecutive layers of the
//! model ([`crate::layers::model_layers`]: the [`crate::Embedding`] on the first stage, the
//! [`crate::Block`]s, the [`crate::Head`] on the last; possibly none) — with the split backward
//! of [`crate::layers`] chained through its layers. The stage names no layer kind: it runs the
//! registered kinds through one dispatching enum (`layers/model.rs`).
//!
//! **Parameter order** (of [`StageModel::parameters`], of the gradients of
//! [`StageModel::backward_weight`], and of [`StageModel::set_parameters`]): the layers' in model
//! order, each layer's in its own order: `transformer.wte.weight`, `transformer.wpe.weight` (if
//! the stage has the embedding); then for each block `i` in order its 12 parameters
//! `transformer.h.{i}.*` in [`crate::Block`] order; then `transformer.ln_f.weight`,
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
use crate::init::ParameterFactory;
use crate::layers::{
    held_bytes, held_tensors, model_layers, AnyLayer, AnyPending, AnySaved, LayerId, LayerInput,
    LayerKind, ParameterSlots, Placement,
};
use crate::primitives::{CpuPrimitives, Primitives};
use crate::sequence::{ChunkAt, ChunkMemory, SequenceState};

const LAYER: &str = "StageModel";

/// Which part of the model a stage holds: a run of consecutive layers of the model's list
/// ([`model_layers`]: the embedding, the blocks, the head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageLayout {
    span: Range<usize>,
    layers: Vec<LayerId>,
    /// Whether the span ends the model (its output is the logits).
    ends_model: bool,
}

impl StageLayout {
    /// A stage holding the layers `span` of the model's list ([`model_layers`]; within
    /// `0..len`, possibly empty).
    pub fn new(config: &GptConfig, span: Range<usize>) -> Result<Self> {
        let model = model_layers(config);
        if span.start > span.end || span.end > model.len() {
            return Err(KernelError::InvalidArgument {
                field: "layers",
                value: format!("{span:?}"),
                reason: "must be an ascending range within the model's layers",
            });
        }
        Ok(StageLayout {
            ends_model: span.end == model.len(),
            layers: model[span.clone()].to_vec(),
            span,
        })
    }

    /// The whole model in one stage.
    pub fn whole_model(config: &GptConfig) -> Self {
        let layers = model_layers(config);
        StageLayout {
            span: 0..layers.len(),
            layers,
            ends_model: true,
        }
    }

    /// The indices of the stage's layers in the model's list.
    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }

    /// The stage's layers, in order.
    pub fn layers(&self) -> &[LayerId] {
        &self.layers
    }

    /// How many of its layers are free ([`Placement::Any`]: the blocks).
    pub fn free_layers(&self) -> usize {
        let free = |id: &&LayerId| id.placement() == Placement::Any;
        self.layers.iter().filter(free).count()
    }

    /// What the stage takes: what its first layer takes (hidden states where it has none).
    pub fn input(&self) -> LayerInput {
        self.layers
            .first()
            .map_or(LayerInput::Hidden, |id| id.input())
    }

    /// Whether the stage holds the model's last layer, and so returns the logits the loss reads.
    pub fn ends_model(&self) -> bool {
        self.ends_model
    }
}

/// One pipeline stage of a GPT: a run of the model's layers.
#[derive(Debug, Clone)]
pub struct StageModel {
    config: GptConfig,
    layout: StageLayout,
    dtype: DType,
    recompute: bool,
    ops: Arc<dyn Primitives>,
    /// One per entry of the layout, in order.
    layers: Vec<AnyLayer>,
}

#[derive(Debug)]
enum SavedKind {
    /// Every layer's saved state, in forward order.
    Full(Vec<AnySaved>),
    InputOnly(Tensor),
}

/// What [`StageModel::forward`] keeps: every layer's state, or (recomputing) only the input.
#[derive(Debug)]
pub struct StageSaved {
    kind: SavedKind,
}

/// What [`StageModel::backward_weight`] needs, per layer in forward order.
#[derive(Debug)]
pub struct StagePendingWeightGrad {
    layers: Vec<AnyPending>,
}

held_tensors!(mut StageSaved { kind });
held_tensors!(mut StagePendingWeightGrad { layers });

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
        // The layout read against this model (it may have been made for another).
        let layout = StageLayout::new(&config, layout.span())?;
        let factory = ParameterFactory::new(ops.as_ref(), seed, dtype);
        let layers = layout
            .layers()
            .iter()
            .map(|id| id.kind().build(&factory, &config, id.index()))
            .collect::<Result<Vec<_>>>()?;
        Ok(StageModel {
            config,
            layout,
            dtype,
            recompute: false,
            ops,
            layers,
        })
    }

    /// The same stage with recomputation on or off.
    pub fn with_recompute(mut self, recompute: bool) -> Self {
        self.recompute = recompute;
        self
    }

    /// The same stage as the expert-parallel rank of `placement` runs it: its mixtures of
    /// experts hold and run that rank's experts only, exchanging their rows with its group
    /// ([`crate::ExpertPlacement`]); its parameters and weight gradients are then the other
    /// layers' and those experts'. A stage without a mixture is unchanged.
    pub fn with_experts(self, placement: &crate::ExpertPlacement) -> Result<Self> {
        let layers = self
            .layers
            .into_iter()
            .map(|layer| layer.with_experts(placement))
            .collect::<Result<Vec<_>>>()?;
        Ok(StageModel { layers, ..self })
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
        self.forward_in(input, None)
    }

    /// [`StageModel::forward`] of one chunk of a sequence ([`crate::sequence`]): `input` holds
    /// its positions `at.start..`, `state` what the stage keeps of its group's earlier chunks
    /// (the chunks of a group run their forwards in order).
    pub fn forward_chunk(
        &self,
        input: &Tensor,
        at: ChunkAt,
        state: &mut SequenceState,
    ) -> Result<(Tensor, StageSaved)> {
        self.forward_in(input, Some((at, state)))
    }

    fn forward_in(
        &self,
        input: &Tensor,
        chunk: Option<(ChunkAt, &mut SequenceState)>,
    ) -> Result<(Tensor, StageSaved)> {
        if self.recompute {
            let output = self.run_layers(input, false, chunk)?.0;
            let kind = SavedKind::InputOnly(input.clone());
            return Ok((output, StageSaved { kind }));
        }
        let (output, states) = self.run_layers(input, true, chunk)?;
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
        self.backward_input_in(saved, grad_output, None)
    }

    /// [`StageModel::backward_input`] of one chunk of a sequence (the chunks of a group run
    /// theirs last first), with the `state` its forward used.
    pub fn backward_input_chunk(
        &self,
        saved: StageSaved,
        grad_output: &Tensor,
        at: ChunkAt,
        state: &mut SequenceState,
    ) -> Result<(Option<Tensor>, StagePendingWeightGrad)> {
        self.backward_input_in(saved, grad_output, Some((at, state)))
    }

    fn backward_input_in(
        &self,
        saved: StageSaved,
        grad_output: &Tensor,
        mut chunk: Option<(ChunkAt, &mut SequenceState)>,
    ) -> Result<(Option<Tensor>, StagePendingWeightGrad)> {
        let states = match saved.kind {
            SavedKind::Full(states) => states,
            SavedKind::InputOnly(input) => {
                let again = chunk.as_mut().map(|(at, state)| (*at, &mut **state));
                self.run_layers(&input, true, again)?.1
            }
        };
        let mut memories = chunk.map(|(at, state)| (at, state.layers_mut()));
        self.check_states("saved", states.iter().map(AnySaved::kind))?;
        let ops = self.ops.as_ref();
        let mut grad = Some(grad_output.clone());
        let mut pending = Vec::with_capacity(self.layers.len());
        for (k, ((id, layer), saved)) in self.located().zip(states).enumerate().rev() {
            // Only a layer taking token ids hands no gradient back, and it comes first.
            let grad_output = grad.take().ok_or_else(|| KernelError::InvalidArgument {
                field: "layout",
                value: id.label(),
                reason: "follows a layer whose input has no gradient",
            })?;
            let memory = layer_memory(&mut memories, k)?;
            let (grad_input, state) = layer
                .backward_input(ops, saved, &grad_output, memory)
                .map_err(|e| e.at(id.location()))?;
            grad = grad_input;
            pending.push(state);
        }
        pending.reverse();
        Ok((grad, StagePendingWeightGrad { layers: pending }))
    }

    /// The weight gradients, one per parameter in the order of [`StageModel::parameters`].
    pub fn backward_weight(&self, pending: StagePendingWeightGrad) -> Result<Vec<Tensor>> {
        let pending = pending.layers;
        self.check_states("pending", pending.iter().map(AnyPending::kind))?;
        let ops = self.ops.as_ref();
        let mut grads = Vec::new();
        for ((id, layer), pending) in self.located().zip(pending) {
            let layer_grads = layer.backward_weight(ops, pending);
            grads.extend(layer_grads.map_err(|e| e.at(id.location()))?);
        }
        Ok(grads)
    }

    /// The parameters with their Hugging Face `GPT2LMHeadModel` names, in order.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut params = Vec::new();
        for (id, layer) in self.located() {
            layer.push_model_parameters(id.index(), &mut params);
        }
        params
    }

    /// The names and shapes of the parameters a stage of `config` holding `layout` has, in the
    /// order of [`StageModel::parameters`], without drawing or keeping their values (what a
    /// checkpoint of the model holds).
    pub fn parameter_shapes(
        config: &GptConfig,
        layout: &StageLayout,
    ) -> Result<Vec<(String, Vec<usize>)>> {
        let ops = CpuPrimitives::new();
        let factory = ParameterFactory::shapes_only(&ops, DType::F32);
        let layout = StageLayout::new(config, layout.span())?;
        let mut params = Vec::new();
        for &id in layout.layers() {
            let layer = id.kind().build(&factory, config, id.index())?;
            layer.push_model_parameters(id.index(), &mut params);
        }
        let shapes = params
            .into_iter()
            .map(|(name, t)| (name, t.dims().to_vec()));
        Ok(shapes.collect())
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
        self.layers.push_slots(&mut slots);
        for (slot, value) in slots.into_iter().zip(values) {
            *slot = value;
        }
        Ok(())
    }

    /// Every layer with its place in the model.
    fn located(&self) -> impl DoubleEndedIterator<Item = (LayerId, &AnyLayer)> + ExactSizeIterator {
        self.layout.layers().iter().copied().zip(&self.layers)
    }

    /// Fails unless a saved or pending state has one entry per layer of this stage, each of
    /// the layer's kind.
    fn check_states(
        &self,
        field: &'static str,
        kinds: impl Iterator<Item = LayerKind>,
    ) -> Result<()> {
        let kinds: Vec<LayerKind> = kinds.collect();
        if kinds
            .iter()
            .copied()
            .eq(self.layers.iter().map(AnyLayer::kind))
        {
            return Ok(());
        }
        let names: Vec<&str> = kinds.iter().map(|kind| kind.name()).collect();
        Err(KernelError::InvalidArgument {
            field,
            value: format!("state of layers [{}]", names.join(", ")),
            reason: "was produced by a stage with another layout",
        })
    }

    /// Checks the stage input (a chunk's from position `start`): token ids for a first stage,
    /// else hidden states `[B, T, d]`.
    fn check_input(&self, input: &Tensor, start: usize) -> Result<()> {
        if self.layout.input() == LayerInput::TokenIds {
            return Ok(()); // the first layer checks its ids itself
        }
        let checked = check::named(LAYER, "input", input);
        checked.rank_is(3, "[B, T, d] hidden states")?;
        checked.width_and_dtype(self.config.d_model(), self.dtype)?;
        checked.non_empty()?;
        let seq_len = start + input.dims()[1];
        if seq_len > self.config.max_seq_len() {
            return Err(KernelError::SequenceTooLong {
                layer: LAYER,
                seq_len,
                max_seq_len: self.config.max_seq_len(),
            });
        }
        Ok(())
    }

    /// The forward through every layer (of a sequence chunk where `chunk` says); keeps the
    /// layer states only if `keep_states`.
    fn run_layers(
        &self,
        input: &Tensor,
        keep_states: bool,
        chunk: Option<(ChunkAt, &mut SequenceState)>,
    ) -> Result<(Tensor, Vec<AnySaved>)> {
        self.check_input(input, chunk.as_ref().map_or(0, |(at, _)| at.start))?;
        let ops = self.ops.as_ref();
        let mut states = Vec::with_capacity(if keep_states { self.layers.len() } else { 0 });
        let mut hidden = input.clone();
        let mut memories = chunk.map(|(at, state)| (at, state.layers_mut()));
        for (k, (id, layer)) in self.located().enumerate() {
            let memory = layer_memory(&mut memories, k)?;
            let (output, saved) = layer
                .forward(ops, &hidden, memory)
                .map_err(|e| e.at(id.location()))?;
            hidden = output;
            if keep_states {
                states.push(saved);
            }
        }
        Ok((hidden, states))
    }
}

/// Layer `k`'s memory of a sequence chunk's group, where the stage runs a chunk: an error where
/// the state was made for a stage of fewer layers.
fn layer_memory<'a>(
    memories: &'a mut Option<(ChunkAt, &mut [ChunkMemory])>,
    k: usize,
) -> Result<Option<(ChunkAt, &'a mut ChunkMemory)>> {
    match memories {
        None => Ok(None),
        Some((at, layers)) => {
            let count = layers.len();
            let memory = layers.get_mut(k).ok_or(KernelError::InvalidArgument {
                field: "sequence state",
                value: format!("{count} layer(s)"),
                reason: "was made for a stage of other layers",
            })?;
            Ok(Some((*at, memory)))
        }
    }
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

#[cfg(test)]
mod chunk_tests;
mod residency;
#[cfg(test)]
mod tests;

pub use residency::{HostCopy, HostPending, HostSaved};
