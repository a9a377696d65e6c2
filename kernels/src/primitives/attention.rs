//! The causal attention core on CPU slices, with no copies of the heads: every per-head product
//! reads its operands where they lie, inside `qkv: [B, T, 3·H·D]` (query, key and value along the
//! last dimension, the heads inside each) and the context `[B, T, H·D]`, through their strides,
//! and writes its result straight into its place in the output. The score scale is folded into
//! the products.

use std::mem::MaybeUninit;

use super::fused;
use super::products::parallelism;
use super::slices::{Output, Real};

/// The sizes of an attention core: batch `B`, sequence `T` (the keys), heads `H` of width `D`,
/// and the first query's position `start`: the queries are positions `start..T` (a whole
/// sequence has `start = 0`; a chunk of one, Seq1F1B's, reads the keys of the chunks before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Heads {
    pub(crate) batch: usize,
    pub(crate) seq: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) start: usize,
}

impl Heads {
    /// `H·D`, the model width.
    fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The number of queries, `T - start`.
    fn queries(&self) -> usize {
        self.seq.saturating_sub(self.start)
    }

    /// The offsets of every `(batch, head)` pair, batch-major, with the pair's index.
    fn pairs(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (0..self.batch).flat_map(move |b| (0..self.heads).map(move |h| (b * self.heads + h, b, h)))
    }
}

/// A matrix inside a slice: element `(i, j)` at `offset + i·row_stride + j·col_stride`.
#[derive(Clone, Copy, Debug)]
struct Strided {
    offset: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Strided {
    /// A matrix stored row-major at `offset` with rows `row_stride` apart.
    fn rows(offset: usize, row_stride: usize) -> Strided {
        Strided {
            offset,
            row_stride,
            col_stride: 1,
        }
    }

    /// The transpose of that matrix (element `(i, j)` is the stored `(j, i)`).
    fn transposed(offset: usize, row_stride: usize) -> Strided {
        Strided {
            offset,
            row_stride: 1,
            col_stride: row_stride,
        }
    }

    /// Whether a `rows × cols` matrix so placed lies inside a slice of `len` elements.
    fn fits(&self, rows: usize, cols: usize, len: usize) -> bool {
        if rows == 0 || cols == 0 {
            return self.offset <= len;
        }
        let last = (rows - 1)
            .checked_mul(self.row_stride)
            .and_then(|r| Some(r + (cols - 1).checked_mul(self.col_stride)?))
            .and_then(|e| e.checked_add(self.offset));
        last.is_some_and(|last| last < len)
    }
}

/// `dst = scale · a · b` for `a: m × k`, `b: k × n`, each placed in its slice as said; None
/// (nothing written) when a matrix does not fit its slice.
#[allow(clippy::too_many_arguments)]
fn product_into<T: Real>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [MaybeUninit<T>],
    dst_at: Strided,
    a: &[T],
    a_at: Strided,
    b: &[T],
    b_at: Strided,
    scale: T,
) -> Option<()> {
    if !(dst_at.fits(m, n, dst.len()) && a_at.fits(m, k, a.len()) && b_at.fits(k, n, b.len())) {
        return None;
    }
    if m == 0 || n == 0 {
        return Some(());
    }
    if k == 0 {
        for i in 0..m {
            for j in 0..n {
                dst[dst_at.offset + i * dst_at.row_stride + j * dst_at.col_stride].write(T::ZERO);
            }
        }
        return Some(());
    }
    // SAFETY: the three matrices lie inside their slices (checked above: the last element of
    // each is in bounds, and every other element's index is smaller); `gemm` reads `a` and `b`
    // and writes each of the `m·n` elements of `dst` once without reading it (`read_dst` is
    // false), so the uninitialised memory is never read; `dst` is a distinct mutable slice, so
    // it does not overlap the operands.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().cast::<T>().add(dst_at.offset),
            dst_at.col_stride as isize,
            dst_at.row_stride as isize,
            false,
            a.as_ptr().add(a_at.offset),
            a_at.col_stride as isize,
            a_at.row_stride as isize,
            b.as_ptr().add(b_at.offset),
            b_at.col_stride as isize,
            b_at.row_stride as isize,
            T::ZERO,
            scale,
            false,
            false,
            false,
            parallelism(),
        );
    }
    Some(())
}

/// `dst`'s `Tq × T` block of the (batch, head) pair `pair`: `scale · a · bᵀ` for the `Tq × D`
/// matrix `a` (placed in its slice as said) and the head `b` of `qkv` whose rows start at
/// `b_offset`.
fn times_head_transposed<T: Real>(
    h: Heads,
    dst: &mut Output<T>,
    pair: usize,
    (a, a_at): (&[T], Strided),
    qkv: &[T],
    b_offset: usize,
    scale: T,
) -> Option<()> {
    let (tq, t) = (h.queries(), h.seq);
    product_into(
        (tq, t, h.head_dim),
        dst.slots(),
        Strided::rows(pair * tq * t, t),
        a,
        a_at,
        qkv,
        Strided::transposed(b_offset, 3 * h.width()),
        scale,
    )
}

/// Causal attention of the queries `start..T` of `qkv` over its keys `0..T`:
/// `(context [B, T - start, H·D], probs [B, H, T - start, T])` with `probs` the causal softmax
/// of `scale · q·kᵀ` per head and the context `probs · v`, heads side by side. None when `qkv`
/// does not hold `B·T·3·H·D` elements or `start` is past the sequence.
pub(crate) fn attention<T: Real>(qkv: &[T], h: Heads, scale: T) -> Option<(Vec<T>, Vec<T>)> {
    let (t, d, width, tq) = (h.seq, h.head_dim, h.width(), h.queries());
    let row = 3 * width;
    if qkv.len() != h.batch.checked_mul(t)?.checked_mul(row)? || h.start >= t.max(1) {
        return None;
    }
    let block = tq * t;
    let mut scores = Output::new(h.batch * h.heads * block);
    for (pair, b, head) in h.pairs() {
        let base = b * t * row + head * d;
        let query = (qkv, Strided::rows(base + h.start * row, row));
        times_head_transposed(h, &mut scores, pair, query, qkv, base + width, scale)?;
    }
    // SAFETY: the products wrote every `Tq × T` block, one per (batch, head) pair.
    let scores = unsafe { scores.assume_written() };
    let probs = fused::causal_softmax(&scores, tq, t, h.start);
    drop(scores);
    let mut context = Output::new(h.batch * tq * width);
    for (pair, b, head) in h.pairs() {
        product_into(
            (tq, d, t),
            context.slots(),
            Strided::rows(b * tq * width + head * d, width),
            &probs,
            Strided::rows(pair * block, t),
            qkv,
            Strided::rows(b * t * row + 2 * width + head * d, row),
            T::ONE,
        )?;
    }
    // SAFETY: each (batch, head) product wrote its `Tq × D` block of the context, and the
    // blocks of all heads tile every row of every batch.
    Some((unsafe { context.assume_written() }, probs))
}

/// The backward of [`attention`]: the gradient of `qkv` (`[B, T, 3·H·D]`) from the context's
/// gradient `grad_context` (`[B, T - start, H·D]`), with `probs` and `qkv` of the forward. The
/// queries before `start` get no gradient (zeros); the keys and values of every position do
/// (those before `start` belong to earlier chunks). None when a size does not match.
pub(crate) fn attention_backward<T: Real>(
    qkv: &[T],
    probs: &[T],
    grad_context: &[T],
    h: Heads,
    scale: T,
) -> Option<Vec<T>> {
    let (t, d, width, tq) = (h.seq, h.head_dim, h.width(), h.queries());
    let row = 3 * width;
    let block = tq * t;
    if qkv.len() != h.batch.checked_mul(t)?.checked_mul(row)?
        || grad_context.len() != h.batch.checked_mul(tq)?.checked_mul(width)?
        || probs.len() != (h.batch * h.heads).checked_mul(block)?
        || h.start >= t.max(1)
    {
        return None;
    }
    let mut grad_probs = Output::new(probs.len());
    let mut grad_qkv = Output::new(qkv.len());
    for (pair, b, head) in h.pairs() {
        let (base, context_at) = (b * t * row + head * d, b * tq * width + head * d);
        // grad_probs = grad_context_h · vᵀ
        let grad_context_h = (grad_context, Strided::rows(context_at, width));
        let value = base + 2 * width;
        times_head_transposed(h, &mut grad_probs, pair, grad_context_h, qkv, value, T::ONE)?;
        // grad_v = probsᵀ · grad_context_h
        product_into(
            (t, d, tq),
            grad_qkv.slots(),
            Strided::rows(base + 2 * width, row),
            probs,
            Strided::transposed(pair * block, t),
            grad_context,
            Strided::rows(context_at, width),
            T::ONE,
        )?;
    }
    // SAFETY: the products wrote every `Tq × T` block, one per (batch, head) pair.
    let grad_probs = unsafe { grad_probs.assume_written() };
    let grad_scores = fused::softmax_backward(probs, &grad_probs, t);
    drop(grad_probs);
    for (pair, b, head) in h.pairs() {
        let base = b * t * row + head * d;
        let queries = base + h.start * row;
        // The queries of earlier chunks get nothing here (a product over no terms: zeros).
        product_into(
            (h.start, d, 0),
            grad_qkv.slots(),
            Strided::rows(base, row),
            &grad_scores,
            Strided::rows(0, 0),
            qkv,
            Strided::rows(0, 0),
            scale,
        )?;
        // grad_q = scale · grad_scores · k
        product_into(
            (tq, d, t),
            grad_qkv.slots(),
            Strided::rows(queries, row),
            &grad_scores,
            Strided::rows(pair * block, t),
            qkv,
            Strided::rows(base + width, row),
            scale,
        )?;
        // grad_k = scale · grad_scoresᵀ · q
        product_into(
            (t, d, tq),
            grad_qkv.slots(),
            Strided::rows(base + width, row),
            &grad_scores,
            Strided::transposed(pair * block, t),
            qkv,
            Strided::rows(queries, row),
            scale,
        )?;
    }
    // SAFETY: for every (batch, head) pair the products wrote its `T × D` blocks of the query
    // (zeros before `start`), key and value gradients, which tile every row of `grad_qkv`.
    Some(unsafe { grad_qkv.assume_written() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention by definition, in f64, on `[B, T, 3·H·D]`.
    fn naive(qkv: &[f64], h: Heads, scale: f64) -> (Vec<f64>, Vec<f64>) {
        let (t, d, width) = (h.seq, h.head_dim, h.width());
        let at = |b: usize, i: usize, part: usize, head: usize, j: usize| {
            qkv[(b * t + i) * 3 * width + part * width + head * d + j]
        };
        let mut probs = vec![0.0; h.batch * h.heads * t * t];
        let mut context = vec![0.0; h.batch * t * width];
        for b in 0..h.batch {
            for head in 0..h.heads {
                for i in 0..t {
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            (0..d)
                                .map(|x| at(b, i, 0, head, x) * at(b, j, 1, head, x))
                                .sum::<f64>()
                                * scale
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
                    for (j, s) in scores.iter().enumerate() {
                        let p = (s - max).exp() / sum;
                        probs[((b * h.heads + head) * t + i) * t + j] = p;
                        for x in 0..d {
                            context[(b * t + i) * width + head * d + x] += p * at(b, j, 2, head, x);
                        }
                    }
                }
            }
        }
        (context, probs)
    }

    fn sizes() -> Heads {
        Heads {
            batch: 2,
            seq: 5,
            heads: 3,
            head_dim: 4,
            start: 0,
        }
    }

    fn input(h: Heads) -> Vec<f64> {
        (0..h.batch * h.seq * 3 * h.width())
            .map(|i| ((i * 37 % 101) as f64 - 50.0) * 0.02)
            .collect()
    }

    #[test]
    fn attention_matches_the_definition() {
        let h = sizes();
        let qkv = input(h);
        let (context, probs) = attention(&qkv, h, 0.5).unwrap();
        let (want_context, want_probs) = naive(&qkv, h, 0.5);
        for (got, want) in context
            .iter()
            .zip(&want_context)
            .chain(probs.iter().zip(&want_probs))
        {
            assert!((got - want).abs() < 1e-12, "{got} vs {want}");
        }
        assert!(attention(&qkv[1..], h, 0.5).is_none());
    }

    #[test]
    fn the_backward_matches_differences_of_the_forward() {
        let h = sizes();
        let qkv = input(h);
        let (context, probs) = attention(&qkv, h, 0.5).unwrap();
        // The loss Σ context ⊙ weights; its context gradient is `weights`.
        let weights: Vec<f64> = (0..context.len())
            .map(|i| ((i % 7) as f64 - 3.0) * 0.1)
            .collect();
        let grad = attention_backward(&qkv, &probs, &weights, h, 0.5).unwrap();
        let loss = |x: &[f64]| -> f64 {
            let (c, _) = attention(x, h, 0.5).unwrap();
            c.iter().zip(&weights).map(|(a, b)| a * b).sum()
        };
        let step = 1e-6;
        for i in (0..qkv.len()).step_by(7) {
            let (mut up, mut down) = (qkv.clone(), qkv.clone());
            up[i] += step;
            down[i] -= step;
            let numeric = (loss(&up) - loss(&down)) / (2.0 * step);
            assert!(
                (grad[i] - numeric).abs() < 1e-7,
                "element {i}: {} vs {numeric}",
                grad[i]
            );
        }
        assert!(attention_backward(&qkv, &probs[1..], &weights, h, 0.5).is_none());
    }

    #[test]
    fn chunks_of_a_sequence_attend_and_backpropagate_like_the_whole() {
        let h = sizes();
        let (t, width) = (h.seq, h.width());
        let qkv = input(h);
        let (context, _) = attention(&qkv, h, 0.5).unwrap();
        let weights: Vec<f64> = (0..context.len())
            .map(|i| ((i % 7) as f64 - 3.0) * 0.1)
            .collect();
        let whole = attention_backward(&qkv, &attention(&qkv, h, 0.5).unwrap().1, &weights, h, 0.5)
            .unwrap();
        // Chunks [0, 2), [2, 5): each over the keys up to its end, the gradients summed.
        let mut summed = vec![0.0; qkv.len()];
        for (begin, end) in [(0, 2), (2, 5)] {
            let chunk = Heads {
                seq: end,
                start: begin,
                ..h
            };
            let rows = |x: &[f64], w: usize, from: usize, to: usize| -> Vec<f64> {
                (0..h.batch)
                    .flat_map(|b| x[(b * t + from) * w..(b * t + to) * w].to_vec())
                    .collect()
            };
            let prefix = rows(&qkv, 3 * width, 0, end);
            let (got, probs) = attention(&prefix, chunk, 0.5).unwrap();
            for (a, b) in got.iter().zip(rows(&context, width, begin, end)) {
                assert!((a - b).abs() < 1e-12, "{a} vs {b}");
            }
            let grad = rows(&weights, width, begin, end);
            let part = attention_backward(&prefix, &probs, &grad, chunk, 0.5).unwrap();
            for b in 0..h.batch {
                for i in 0..end {
                    for j in 0..3 * width {
                        summed[(b * t + i) * 3 * width + j] += part[(b * end + i) * 3 * width + j];
                    }
                }
            }
        }
        for (a, b) in summed.iter().zip(&whole) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
        assert!(attention(&qkv, Heads { start: t, ..h }, 0.5).is_none());
    }
}
