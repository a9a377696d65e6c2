//! The GPT-2 layers, one per file, the [`Layer`] protocol they share, and the model's layer
//! kinds in order ([`LayerKind`], [`model_layers`]): each model layer (the embedding, a block or
//! a block with a mixture of experts, the head) says in its own file, beside its [`Layer`] impl, where a cut places it, what it
//! takes, how many the model has, how it is initialised and what its parameters are called
//! (`model.rs`'s `ModelLayer`), and is registered by one line of `register_layers!` in
//! `registry.rs`. Adding a model layer is its file, its `mod` line here and its registration
//! line; the stage, the trainer's cut and its profile run every registered kind without naming
//! one.
//!
//! The files depend one way: `protocol.rs` (the [`Layer`] trait, the parameter and state traits
//! and their macros) on no layer; each layer file on the protocol and the layers it is made of;
//! `model.rs` (what a model layer declares, and the registration macro) on the protocol;
//! `registry.rs` (the registration: [`LayerKind`], [`LayerId`], [`model_layers`]) on the model
//! layers. This file only declares and re-exports them.
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
pub(crate) mod model;
pub mod moe;
pub mod moe_block;
pub(crate) mod protocol;
pub(crate) mod registry;

pub use attention::Attention;
pub use block::Block;
pub use cross_entropy::{count_non_padding, CrossEntropy, LossOutput};
pub use embedding::Embedding;
pub use gelu::Gelu;
pub use head::Head;
pub use layer_norm::LayerNorm;
pub use linear::Linear;
pub use mlp::Mlp;
pub use model::{LayerInput, Placement};
pub use moe::{
    CombineSaved, ExchangePhase, ExpertBank, ExpertExchange, ExpertPlacement, ExpertRows,
    ExpertsPending, ExpertsSaved, Moe, MoePendingWeightGrad, MoeSaved, RouterPending, RouterSaved,
    Routing, RoutingGrad,
};
pub use moe_block::{MoeBlock, MoeBlockPendingWeightGrad, MoeBlockSaved};
pub(crate) use protocol::{held_bytes, held_tensors, ParameterSlots, SavedTensorsMut};
pub use protocol::{Layer, NamedParameters};
pub use registry::{model_layers, LayerId, LayerKind};
pub(crate) use registry::{AnyLayer, AnyPending, AnySaved};
