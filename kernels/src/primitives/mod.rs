//! The primitive tensor ops every layer is written over, as the object-safe trait
//! [`Primitives`], with one implementation on candle CPU tensors, [`CpuPrimitives`].
//!
//! The layers never call candle's tensor methods (beyond reading shapes and dtypes): everything
//! they compute goes through this trait, so that a GPU implementation (fused kernels, cuBLAS)
//! can replace the CPU one without touching the layers. The ops assume the shapes the layers
//! have already checked; a violation comes back as [`crate::KernelError::Backend`], never a panic.

mod attention;
mod cpu;
mod fused;
mod products;
mod simd;
mod slices;
mod timed;
mod update;

pub use cpu::CpuPrimitives;
pub use timed::TimedPrimitives;
pub use update::{adamw_update, squared_norm, AdamWStep, TensorSum};

use candle_core::{DType, Device, Tensor};

use crate::error::Result;

/// What [`Primitives::layer_norm`] returns: the output and the statistics its backward needs.
#[derive(Debug)]
pub struct LayerNormOutput {
    /// `normalized · weight + bias`, shape of the input.
    pub output: Tensor,
    /// `(x - mean) · rstd`, shape of the input.
    pub normalized: Tensor,
    /// `1 / sqrt(var + eps)` per row, shape of the input with the last dimension 1.
    pub rstd: Tensor,
}

/// What [`Primitives::causal_attention`] returns.
#[derive(Debug)]
pub struct AttentionOutput {
    /// The heads' weighted values side by side, `[B, T, H·D]`.
    pub context: Tensor,
    /// The attention weights, `[B, H, T, T]` (what the backward needs with `qkv`).
    pub probs: Tensor,
}

/// What [`Primitives::cross_entropy`] returns.
#[derive(Debug)]
pub struct CrossEntropyOutput {
    /// `Σ_i weight_i · (-log softmax(logits_i)[target_i])`, a rank-0 tensor.
    pub loss_sum: Tensor,
    /// `grad_scale · weight_i · (softmax(logits_i) - onehot(target_i))`, shape of the logits.
    pub grad_logits: Tensor,
}

/// Declares [`Primitives`] from its ops' docs and signatures, and implements it for
/// [`TimedPrimitives`], each op there the inner implementation's, timed under the op's name: one
/// list of the ops for the trait and its timed wrapper.
macro_rules! primitives {
    (
        $(#[$trait_doc:meta])*
        pub trait Primitives {
            $(#[$device_doc:meta])*
            fn device(&self) -> &Device;
            $(
                $(#[$doc:meta])*
                fn $op:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty;
            )+
        }
    ) => {
        $(#[$trait_doc])*
        pub trait Primitives: std::fmt::Debug + Send + Sync {
            $(#[$device_doc])*
            fn device(&self) -> &Device;
            $(
                $(#[$doc])*
                fn $op(&self $(, $arg: $ty)*) -> $ret;
            )+
        }

        impl<P: Primitives> Primitives for TimedPrimitives<P> {
            fn device(&self) -> &Device {
                self.inner.device()
            }

            $(
                fn $op(&self $(, $arg: $ty)*) -> $ret {
                    self.timed(stringify!($op), || self.inner.$op($($arg),*))
                }
            )+
        }
    };
}

primitives! {
    /// The primitive ops of the layers. Float tensors share one dtype (F32 or F64); ids are U32.
    ///
    /// "Rows" are the vectors along the last dimension; "leading dimensions" are all the others.
    pub trait Primitives {
        /// The device the ops run on; new tensors are created there.
        fn device(&self) -> &Device;

        // ---- host transfer ----

        /// A float tensor of `dtype` holding `values` (row-major) with shape `shape`.
        fn float_tensor(&self, values: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor>;
        /// A U32 tensor holding `values` (row-major) with shape `shape`.
        fn u32_tensor(&self, values: &[u32], shape: &[usize]) -> Result<Tensor>;
        /// The values of a U32 tensor, row-major.
        fn u32_values(&self, ids: &Tensor) -> Result<Vec<u32>>;
        /// The values of a float tensor, row-major, widened to f64.
        fn f64_values(&self, x: &Tensor) -> Result<Vec<f64>>;

        // ---- layout ----

        /// The same elements (row-major) with a new shape of equal element count.
        fn reshape(&self, x: &Tensor, shape: &[usize]) -> Result<Tensor>;
        /// `[B, T_1 + T_2 + .., n]` from `[B, T_i, n]` parts: positions of a sequence joined in
        /// order (a sequence chunk's keys and values after the earlier chunks').
        fn concat_positions(&self, parts: &[Tensor]) -> Result<Tensor>;
        /// Positions `start..start + len` of `x: [B, T, n]`, as a contiguous `[B, len, n]`.
        fn narrow_positions(&self, x: &Tensor, start: usize, len: usize) -> Result<Tensor>;

        // ---- linear algebra ----

        /// `a · b` for `a: [.., m, k]`, `b: [.., k, n]` with equal leading dimensions.
        fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
        /// `a · bᵀ` for `a: [.., m, k]`, `b: [.., n, k]`.
        fn matmul_transpose_b(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
        /// `aᵀ · b` for `a: [.., k, m]`, `b: [.., k, n]`.
        fn matmul_transpose_a(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
        /// `a · b + row` for `a: [.., m, k]`, `b: [.., k, n]`, `row: [n]` added to every output
        /// row (an affine layer's product and bias in one pass).
        fn matmul_add_row(&self, a: &Tensor, b: &Tensor, row: &Tensor) -> Result<Tensor>;

        // ---- elementwise and reductions ----

        /// `a + b`, equal shapes.
        fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
        /// `x + row` with `row: [n]` broadcast over the leading dimensions of `x: [.., n]`.
        fn add_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor>;
        /// `a ⊙ b`, equal shapes.
        fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
        /// `factor · x`.
        fn scale(&self, x: &Tensor, factor: f64) -> Result<Tensor>;
        /// Sum over all leading dimensions: `[.., n] -> [n]`.
        fn sum_leading(&self, x: &Tensor) -> Result<Tensor>;

        // ---- layer norm ----

        /// Layer norm over the last dimension with affine `weight`, `bias` (`[n]`).
        fn layer_norm(&self, x: &Tensor, weight: &Tensor, bias: &Tensor, eps: f64)
            -> Result<LayerNormOutput>;
        /// Gradient of the input: `rstd · (g - mean(g) - x̂ · mean(g ⊙ x̂))` with
        /// `g = grad_y ⊙ weight`.
        fn layer_norm_backward_input(&self, grad_y: &Tensor, weight: &Tensor, normalized: &Tensor,
            rstd: &Tensor) -> Result<Tensor>;
        /// Gradients of `(weight, bias)`: `(Σ grad_y ⊙ x̂, Σ grad_y)` over the leading
        /// dimensions.
        fn layer_norm_backward_weight(&self, grad_y: &Tensor, normalized: &Tensor)
            -> Result<(Tensor, Tensor)>;

        // ---- attention ----

        /// Causal multi-head attention on `qkv: [B, T, 3·H·D]` (query, key and value along the
        /// last dimension, `n_head` heads of width `D` inside each) for the queries of positions
        /// `start..T` (0 for the whole sequence; a later start for a sequence chunk, whose keys
        /// and values of the positions before it `qkv` holds too): `(context, probs)` with
        /// `probs: [B, H, T - start, T]` the softmax of `scale · q·kᵀ` per head with keys after
        /// the query masked out (a causal decoder), and `context: [B, T - start, H·D]` the
        /// heads' `probs · v` side by side.
        fn causal_attention(&self, qkv: &Tensor, start: usize, n_head: usize, scale: f64)
            -> Result<AttentionOutput>;
        /// The gradient of `qkv` (`[B, T, 3·H·D]`: zeros for the queries before `start`) from
        /// the context's gradient `grad_context` (`[B, T - start, H·D]`), given the forward's
        /// `qkv` and `probs`.
        fn causal_attention_backward(&self, qkv: &Tensor, probs: &Tensor, grad_context: &Tensor,
            start: usize, n_head: usize, scale: f64) -> Result<Tensor>;

        // ---- activation ----

        /// GPT-2's `gelu_new`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
        fn gelu_new(&self, x: &Tensor) -> Result<Tensor>;
        /// `grad_y ⊙ gelu_new'(x)`.
        fn gelu_new_backward(&self, x: &Tensor, grad_y: &Tensor) -> Result<Tensor>;

        // ---- embedding ----

        /// `table[ids[i]]` for `table: [V, n]`, `ids: [N]` (all `< V`): `[N, n]`.
        fn gather_rows(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor>;
        /// A `[n_rows, n]` zero tensor with `rows[i]` added to row `ids[i]`, for `i` in order.
        fn scatter_add_rows(&self, rows: &Tensor, ids: &Tensor, n_rows: usize) -> Result<Tensor>;

        // ---- loss ----

        /// Weighted token cross-entropy with a numerically stable log-softmax, for
        /// `logits: [N, V]`, `targets: [N]` (U32, all `< V`) and `weights: [N]` (logits' dtype).
        fn cross_entropy(&self, logits: &Tensor, targets: &Tensor, weights: &Tensor,
            grad_scale: f64) -> Result<CrossEntropyOutput>;
    }
}
