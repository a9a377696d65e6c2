//! [`CpuPrimitives`]: the [`Primitives`] ops on candle CPU tensors, each a short composition of
//! candle ops. Every candle error is wrapped as [`KernelError::Backend`] naming the op.

use candle_core::{DType, Device, Tensor, D};

use super::{CrossEntropyOutput, LayerNormOutput, Primitives};
use crate::error::{KernelError, Result};

/// `√(2/π)`, the GELU tanh approximation's scale.
const SQRT_TWO_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the GELU tanh approximation.
const GELU_CUBIC: f64 = 0.044_715;

/// The primitive ops on candle's CPU backend (matrix products through the `gemm` crate).
#[derive(Debug, Clone)]
pub struct CpuPrimitives {
    device: Device,
}

impl CpuPrimitives {
    /// The CPU implementation.
    pub fn new() -> Self {
        CpuPrimitives {
            device: Device::Cpu,
        }
    }
}

impl Default for CpuPrimitives {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs a candle computation and wraps its error with the op's name.
fn run<T>(op: &'static str, body: impl FnOnce() -> candle_core::Result<T>) -> Result<T> {
    body().map_err(KernelError::backend(op))
}

/// Sum over the last dimension, keeping it as size 1.
fn row_sum(x: &Tensor) -> candle_core::Result<Tensor> {
    x.sum_keepdim(D::Minus1)
}

/// Mean over the last dimension, keeping it as size 1.
fn row_mean(x: &Tensor) -> candle_core::Result<Tensor> {
    x.mean_keepdim(D::Minus1)
}

/// Softmax over the last dimension, stabilised by subtracting the row maximum.
fn softmax_last_dim(x: &Tensor) -> candle_core::Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?)?;
    let exp = shifted.exp()?;
    exp.broadcast_div(&row_sum(&exp)?)
}

/// A `[t, t]` additive mask: 0 on and below the diagonal, `-inf` above it.
fn causal_mask(t: usize, dtype: DType, device: &Device) -> candle_core::Result<Tensor> {
    let values: Vec<f64> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f64::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(values, (t, t), device)?.to_dtype(dtype)
}

/// The number of rows of `x` (product of the leading dimensions) and its last dimension.
fn rows_and_width(x: &Tensor) -> (usize, usize) {
    let width = x.dims().last().copied().unwrap_or(1);
    let rows = x.elem_count().checked_div(width).unwrap_or(0);
    (rows, width)
}

impl Primitives for CpuPrimitives {
    fn device(&self) -> &Device {
        &self.device
    }

    fn float_tensor(&self, values: &[f64], shape: &[usize], dtype: DType) -> Result<Tensor> {
        run("float_tensor", || {
            Tensor::from_vec(values.to_vec(), shape, &self.device)?.to_dtype(dtype)
        })
    }

    fn u32_tensor(&self, values: &[u32], shape: &[usize]) -> Result<Tensor> {
        run("u32_tensor", || {
            Tensor::from_vec(values.to_vec(), shape, &self.device)
        })
    }

    fn u32_values(&self, ids: &Tensor) -> Result<Vec<u32>> {
        run("u32_values", || ids.flatten_all()?.to_vec1::<u32>())
    }

    fn f64_values(&self, x: &Tensor) -> Result<Vec<f64>> {
        run("f64_values", || {
            x.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()
        })
    }

    fn reshape(&self, x: &Tensor, shape: &[usize]) -> Result<Tensor> {
        run("reshape", || x.reshape(shape))
    }

    fn split_heads(&self, x: &Tensor, n_head: usize) -> Result<Tensor> {
        run("split_heads", || {
            let (batch, seq, width) = x.dims3()?;
            let head_dim = width.checked_div(n_head).unwrap_or(0);
            x.reshape((batch, seq, n_head, head_dim))?
                .transpose(1, 2)?
                .contiguous()
        })
    }

    fn merge_heads(&self, x: &Tensor) -> Result<Tensor> {
        run("merge_heads", || {
            let (batch, n_head, seq, head_dim) = x.dims4()?;
            x.transpose(1, 2)?
                .contiguous()?
                .reshape((batch, seq, n_head * head_dim))
        })
    }

    fn split_last_dim(&self, x: &Tensor, parts: usize) -> Result<Vec<Tensor>> {
        run("split_last_dim", || {
            let (_, width) = rows_and_width(x);
            let part = width.checked_div(parts).unwrap_or(0);
            (0..parts)
                .map(|i| x.narrow(D::Minus1, i * part, part)?.contiguous())
                .collect()
        })
    }

    fn concat_last_dim(&self, parts: &[Tensor]) -> Result<Tensor> {
        run("concat_last_dim", || Tensor::cat(parts, D::Minus1))
    }

    fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("matmul", || a.matmul(b))
    }

    fn matmul_transpose_b(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("matmul_transpose_b", || a.matmul(&b.t()?))
    }

    fn matmul_transpose_a(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("matmul_transpose_a", || a.t()?.matmul(b))
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("add", || a.add(b))
    }

    fn add_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        run("add_row", || x.broadcast_add(row))
    }

    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("mul", || a.mul(b))
    }

    fn scale(&self, x: &Tensor, factor: f64) -> Result<Tensor> {
        run("scale", || x.affine(factor, 0.0))
    }

    fn sum_leading(&self, x: &Tensor) -> Result<Tensor> {
        run("sum_leading", || {
            let (rows, width) = rows_and_width(x);
            x.reshape((rows, width))?.sum(0)
        })
    }

    fn layer_norm(
        &self,
        x: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f64,
    ) -> Result<LayerNormOutput> {
        run("layer_norm", || {
            let centered = x.broadcast_sub(&row_mean(x)?)?;
            let variance = row_mean(&centered.sqr()?)?;
            let rstd = variance.affine(1.0, eps)?.sqrt()?.recip()?;
            let normalized = centered.broadcast_mul(&rstd)?;
            let output = normalized.broadcast_mul(weight)?.broadcast_add(bias)?;
            Ok(LayerNormOutput {
                output,
                normalized,
                rstd,
            })
        })
    }

    fn layer_norm_backward_input(
        &self,
        grad_y: &Tensor,
        weight: &Tensor,
        normalized: &Tensor,
        rstd: &Tensor,
    ) -> Result<Tensor> {
        run("layer_norm_backward_input", || {
            let g = grad_y.broadcast_mul(weight)?;
            let mean_g = row_mean(&g)?;
            let mean_g_xhat = row_mean(&g.mul(normalized)?)?;
            g.broadcast_sub(&mean_g)?
                .sub(&normalized.broadcast_mul(&mean_g_xhat)?)?
                .broadcast_mul(rstd)
        })
    }

    fn layer_norm_backward_weight(
        &self,
        grad_y: &Tensor,
        normalized: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let grad_weight = self.sum_leading(&self.mul(grad_y, normalized)?)?;
        let grad_bias = self.sum_leading(grad_y)?;
        Ok((grad_weight, grad_bias))
    }

    fn causal_softmax(&self, scores: &Tensor) -> Result<Tensor> {
        run("causal_softmax", || {
            let (_, t) = rows_and_width(scores);
            let mask = causal_mask(t, scores.dtype(), &self.device)?;
            softmax_last_dim(&scores.broadcast_add(&mask)?)
        })
    }

    fn softmax_backward(&self, probs: &Tensor, grad_probs: &Tensor) -> Result<Tensor> {
        run("softmax_backward", || {
            let dot = row_sum(&grad_probs.mul(probs)?)?;
            probs.mul(&grad_probs.broadcast_sub(&dot)?)
        })
    }

    fn gelu_new(&self, x: &Tensor) -> Result<Tensor> {
        // candle's `gelu` is exactly the tanh approximation of `gelu_new`.
        run("gelu_new", || x.gelu())
    }

    fn gelu_new_backward(&self, x: &Tensor, grad_y: &Tensor) -> Result<Tensor> {
        run("gelu_new_backward", || {
            // u = c·x·(1 + a·x²), t = tanh(u),
            // gelu'(x) = 0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3a·x²).
            let x_sq = x.sqr()?;
            let inner = x.mul(&x_sq.affine(GELU_CUBIC, 1.0)?)?;
            let t = inner.affine(SQRT_TWO_OVER_PI, 0.0)?.tanh()?;
            let sech_sq = t.sqr()?.affine(-1.0, 1.0)?;
            let du_dx = x_sq.affine(3.0 * GELU_CUBIC * SQRT_TWO_OVER_PI, SQRT_TWO_OVER_PI)?;
            let slope = t
                .affine(0.5, 0.5)?
                .add(&x.mul(&sech_sq)?.mul(&du_dx)?.affine(0.5, 0.0)?)?;
            grad_y.mul(&slope)
        })
    }

    fn gather_rows(&self, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
        run("gather_rows", || table.index_select(ids, 0))
    }

    fn scatter_add_rows(&self, rows: &Tensor, ids: &Tensor, n_rows: usize) -> Result<Tensor> {
        run("scatter_add_rows", || {
            let (_, width) = rows_and_width(rows);
            Tensor::zeros((n_rows, width), rows.dtype(), &self.device)?.index_add(ids, rows, 0)
        })
    }

    fn cross_entropy(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        weights: &Tensor,
        grad_scale: f64,
    ) -> Result<CrossEntropyOutput> {
        run("cross_entropy", || {
            let shifted = logits.broadcast_sub(&logits.max_keepdim(D::Minus1)?)?;
            let log_sum_exp = row_sum(&shifted.exp()?)?.log()?;
            let log_probs = shifted.broadcast_sub(&log_sum_exp)?;
            let target_column = targets.unsqueeze(1)?;
            let picked = log_probs.gather(&target_column, 1)?.squeeze(1)?;
            let loss_sum = picked.mul(weights)?.sum_all()?.neg()?;
            let ones = Tensor::ones(target_column.dims(), logits.dtype(), &self.device)?;
            let one_hot = logits.zeros_like()?.scatter_add(&target_column, &ones, 1)?;
            let row_scale = weights.affine(grad_scale, 0.0)?.unsqueeze(1)?;
            let grad_logits = log_probs.exp()?.sub(&one_hot)?.broadcast_mul(&row_scale)?;
            Ok(CrossEntropyOutput {
                loss_sum,
                grad_logits,
            })
        })
    }
}
