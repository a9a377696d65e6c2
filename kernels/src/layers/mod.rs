//! The GPT-2 layers, one per file, the [`Layer`] protocol they share, and the model's layer
//! kinds in order ([`LayerKind`], [`model_layers`]): each model layer (the embedding, a block,
//! the head) says in its own file, beside its [`Layer`] impl, where a cut places it, what it
//! takes, how many the model has, how it is initialised and what its parameters are called
//! (`model.rs`'s `ModelLayer`), and is registered by one line of `register_layers!` below.
//! Adding a model layer is its file, its `mod` line and its registration line here; the stage,
//! the trainer's cut and its profile run every registered kind without naming one.
//!
//! The backward of every layer is split in two halves that a pipeline schedule may run at
//! different times (Zero Bubble's I and W):
//!
//! 1. [`Layer::forward`] returns the output and a `Saved` state holding what the backward needs;
//! 2. [`Layer::backward_input`] consumes that state and the output gradient, and returns the
//!    input gradient and a `PendingWeightGrad` state holding what the weight gradient needs;
//! 3. [`Layer::backward_weight`] consumes that state and returns the weight gradients, one
//!    tensor per parameter in the order of [`NamedParameters::parameters`].
//!
//! Both states are plain values with private fields, not `Clone`: each is moved into the next
//! call, so the type system forbids running a backward twice on one forward. Nothing is cached
//! inside a layer and nothing is accumulated: a caller sums the weight gradients of its
//! microbatches itself, in whatever fixed order it needs for bit-identical results.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use pipeweave_kernels::{CpuPrimitives, Layer, Linear};
//!
//! let ops = CpuPrimitives::new();
//! let layer = Linear::new(
//!     Tensor::ones((4, 3), DType::F64, &Device::Cpu)?,
//!     Tensor::zeros(3, DType::F64, &Device::Cpu)?,
//! )?;
//! let x = Tensor::ones((2, 5, 4), DType::F64, &Device::Cpu)?;
//! let (y, saved) = layer.forward(&ops, &x)?;
//! let dy = Tensor::ones(y.dims(), DType::F64, &Device::Cpu)?;
//! let (dx, pending) = layer.backward_input(&ops, saved, &dy)?; // I: now
//! let grads = layer.backward_weight(&ops, pending)?; // W: whenever the schedule says
//! assert_eq!((dx.dims(), grads.len()), (&[2, 5, 4][..], 2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A saved state cannot be used twice:
//!
//! ```compile_fail
//! # use candle_core::{DType, Device, Tensor};
//! # use pipeweave_kernels::{CpuPrimitives, Layer, Linear};
//! # let ops = CpuPrimitives::new();
//! # let w = Tensor::ones((4, 3), DType::F64, &Device::Cpu).unwrap();
//! # let layer = Linear::new(w, Tensor::zeros(3, DType::F64, &Device::Cpu).unwrap()).unwrap();
//! # let x = Tensor::ones((2, 4), DType::F64, &Device::Cpu).unwrap();
//! let (y, saved) = layer.forward(&ops, &x).unwrap();
//! let first = layer.backward_input(&ops, saved, &y);
//! let second = layer.backward_input(&ops, saved, &y); // error: use of moved value `saved`
//! ```

pub mod attention;
pub mod block;
pub mod cross_entropy;
pub mod embedding;
pub mod gelu;
pub mod head;
pub mod layer_norm;
pub mod linear;
pub mod mlp;
mod model;

pub use attention::Attention;
pub use block::Block;
pub use cross_entropy::{count_non_padding, CrossEntropy, LossOutput};
pub use embedding::Embedding;
pub use gelu::Gelu;
pub use head::Head;
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use mlp::Mlp;
pub use model::{model_layers, LayerId, LayerInput, Placement};
pub(crate) use model::{InputGradient, KindDescription, ModelLayer};

use candle_core::Tensor;

use crate::error::Result;
use crate::primitives::Primitives;
use crate::sequence::{ChunkAt, ChunkMemory};

// The model's layers, in order: one line per kind (see `model.rs`). A new layer is its own file
// (its `Layer` and `ModelLayer` impls), its `mod` line above and its line here.
model::register_layers! {
    Embedding(Embedding),
    Block(Block),
    Head(Head),
}

/// A layer whose backward is split into an input half and a weight half; its parameters are
/// those of [`NamedParameters`].
pub trait Layer: NamedParameters {
    /// What the forward keeps for the backward (consumed by [`Layer::backward_input`]).
    type Saved;
    /// What the input backward keeps for the weight backward (consumed by
    /// [`Layer::backward_weight`]).
    type PendingWeightGrad;
    /// The gradient of the input: a [`Tensor`], or `()` where the input (token ids) has none.
    type InputGrad;

    /// Runs the layer on `input`; returns the output and the state its backward needs.
    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, Self::Saved)>;

    /// Gradient of the loss w.r.t. the input, given the gradient w.r.t. the output.
    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: Self::Saved,
        grad_output: &Tensor,
    ) -> Result<(Self::InputGrad, Self::PendingWeightGrad)>;

    /// Gradients of the loss w.r.t. the parameters, in the order of
    /// [`NamedParameters::parameters`].
    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: Self::PendingWeightGrad,
    ) -> Result<Vec<Tensor>>;

    /// The forward of one chunk of a sequence ([`crate::sequence`]), at `at`, with `memory`
    /// what this layer keeps of the group's earlier chunks. A token-wise layer (the default)
    /// runs the chunk as any input.
    fn forward_chunk(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        at: ChunkAt,
        memory: &mut ChunkMemory,
    ) -> Result<(Tensor, Self::Saved)> {
        let _ = (at, memory);
        self.forward(ops, input)
    }

    /// The input backward of one chunk of a sequence (see [`Layer::forward_chunk`]); chunks run
    /// it last first.
    fn backward_input_chunk(
        &self,
        ops: &dyn Primitives,
        saved: Self::Saved,
        grad_output: &Tensor,
        at: ChunkAt,
        memory: &mut ChunkMemory,
    ) -> Result<(Self::InputGrad, Self::PendingWeightGrad)> {
        let _ = (at, memory);
        self.backward_input(ops, saved, grad_output)
    }
}

/// `prefix.name`, or `name` alone when `prefix` is empty (a top-level parameter).
pub(crate) fn joined(prefix: &str, name: &str) -> String {
    match prefix.is_empty() {
        true => name.to_string(),
        false => format!("{prefix}.{name}"),
    }
}

/// A layer's parameters with their names, in order (a [`Tensor`] is one parameter named by its
/// prefix). Implemented from one declaration per layer, `parameters!` (or `composite!`),
/// together with the crate's mutable access to them, so that names, slots and gradients cannot
/// fall out of order.
pub trait NamedParameters {
    /// Pushes every parameter, its local name prefixed with `prefix.` (unless `prefix` is empty).
    fn push_parameters(&self, prefix: &str, out: &mut Vec<(String, Tensor)>);

    /// The parameters with their names relative to the layer (e.g. `c_attn.weight`), in order:
    /// the order of [`Layer::backward_weight`]'s gradients.
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        self.push_parameters("", &mut out);
        out
    }
}

/// Mutable access to a layer's parameter tensors, in the order of
/// [`NamedParameters::parameters`], for
/// [`crate::StageModel::set_parameters`], which checks shapes and dtypes before writing.
pub(crate) trait ParameterSlots {
    /// Pushes every parameter tensor, mutably.
    fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>);
}

impl NamedParameters for Tensor {
    fn push_parameters(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        out.push((prefix.to_string(), self.clone()));
    }
}

impl ParameterSlots for Tensor {
    fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        out.push(self);
    }
}

/// Implements [`NamedParameters`] and [`ParameterSlots`] for a layer from its parameter fields in
/// order, each a tensor or a sub-layer, with its local name: `parameters!(Linear { "weight" =>
/// weight, "bias" => bias })`; and the layer's `dtype()`, its first parameter's (its constructor
/// holds the others to it).
macro_rules! parameters {
    ($layer:ty { $first_name:expr => $first:ident $(, $name:expr => $field:ident)* $(,)? }) => {
        impl $layer {
            /// The element type of the parameters (and of the activations): the first
            /// parameter's, which the others share.
            pub fn dtype(&self) -> candle_core::DType {
                self.$first.dtype()
            }
        }

        $crate::layers::parameters!(@lists $layer { $first_name => $first $(, $name => $field)* });
    };
    (@lists $layer:ty { $($name:expr => $field:ident),+ }) => {
        impl $crate::layers::NamedParameters for $layer {
            fn push_parameters(&self, prefix: &str, out: &mut Vec<(String, candle_core::Tensor)>) {
                $($crate::layers::NamedParameters::push_parameters(
                    &self.$field,
                    &$crate::layers::joined(prefix, $name),
                    out,
                );)+
            }
        }

        impl $crate::layers::ParameterSlots for $layer {
            fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                $($crate::layers::ParameterSlots::push_slots(&mut self.$field, out);)+
            }
        }
    };
}
pub(crate) use parameters;

/// Declares a composite layer from its sub-layer fields in parameter order, each also a field of
/// its pending state holding that sub-layer's: `composite!(Mlp: MlpPendingWeightGrad { c_fc,
/// c_proj })`. Implements [`NamedParameters`] and [`ParameterSlots`] (the sub-layers' parameters
/// prefixed with the field names) and the weight gradients in the same order, the sub-layers'
/// one after another, which [`composite_weights!`] makes the layer's
/// [`Layer::backward_weight`].
macro_rules! composite {
    ($layer:ident: $pending:ident { $($part:ident),+ $(,)? }) => {
        $crate::layers::parameters!($layer { $(stringify!($part) => $part),+ });

        impl $layer {
            /// The sub-layers' weight gradients, one after another.
            fn composite_backward_weight(
                &self,
                ops: &dyn $crate::primitives::Primitives,
                pending: $pending,
            ) -> $crate::error::Result<Vec<candle_core::Tensor>> {
                Ok($crate::layers::concat_grads([
                    $($crate::layers::Layer::backward_weight(&self.$part, ops, pending.$part)?),+
                ]))
            }
        }
    };
}
pub(crate) use composite;

/// Inside the [`Layer`] impl of a layer declared with [`composite!`]: its
/// [`Layer::backward_weight`].
macro_rules! composite_weights {
    () => {
        fn backward_weight(
            &self,
            ops: &dyn $crate::primitives::Primitives,
            pending: Self::PendingWeightGrad,
        ) -> $crate::error::Result<Vec<candle_core::Tensor>> {
            self.composite_backward_weight(ops, pending)
        }
    };
}
pub(crate) use composite_weights;

/// A composite layer's weight gradients: its parts' gradients one after another, in the order of
/// [`NamedParameters::parameters`].
pub(crate) fn concat_grads<const N: usize>(parts: [Vec<Tensor>; N]) -> Vec<Tensor> {
    parts.into_iter().flatten().collect()
}

/// The tensors a saved or pending state keeps alive (its memory, counted once per tensor).
pub(crate) trait HeldTensors {
    /// Pushes every tensor held.
    fn tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>);
}

/// Mutable access to the tensors a forward's saved state keeps, in the order of
/// [`HeldTensors::tensors`]: what moving the state to host memory and back rewrites.
pub(crate) trait SavedTensorsMut {
    /// Pushes every tensor held.
    fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>);
}

/// Implements [`HeldTensors`] for a state from what holds its tensors, in order: the fields of a
/// struct (`held_tensors!(LinearPendingWeightGrad { input_rows, grad_rows })`, generic ones
/// bounded by the trait) or the one field of each variant of an enum (`held_tensors!(enum
/// Kind { Full(states), InputOnly(input) })`), each a tensor, a sub-layer's state, or a `Vec` of
/// them. With `mut` first, implements [`SavedTensorsMut`] too, in the same order.
macro_rules! held_tensors {
    ($state:ident $(<$($generic:ident),+>)? { $($field:ident),+ $(,)? }) => {
        impl$(<$($generic: $crate::layers::HeldTensors),+>)? $crate::layers::HeldTensors
            for $state$(<$($generic),+>)?
        {
            fn tensors<'a>(&'a self, out: &mut Vec<&'a candle_core::Tensor>) {
                $($crate::layers::HeldTensors::tensors(&self.$field, out);)+
            }
        }
    };
    (mut $state:ident $(<$($generic:ident),+>)? { $($field:ident),+ $(,)? }) => {
        $crate::layers::held_tensors!($state$(<$($generic),+>)? { $($field),+ });

        impl$(<$($generic: $crate::layers::SavedTensorsMut),+>)? $crate::layers::SavedTensorsMut
            for $state$(<$($generic),+>)?
        {
            fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                $($crate::layers::SavedTensorsMut::tensors_mut(&mut self.$field, out);)+
            }
        }
    };
    (enum $state:ident { $($variant:ident($inner:ident)),+ $(,)? }) => {
        impl $crate::layers::HeldTensors for $state {
            fn tensors<'a>(&'a self, out: &mut Vec<&'a candle_core::Tensor>) {
                match self {
                    $($state::$variant($inner) => $crate::layers::HeldTensors::tensors($inner, out),)+
                }
            }
        }
    };
    (mut enum $state:ident { $($variant:ident($inner:ident)),+ $(,)? }) => {
        $crate::layers::held_tensors!(enum $state { $($variant($inner)),+ });

        impl $crate::layers::SavedTensorsMut for $state {
            fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                match self {
                    $($state::$variant($inner) => {
                        $crate::layers::SavedTensorsMut::tensors_mut($inner, out)
                    })+
                }
            }
        }
    };
}
pub(crate) use held_tensors;

/// Implements [`HeldTensors`], [`SavedTensorsMut`] and [`ParameterSlots`] for containers of states
/// or layers (a stage's layers and their states): their elements', in order.
macro_rules! containers {
    ($($container:ident),+) => {$(
        impl<T: HeldTensors> HeldTensors for $container<T> {
            fn tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
                self.iter().for_each(|inner| inner.tensors(out));
            }
        }

        impl<T: SavedTensorsMut> SavedTensorsMut for $container<T> {
            fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
                self.iter_mut().for_each(|inner| inner.tensors_mut(out));
            }
        }

        impl<T: ParameterSlots> ParameterSlots for $container<T> {
            fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
                self.iter_mut().for_each(|inner| inner.push_slots(out));
            }
        }
    )+};
}
containers!(Vec);

impl HeldTensors for Tensor {
    fn tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.push(self);
    }
}

impl SavedTensorsMut for Tensor {
    fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        out.push(self);
    }
}

/// Bytes of the distinct tensors `state` holds.
pub(crate) fn held_bytes(state: &impl HeldTensors) -> usize {
    let mut tensors = Vec::new();
    state.tensors(&mut tensors);
    let mut seen = std::collections::HashSet::new();
    tensors
        .iter()
        .filter(|t| seen.insert(t.id()))
        .map(|t| t.elem_count() * t.dtype().size_in_bytes())
        .sum()
}

/// `dims` with its last entry replaced by `last` (unchanged when `dims` is empty).
pub(crate) fn with_last_dim(dims: &[usize], last: usize) -> Vec<usize> {
    let mut dims = dims.to_vec();
    if let Some(entry) = dims.last_mut() {
        *entry = last;
    }
    dims
}
