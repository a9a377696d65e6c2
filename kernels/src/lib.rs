//! `pipeweave-kernels`: GPT-2-architecture transformer layers on candle-core tensors whose
//! backward is split into an input-gradient half (I) and a weight-gradient half (W), so that a
//! pipeline schedule such as Zero Bubble can run them at different times.
//!
//! candle's autograd cannot split I from W, so every gradient is written by hand:
//!
//! - [`primitives`]: the primitive tensor ops ([`Primitives`]) and their CPU implementation
//!   ([`CpuPrimitives`]); the layers compute only through them;
//! - [`layers`]: the [`Layer`] protocol (forward / backward_input / backward_weight with
//!   explicit, move-only saved states) and the GPT-2 layers, one per file; the model's layer
//!   kinds registered in order ([`LayerKind`], [`model_layers`]: each kind's placement, input,
//!   count, construction and names, declared in its own file); and a mixture of experts
//!   ([`Moe`], [`MoeBlock`]: the model's blocks where [`GptConfig::moe`] says) whose phases
//!   (route, dispatch, experts, combine) a trainer can run on expert-parallel ranks
//!   ([`ExpertShard`], [`ExpertPlacement`]: each rank its experts, their rows exchanged through
//!   an [`ExpertExchange`]);
//! - [`stage`]: [`StageModel`], one pipeline stage of a GPT (a run of the model's layers:
//!   embedding, blocks, head), with optional recomputation and Hugging Face parameter names;
//! - [`config`] and [`init`]: the model shape (and a mixture of experts', [`MoeConfig`]) and
//!   GPT-2 initialisation from a seed;
//! - [`flops`]: FLOP estimates of the F, I and W passes per layer and stage;
//! - [`error`]: [`KernelError`], the crate's one error type.
//!
//! # Determinism
//!
//! Findings for candle-core 0.11.1 on the CPU (no `mkl`/`accelerate` feature), from its source
//! and `gemm` 0.19's, and measured by the tests of the private `determinism` module:
//!
//! - **Thread count: no effect.** Matrix products go through the `gemm` crate with
//!   `Parallelism::Rayon(n)`, `n` read from `RAYON_NUM_THREADS` at every call (else the number
//!   of physical cores; candle's elementwise pool reads `CANDLE_NUM_THREADS`). `gemm` hands
//!   *output* tiles to the threads; each output element is still reduced over `k` in the same
//!   order (blocks of `kc` chosen from the cache sizes and the shape, never from the thread
//!   count), and its matrix-vector paths are single-threaded. Elementwise ops are split into
//!   fixed 16 Ki-element chunks, and reductions (sum, max) and `index_add` are sequential. The
//!   test `stage_gradients_do_not_depend_on_thread_count` re-runs the test binary with 1, 2, 3
//!   and 8 threads on a 300x500x400 product and a whole f32 stage step (2 blocks, d = 64,
//!   B·T = 256, big enough for every parallel path) and finds the same bits every time.
//! - **Batch shape: may matter.** A row of `x · W` can change in its last bits with the number
//!   of rows of `x`: `gemm` picks its blocking (`kc = min(k, 512)` for small `m` and `n`, else
//!   from the shape) and a matrix-vector path for one row. Measured (f32, row 0 of a 512-row
//!   product vs the same row in a product of fewer rows): identical for `k·n` = 768x768,
//!   64x32, 100x7; different for 2048x48 (row counts 1 to 64) and for 3072x768 (a single row).
//!   A weight gradient `xᵀ · dy` also sums over all rows of a microbatch in one product. So for
//!   bit-identical results across any number of ranks, fix the microbatch shape (not the number
//!   of microbatches per rank) and sum per-microbatch weight gradients in a fixed global order:
//!   the layers return the gradients rather than accumulating them for exactly this, and the
//!   loss normaliser is passed in ([`CrossEntropy`]) so that it does not depend on the split.
//! - **Across machines: not guaranteed.** `gemm` picks its micro-kernel (AVX-512, AVX2+FMA,
//!   SSE, NEON) and cache blocking from the CPU at run time, so products may differ between
//!   machines. Initialisation ([`init`]) is bit-identical everywhere (integer PRNG, pure-Rust
//!   `libm`).
#![warn(missing_docs)]

mod check;
pub mod config;
pub mod error;
pub mod flops;
pub mod init;
pub mod layers;
pub mod primitives;
pub mod sequence;
pub mod stage;

#[cfg(test)]
mod determinism;
#[cfg(test)]
mod oracle;
#[cfg(test)]
mod testing;

pub use config::{ExpertShard, GptConfig, MoeConfig};
pub use error::{KernelError, Result};
pub use flops::PassFlops;
pub use layers::{
    count_non_padding, model_layers, Attention, Block, CrossEntropy, Embedding, ExchangePhase,
    ExpertExchange, ExpertPlacement, ExpertRows, Gelu, Head, Layer, LayerId, LayerInput, LayerKind,
    LayerNorm, Linear, LossOutput, Mlp, Moe, MoeBlock, NamedParameters, Placement,
};
pub use primitives::{
    adamw_update, squared_norm, AdamWStep, CpuPrimitives, Primitives, TensorSum, TimedPrimitives,
};
pub use sequence::{ChunkAt, ChunkMemory, SequenceState};
pub use stage::{
    HostCopy, HostPending, HostSaved, StageLayout, StageModel, StagePendingWeightGrad, StageSaved,
};
