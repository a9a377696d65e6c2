//! [`CpuPrimitives`]: the [`Primitives`] ops on candle CPU tensors. Matrix products, layout
//! changes, gathers and the loss are candle ops (its products run the `gemm` crate, with AVX-512
//! kernels where the CPU has them); the element-wise and row-wise work (GELU and its gradient,
//! layer norm and its gradients, the causal softmax and its gradient, bias rows and their sums)
//! runs as single passes over the tensors' elements ([`super::fused`]), with no intermediate
//! tensors. Every error is wrapped as [`KernelError::Backend`] naming the op.

use candle_core::{DType, Device, Tensor, D};

use super::attention;
use super::fused;
use super::products::{self, Product};
use super::slices::{tensor, with_slice, Real};
use super::{AttentionOutput, CrossEntropyOutput, LayerNormOutput, Primitives};
use crate::error::{KernelError, Result};

/// Runs `$body` with `$T` the element type of `$x` (F32 or F64); other dtypes are an error.
macro_rules! by_dtype {
    ($x:expr, |$T:ident| $body:expr) => {
        match $x.dtype() {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            other => Err(candle_core::Error::Msg(format!(
                "the fused kernels compute in F32 or F64, not {other:?}"
            ))),
        }
    };
}

/// `kernel` over the elements of `x`, as a tensor of `x`'s shape (vectorised).
fn map1<T: Real>(x: &Tensor, kernel: impl FnOnce(&[T]) -> Vec<T>) -> candle_core::Result<Tensor> {
    tensor(with_slice(x, kernel)?, x.dims())
}

/// `kernel` over the elements of `a` and `b`, as a tensor of `a`'s shape.
fn map2<T: Real>(
    a: &Tensor,
    b: &Tensor,
    kernel: impl FnOnce(&[T], &[T]) -> Vec<T>,
) -> candle_core::Result<Tensor> {
    let values = with_slice(a, |a| with_slice(b, |b| kernel(a, b)))??;
    tensor(values, a.dims())
}

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

/// `a · b` (`a` and `b` read as their transposes where said), plus `row` on every output row: for
/// `a: [.., m, k]` (or `[.., k, m]`) and `b: [.., k, n]` (or `[.., n, k]`) with equal leading
/// dimensions, `[.., m, n]`.
fn product(
    a: &Tensor,
    b: &Tensor,
    row: Option<&Tensor>,
    a_transposed: bool,
    b_transposed: bool,
) -> candle_core::Result<Tensor> {
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() < 2 || ad.len() != bd.len() || ad[..ad.len() - 2] != bd[..bd.len() - 2] {
        return Err(candle_core::Error::Msg(format!(
            "a product of shapes {ad:?} and {bd:?}: both need the same leading dimensions"
        )));
    }
    let last2 = |d: &[usize]| (d[d.len() - 2], d[d.len() - 1]);
    let ((a0, a1), (b0, b1)) = (last2(ad), last2(bd));
    let (m, k) = if a_transposed { (a1, a0) } else { (a0, a1) };
    let (k2, n) = if b_transposed { (b1, b0) } else { (b0, b1) };
    if k != k2 {
        return Err(candle_core::Error::Msg(format!(
            "a product of shapes {ad:?} and {bd:?}: inner dimensions {k} and {k2} differ"
        )));
    }
    let leading = &ad[..ad.len() - 2];
    let shape = Product {
        batch: leading.iter().product(),
        m,
        n,
        k,
        a_transposed,
        b_transposed,
    };
    let mut dims = leading.to_vec();
    dims.extend([m, n]);
    by_dtype!(a, |T| {
        let values = with_slice::<T, _>(a, |a| {
            with_slice(b, |b| match row {
                Some(row) => with_slice(row, |row| products::product(shape, a, b, Some(row))),
                None => Ok(products::product(shape, a, b, None)),
            })
        })???;
        let values = values.ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "a product of shapes {ad:?} and {bd:?}: sizes differ"
            ))
        })?;
        tensor(values, &dims)
    })
}

/// The attention sizes of `qkv: [B, T, 3·H·D]` with `n_head` heads.
fn heads_of(qkv: &Tensor, n_head: usize, start: usize) -> candle_core::Result<attention::Heads> {
    let (batch, seq, three_width) = qkv.dims3()?;
    if n_head == 0 || three_width % (3 * n_head) != 0 {
        return Err(candle_core::Error::Msg(format!(
            "qkv's last dimension {three_width} is not 3 x {n_head} heads x a head width"
        )));
    }
    Ok(attention::Heads {
        batch,
        seq,
        heads: n_head,
        head_dim: three_width / (3 * n_head),
        start,
    })
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

    fn concat_positions(&self, parts: &[Tensor]) -> Result<Tensor> {
        run("concat_positions", || Tensor::cat(parts, 1))
    }

    fn narrow_positions(&self, x: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        run("narrow_positions", || x.narrow(1, start, len)?.contiguous())
    }

    fn matmul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("matmul", || product(a, b, None, false, false))
    }

    fn matmul_transpose_b(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("matmul_transpose_b", || product(a, b, None, false, true))
    }

    fn matmul_transpose_a(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("matmul_transpose_a", || product(a, b, None, true, false))
    }

    fn matmul_add_row(&self, a: &Tensor, b: &Tensor, row: &Tensor) -> Result<Tensor> {
        run("matmul_add_row", || product(a, b, Some(row), false, false))
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("add", || by_dtype!(a, |T| map2::<T>(a, b, fused::add)))
    }

    fn add_row(&self, x: &Tensor, row: &Tensor) -> Result<Tensor> {
        run("add_row", || {
            by_dtype!(x, |T| map2::<T>(x, row, fused::add_row))
        })
    }

    fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        run("mul", || by_dtype!(a, |T| map2::<T>(a, b, fused::mul)))
    }

    fn scale(&self, x: &Tensor, factor: f64) -> Result<Tensor> {
        run("scale", || {
            by_dtype!(x, |T| map1::<T>(x, |v| fused::scale(v, T::of(factor))))
        })
    }

    fn sum_leading(&self, x: &Tensor) -> Result<Tensor> {
        run("sum_leading", || {
            let (_, width) = rows_and_width(x);
            by_dtype!(x, |T| tensor(
                with_slice::<T, _>(x, |v| fused::row_sum(v, width))?,
                &[width]
            ))
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
            let dims = x.dims();
            let mut rstd_dims = dims.to_vec();
            if let Some(last) = rstd_dims.last_mut() {
                *last = 1;
            }
            by_dtype!(x, |T| {
                let (output, normalized, rstd) = with_slice::<T, _>(x, |x| {
                    with_slice(weight, |w| {
                        with_slice(bias, |b| fused::layer_norm(x, w, b, T::of(eps)))
                    })
                })???;
                Ok(LayerNormOutput {
                    output: tensor(output, dims)?,
                    normalized: tensor(normalized, dims)?,
                    rstd: tensor(rstd, &rstd_dims)?,
                })
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
            by_dtype!(grad_y, |T| {
                let values = with_slice::<T, _>(grad_y, |g| {
                    with_slice(weight, |w| {
                        with_slice(normalized, |h| {
                            with_slice(rstd, |r| fused::layer_norm_backward_input(g, w, h, r))
                        })
                    })
                })????;
                tensor(values, grad_y.dims())
            })
        })
    }

    fn layer_norm_backward_weight(
        &self,
        grad_y: &Tensor,
        normalized: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        run("layer_norm_backward_weight", || {
            let (_, width) = rows_and_width(grad_y);
            by_dtype!(grad_y, |T| {
                let (gw, gb) = with_slice::<T, _>(grad_y, |g| {
                    with_slice(normalized, |h| {
                        fused::layer_norm_backward_weight(g, h, width)
                    })
                })??;
                Ok((tensor(gw, &[width])?, tensor(gb, &[width])?))
            })
        })
    }

    fn causal_attention(
        &self,
        qkv: &Tensor,
        start: usize,
        n_head: usize,
        scale: f64,
    ) -> Result<AttentionOutput> {
        run("causal_attention", || {
            let heads = heads_of(qkv, n_head, start)?;
            let dims = qkv.dims3()?;
            by_dtype!(qkv, |T| {
                let (context, probs) =
                    with_slice::<T, _>(qkv, |q| attention::attention(q, heads, T::of(scale)))?
                        .ok_or_else(|| {
                            candle_core::Error::Msg(format!(
                                "qkv {:?} has the wrong size or no query from {start}",
                                qkv.dims()
                            ))
                        })?;
                Ok(AttentionOutput {
                    context: tensor(context, &[dims.0, dims.1 - start, dims.2 / 3])?,
                    probs: tensor(probs, &[dims.0, n_head, dims.1 - start, dims.1])?,
                })
            })
        })
    }

    fn causal_attention_backward(
        &self,
        qkv: &Tensor,
        probs: &Tensor,
        grad_context: &Tensor,
        start: usize,
        n_head: usize,
        scale: f64,
    ) -> Result<Tensor> {
        run("causal_attention_backward", || {
            let heads = heads_of(qkv, n_head, start)?;
            by_dtype!(qkv, |T| {
                let grad = with_slice::<T, _>(qkv, |q| {
                    with_slice(probs, |p| {
                        with_slice(grad_context, |g| {
                            attention::attention_backward(q, p, g, heads, T::of(scale))
                        })
                    })
                })???
                .ok_or_else(|| {
                    candle_core::Error::Msg(format!(
                        "sizes differ: qkv {:?}, probs {:?}, grad_context {:?}",
                        qkv.dims(),
                        probs.dims(),
                        grad_context.dims()
                    ))
                })?;
                tensor(grad, qkv.dims())
            })
        })
    }

    fn gelu_new(&self, x: &Tensor) -> Result<Tensor> {
        run("gelu_new", || by_dtype!(x, |T| map1::<T>(x, fused::gelu)))
    }

    fn gelu_new_backward(&self, x: &Tensor, grad_y: &Tensor) -> Result<Tensor> {
        run("gelu_new_backward", || {
            by_dtype!(x, |T| map2::<T>(x, grad_y, fused::gelu_backward))
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
