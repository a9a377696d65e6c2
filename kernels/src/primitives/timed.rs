//! [`TimedPrimitives`]: any [`Primitives`] with the time spent in each op summed by name: the
//! profile of a step by primitive, for `cargo bench --bench kernels`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};

use super::{AttentionOutput, CrossEntropyOutput, LayerNormOutput, Primitives};
use crate::error::Result;

/// Another implementation's ops, each call timed and summed under the op's name.
#[derive(Debug)]
pub struct TimedPrimitives<P> {
    inner: P,
    spent: Mutex<BTreeMap<&'static str, (Duration, u64)>>,
}

impl<P: Primitives> TimedPrimitives<P> {
    /// `inner`'s ops, timed.
    pub fn new(inner: P) -> Self {
        TimedPrimitives {
            inner,
            spent: Mutex::new(BTreeMap::new()),
        }
    }

    /// Per op: the time spent in it and the number of calls, since the last [`Self::take`].
    pub fn take(&self) -> BTreeMap<&'static str, (Duration, u64)> {
        self.spent
            .lock()
            .map(|mut m| std::mem::take(&mut *m))
            .unwrap_or_default()
    }

    fn timed<T>(&self, op: &'static str, call: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = call();
        if let Ok(mut m) = self.spent.lock() {
            let entry = m.entry(op).or_default();
            entry.0 += start.elapsed();
            entry.1 += 1;
        }
        out
    }
}

impl<P: Primitives> Primitives for TimedPrimitives<P> {
    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn float_tensor(&self, values: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
        self.timed("float_tensor", || {
            self.inner.float_tensor(values, shape, dtype)
        })
    }

    fn u32_tensor(&self, values: &[u32], shape: &[usize]) -> Result<Tensor> {
        self.timed("u32_tensor", || self.inner.u32_tensor(values, shape))
    }

    fn u32_values(&self, ids: &Tensor) -> Result<Vec<u32>> {
        self.timed("u32_values", || self.inner.u32_values(ids))
    }

    fn f64_values(&self, x: &Tensor) -> Result<Vec<f64>> {
        self.timed("f64_values", || self.inner.f64_values(x))
    }

    fn reshape(&self, x: &Tensor, shape: &[usize]) -> Result<Tensor> {
        self.timed("reshape", || self.inner.reshape(x, shape))
    }

    fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.timed("matmul", || self.inner.matmul(a, b))
    }

    fn matmul_transpose_b(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.timed("matmul_transpose_b", || self.inner.matmul_transpose_b(a, b))
    }

    fn matmul_add_row(&self, a: &Tensor, b: &Tensor, row: &Tensor) -> Result<Tensor> {
        self.timed("matmul_add_row", || self.inner.matmul_add_row(a, b, row))
    }

    fn matmul_transpose_a(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.timed("matmul_transpose_a", || self.inner.matmul_transpose_a(a, b))
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.timed("add", || self.inner.add(a, b))
    }

    fn add_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        self.timed("add_row", || self.inner.add_row(x, row))
    }

    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.timed("mul", || self.inner.mul(a, b))
    }

    fn scale(&self, x: &Tensor, factor: f64) -> Result<Tensor> {
        self.timed("scale", || self.inner.scale(x, factor))
    }

    fn sum_leading(&self, x: &Tensor) -> Result<Tensor> {
        self.timed("sum_leading", || self.inner.sum_leading(x))
    }

    fn layer_norm(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
    ) -> Result<LayerNormOutput> {
        self.timed("layer_norm", || self.inner.layer_norm(x, weight, bias, eps))
    }

    fn layer_norm_backward_input(
        &self,
        grad_y: &Tensor,
        weight: &Tensor,
        normalized: &Tensor,
        rstd: &Tensor,
    ) -> Result<Tensor> {
        self.timed("layer_norm_backward_input", || {
            self.inner
                .layer_norm_backward_input(grad_y, weight, normalized, rstd)
        })
    }

    fn layer_norm_backward_weight(
        &self,
        grad_y: &Tensor,
        normalized: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.timed("layer_norm_backward_weight", || {
            self.inner.layer_norm_backward_weight(grad_y, normalized)
        })
    }

    fn causal_attention(&self, qkv: &Tensor, n_head: usize, scale: f64) -> Result<AttentionOutput> {
        self.timed("causal_attention", || {
            self.inner.causal_attention(qkv, n_head, scale)
        })
    }

    fn causal_attention_backward(
        &self,
        qkv: &Tensor,
        probs: &Tensor,
        grad_context: &Tensor,
        n_head: usize,
        scale: f64,
    ) -> Result<Tensor> {
        self.timed("causal_attention_backward", || {
            self.inner
                .causal_attention_backward(qkv, probs, grad_context, n_head, scale)
        })
    }

    fn gelu_new(&self, x: &Tensor) -> Result<Tensor> {
        self.timed("gelu_new", || self.inner.gelu_new(x))
    }

    fn gelu_new_backward(&self, x: &Tensor, grad_y: &Tensor) -> Result<Tensor> {
        self.timed("gelu_new_backward", || {
            self.inner.gelu_new_backward(x, grad_y)
        })
    }

    fn gather_rows(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        self.timed("gather_rows", || self.inner.gather_rows(table, ids))
    }

    fn scatter_add_rows(&self, rows: &Tensor, ids: &Tensor, n_rows: usize) -> Result<Tensor> {
        self.timed("scatter_add_rows", || {
            self.inner.scatter_add_rows(rows, ids, n_rows)
        })
    }

    fn cross_entropy(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        weights: &Tensor,
        grad_scale: f64,
    ) -> Result<CrossEntropyOutput> {
        self.timed("cross_entropy", || {
            self.inner
                .cross_entropy(logits, targets, weights, grad_scale)
        })
    }
}
