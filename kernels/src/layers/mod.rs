//! The GPT-2 layers, one per file, and the [`Layer`] protocol they share.
//!
//! The backward of every layer is split in two halves that a pipeline schedule may run at
//! different times (Zero Bubble's I and W):
//!
//! 1. [`Layer::forward`] returns the output and a `Saved` state holding what the backward needs;
//! 2. [`Layer::backward_input`] consumes that state and the output gradient, and returns the
//!    input gradient and a `PendingWeightGrad` state holding what the weight gradient needs;
//! 3. [`Layer::backward_weight`] consumes that state and returns the weight gradients, one
//!    tensor per parameter in the order of [`Layer::parameters`].
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

pub use attention::Attention;
pub use block::Block;
pub use cross_entropy::{count_non_padding, CrossEntropy, LossOutput};
pub use embedding::Embedding;
pub use gelu::Gelu;
pub use head::Head;
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use mlp::Mlp;

use candle_core::Tensor;

use crate::error::Result;
use crate::primitives::Primitives;

/// A layer whose backward is split into an input half and a weight half.
pub trait Layer {
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

    /// Gradients of the loss w.r.t. the parameters, in the order of [`Layer::parameters`].
    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: Self::PendingWeightGrad,
    ) -> Result<Vec<Tensor>>;

    /// The parameters with their names relative to the layer (e.g. `c_attn.weight`), in order.
    fn parameters(&self) -> Vec<(String, Tensor)>;
}

/// Prefixes the local parameter names of a sub-layer with `prefix.`.
pub(crate) fn prefixed(prefix: &str, params: Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
    params
        .into_iter()
        .map(|(name, tensor)| (format!("{prefix}.{name}"), tensor))
        .collect()
}

/// Mutable access to a layer's parameter tensors, in the order of [`Layer::parameters`], for
/// [`crate::StageModel::set_parameters`], which checks shapes and dtypes before writing.
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

/// Bytes of distinct tensors among `tensors`.
pub(crate) fn distinct_bytes(tensors: &[&Tensor]) -> usize {
    let mut seen = std::collections::HashSet::new();
    tensors
        .iter()
        .filter(|t| seen.insert(t.id()))
        .map(|t| t.elem_count() * t.dtype().size_in_bytes())
        .sum()
}

pub(crate) trait ParameterSlots {
    /// The parameter tensors, in order.
    fn parameter_slots(&mut self) -> Vec<&mut Tensor>;
}

/// `dims` with its last entry replaced by `last` (unchanged when `dims` is empty).
pub(crate) fn with_last_dim(dims: &[usize], last: usize) -> Vec<usize> {
    let mut dims = dims.to_vec();
    if let Some(entry) = dims.last_mut() {
        *entry = last;
    }
    dims
}
