//! The protocol every layer shares: the [`Layer`] trait (forward, and the backward split into
//! its input half and its weight half), the parameter traits ([`NamedParameters`] and the
//! crate's mutable [`ParameterSlots`]), what a state holds ([`HeldTensors`],
//! [`SavedTensorsMut`], [`held_bytes`]) and the macros that implement them from one declaration
//! per layer. It names no layer: every layer file depends on it, it on none of them.

use candle_core::Tensor;

use crate::error::Result;
use crate::primitives::Primitives;
use crate::sequence::{ChunkAt, ChunkMemory};

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

        $crate::layers::protocol::parameters!(@lists $layer { $first_name => $first $(, $name => $field)* });
    };
    (@lists $layer:ty { $($name:expr => $field:ident),+ }) => {
        impl $crate::layers::protocol::NamedParameters for $layer {
            fn push_parameters(&self, prefix: &str, out: &mut Vec<(String, candle_core::Tensor)>) {
                $($crate::layers::protocol::NamedParameters::push_parameters(
                    &self.$field,
                    &$crate::layers::protocol::joined(prefix, $name),
                    out,
                );)+
            }
        }

        impl $crate::layers::protocol::ParameterSlots for $layer {
            fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                $($crate::layers::protocol::ParameterSlots::push_slots(&mut self.$field, out);)+
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
        $crate::layers::protocol::parameters!($layer { $(stringify!($part) => $part),+ });

        impl $layer {
            /// The sub-layers' weight gradients, one after another.
            fn composite_backward_weight(
                &self,
                ops: &dyn $crate::primitives::Primitives,
                pending: $pending,
            ) -> $crate::error::Result<Vec<candle_core::Tensor>> {
                Ok($crate::layers::protocol::concat_grads([
                    $($crate::layers::protocol::Layer::backward_weight(&self.$part, ops, pending.$part)?),+
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

/// Inside the [`Layer`] impl of a layer whose sequence chunks change what it computes (an
/// attention, or a layer holding one): its whole-sequence and chunk forward and input backward,
/// all four from the layer's own `run(ops, input, chunk)` and `run_backward(ops, saved,
/// grad_output, chunk)`, whose `chunk` ([`crate::sequence::Chunk`]) is None for a whole sequence.
macro_rules! chunked_passes {
    () => {
        fn forward(
            &self,
            ops: &dyn $crate::primitives::Primitives,
            input: &candle_core::Tensor,
        ) -> $crate::error::Result<(candle_core::Tensor, Self::Saved)> {
            self.run(ops, input, None)
        }

        fn backward_input(
            &self,
            ops: &dyn $crate::primitives::Primitives,
            saved: Self::Saved,
            grad_output: &candle_core::Tensor,
        ) -> $crate::error::Result<(Self::InputGrad, Self::PendingWeightGrad)> {
            self.run_backward(ops, saved, grad_output, None)
        }

        fn forward_chunk(
            &self,
            ops: &dyn $crate::primitives::Primitives,
            input: &candle_core::Tensor,
            at: $crate::sequence::ChunkAt,
            memory: &mut $crate::sequence::ChunkMemory,
        ) -> $crate::error::Result<(candle_core::Tensor, Self::Saved)> {
            self.run(ops, input, Some((at, memory)))
        }

        fn backward_input_chunk(
            &self,
            ops: &dyn $crate::primitives::Primitives,
            saved: Self::Saved,
            grad_output: &candle_core::Tensor,
            at: $crate::sequence::ChunkAt,
            memory: &mut $crate::sequence::ChunkMemory,
        ) -> $crate::error::Result<(Self::InputGrad, Self::PendingWeightGrad)> {
            self.run_backward(ops, saved, grad_output, Some((at, memory)))
        }
    };
}
pub(crate) use chunked_passes;

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
        impl$(<$($generic: $crate::layers::protocol::HeldTensors),+>)? $crate::layers::protocol::HeldTensors
            for $state$(<$($generic),+>)?
        {
            fn tensors<'a>(&'a self, out: &mut Vec<&'a candle_core::Tensor>) {
                $($crate::layers::protocol::HeldTensors::tensors(&self.$field, out);)+
            }
        }
    };
    (mut $state:ident $(<$($generic:ident),+>)? { $($field:ident),+ $(,)? }) => {
        $crate::layers::protocol::held_tensors!($state$(<$($generic),+>)? { $($field),+ });

        impl$(<$($generic: $crate::layers::protocol::SavedTensorsMut),+>)? $crate::layers::protocol::SavedTensorsMut
            for $state$(<$($generic),+>)?
        {
            fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                $($crate::layers::protocol::SavedTensorsMut::tensors_mut(&mut self.$field, out);)+
            }
        }
    };
    (enum $state:ident { $($variant:ident($inner:ident)),+ $(,)? }) => {
        impl $crate::layers::protocol::HeldTensors for $state {
            fn tensors<'a>(&'a self, out: &mut Vec<&'a candle_core::Tensor>) {
                match self {
                    $($state::$variant($inner) => $crate::layers::protocol::HeldTensors::tensors($inner, out),)+
                }
            }
        }
    };
    (mut enum $state:ident { $($variant:ident($inner:ident)),+ $(,)? }) => {
        $crate::layers::protocol::held_tensors!(enum $state { $($variant($inner)),+ });

        impl $crate::layers::protocol::SavedTensorsMut for $state {
            fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut candle_core::Tensor>) {
                match self {
                    $($state::$variant($inner) => {
                        $crate::layers::protocol::SavedTensorsMut::tensors_mut($inner, out)
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
