//! The element-wise and row-wise work of the layers as single passes over slices: each function
//! reads its inputs once and writes one output (or two), with no intermediate tensors. Rows are
//! runs of `width` elements; every sum runs in row order, so results do not depend on anything but
//! the inputs. Each is a [`vectorized_fn!`]: compiled for AVX-512, AVX2 and the baseline and run
//! at the widest the CPU has, with the same results at every width. Bodies are plain loops over
//! zipped slices so that all their work is compiled inside those builds.

use super::simd::vectorized_fn;
use super::slices::{Output, Real};

/// `√(2/π)`, the GELU tanh approximation's scale.
const SQRT_TWO_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the GELU tanh approximation.
const GELU_CUBIC: f64 = 0.044_715;

vectorized_fn! {
    /// GPT-2's `gelu_new`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
    pub(crate) fn gelu<T: Real>(x: &[T]) -> Vec<T> {
        let (c, a, half) = (T::of(SQRT_TWO_OVER_PI), T::of(GELU_CUBIC), T::of(0.5));
        let mut out = Output::new(x.len());
        for (o, &x) in out.slots().iter_mut().zip(x) {
            let t = (c * (x + a * x * x * x)).tanh();
            o.write(half * x * (T::ONE + t));
        }
        // SAFETY: the loop wrote every slot (as many as `x` has elements).
        unsafe { out.assume_written() }
    }
}

vectorized_fn! {
    /// `grad_y ⊙ gelu_new'(x)`: with `u = c·(x + a·x³)` and `t = tanh(u)`,
    /// `gelu'(x) = 0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3a·x²)`.
    pub(crate) fn gelu_backward<T: Real>(x: &[T], grad_y: &[T]) -> Vec<T> {
        let (c, a, half) = (T::of(SQRT_TWO_OVER_PI), T::of(GELU_CUBIC), T::of(0.5));
        let three_a = T::of(3.0 * GELU_CUBIC);
        let mut out = Output::new(x.len().min(grad_y.len()));
        for ((o, &x), &g) in out.slots().iter_mut().zip(x).zip(grad_y) {
            let x2 = x * x;
            let t = (c * (x + a * x2 * x)).tanh();
            let slope =
                half * (T::ONE + t) + half * x * (T::ONE - t * t) * c * (T::ONE + three_a * x2);
            o.write(g * slope);
        }
        // SAFETY: the loop wrote every slot (as many as the shorter input has elements).
        unsafe { out.assume_written() }
    }
}

vectorized_fn! {
    /// The sum of the rows of `x` (rows of `width`): `[width]`.
    pub(crate) fn row_sum<T: Real>(x: &[T], width: usize) -> Vec<T> {
        let mut sum = vec![T::ZERO; width];
        for row in x.chunks_exact(width.max(1)) {
            for (s, &v) in sum.iter_mut().zip(row) {
                *s += v;
            }
        }
        sum
    }
}

vectorized_fn! {
    /// `x + row` on every row.
    pub(crate) fn add_row<T: Real>(x: &[T], row: &[T]) -> Vec<T> {
        let width = row.len().max(1);
        let mut out = Output::new(x.len() / width * width);
        for (o, chunk) in out.slots().chunks_exact_mut(width).zip(x.chunks_exact(width)) {
            for ((o, &a), &b) in o.iter_mut().zip(chunk).zip(row) {
                o.write(a + b);
            }
        }
        // SAFETY: every slot lies in one of the whole rows the loop visits, and each row is
        // written through (`row` has `width` elements).
        unsafe { out.assume_written() }
    }
}

vectorized_fn! {
    /// `a + b`.
    pub(crate) fn add<T: Real>(a: &[T], b: &[T]) -> Vec<T> {
        let mut out = Output::new(a.len().min(b.len()));
        for ((o, &a), &b) in out.slots().iter_mut().zip(a).zip(b) {
            o.write(a + b);
        }
        // SAFETY: the loop wrote every slot (as many as the shorter input has elements).
        unsafe { out.assume_written() }
    }
}

vectorized_fn! {
    /// `sum += x`, element by element (the shorter length).
    pub(crate) fn add_into<T: Real>(sum: &mut [T], x: &[T]) {
        for (s, &v) in sum.iter_mut().zip(x) {
            *s += v;
        }
    }
}

vectorized_fn! {
    /// `a ⊙ b`.
    pub(crate) fn mul<T: Real>(a: &[T], b: &[T]) -> Vec<T> {
        let mut out = Output::new(a.len().min(b.len()));
        for ((o, &a), &b) in out.slots().iter_mut().zip(a).zip(b) {
            o.write(a * b);
        }
        // SAFETY: the loop wrote every slot (as many as the shorter input has elements).
        unsafe { out.assume_written() }
    }
}

vectorized_fn! {
    /// `factor · x`.
    pub(crate) fn scale<T: Real>(x: &[T], factor: T) -> Vec<T> {
        let mut out = Output::new(x.len());
        for (o, &v) in out.slots().iter_mut().zip(x) {
            o.write(factor * v);
        }
        // SAFETY: the loop wrote every slot (as many as `x` has elements).
        unsafe { out.assume_written() }
    }
}

vectorized_fn! {
    /// Layer norm of every row: `(output, normalized, rstd)` with `normalized = (x - mean)·rstd`,
    /// `rstd = 1/√(var + eps)` (one per row), `output = normalized·weight + bias`.
    pub(crate) fn layer_norm<T: Real>(
        x: &[T],
        weight: &[T],
        bias: &[T],
        eps: T,
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let width = weight.len().max(1);
        let n = T::of(width as f64);
        let mut output = vec![T::ZERO; x.len()];
        let mut normalized = vec![T::ZERO; x.len()];
        let mut rstds = vec![T::ZERO; x.len() / width];
        for (((row, out), norm), rstd) in x
            .chunks_exact(width)
            .zip(output.chunks_exact_mut(width))
            .zip(normalized.chunks_exact_mut(width))
            .zip(rstds.iter_mut())
        {
            let mut sum = T::ZERO;
            for &v in row {
                sum += v;
            }
            let mean = sum / n;
            let mut squares = T::ZERO;
            for &v in row {
                let d = v - mean;
                squares += d * d;
            }
            let r = T::ONE / (squares / n + eps).sqrt();
            *rstd = r;
            for ((((o, h), &v), &w), &b) in out.iter_mut().zip(norm).zip(row).zip(weight).zip(bias)
            {
                let x_hat = (v - mean) * r;
                *h = x_hat;
                *o = x_hat * w + b;
            }
        }
        (output, normalized, rstds)
    }
}

vectorized_fn! {
    /// The input gradient of layer norm: per row, with `g = grad_y ⊙ weight`,
    /// `rstd·(g - mean(g) - x̂·mean(g ⊙ x̂))`.
    pub(crate) fn layer_norm_backward_input<T: Real>(
        grad_y: &[T],
        weight: &[T],
        normalized: &[T],
        rstd: &[T],
    ) -> Vec<T> {
        let width = weight.len().max(1);
        let n = T::of(width as f64);
        let mut out = vec![T::ZERO; grad_y.len()];
        for (((gy, xhat), &r), o) in grad_y
            .chunks_exact(width)
            .zip(normalized.chunks_exact(width))
            .zip(rstd)
            .zip(out.chunks_exact_mut(width))
        {
            let (mut sum_g, mut sum_gx) = (T::ZERO, T::ZERO);
            for ((&g, &w), &h) in gy.iter().zip(weight).zip(xhat) {
                let g = g * w;
                sum_g += g;
                sum_gx += g * h;
            }
            let (mean_g, mean_gx) = (sum_g / n, sum_gx / n);
            for (((o, &g), &w), &h) in o.iter_mut().zip(gy).zip(weight).zip(xhat) {
                *o = (g * w - mean_g - h * mean_gx) * r;
            }
        }
        out
    }
}

vectorized_fn! {
    /// The parameter gradients of layer norm: `(Σ grad_y ⊙ x̂, Σ grad_y)` over the rows.
    pub(crate) fn layer_norm_backward_weight<T: Real>(
        grad_y: &[T],
        normalized: &[T],
        width: usize,
    ) -> (Vec<T>, Vec<T>) {
        let width = width.max(1);
        let mut grad_weight = vec![T::ZERO; width];
        let mut grad_bias = vec![T::ZERO; width];
        for (gy, xhat) in grad_y
            .chunks_exact(width)
            .zip(normalized.chunks_exact(width))
        {
            for (((gw, gb), &g), &h) in grad_weight.iter_mut().zip(&mut grad_bias).zip(gy).zip(xhat)
            {
                *gw += g * h;
                *gb += g;
            }
        }
        (grad_weight, grad_bias)
    }
}

vectorized_fn! {
    /// Causal softmax of `[.., queries, keys]` scores whose queries are the sequence's positions
    /// `start..start + queries` and keys its positions `0..keys`: row `i` of each block is the
    /// softmax of its first `start + i + 1` entries (the keys up to the query), the rest 0. A
    /// whole sequence is `start = 0`, `queries = keys`; a chunk of it (Seq1F1B) starts later.
    pub(crate) fn causal_softmax<T: Real>(
        scores: &[T],
        queries: usize,
        keys: usize,
        start: usize,
    ) -> Vec<T> {
        let (queries, t) = (queries.max(1), keys.max(1));
        let mut out = vec![T::ZERO; scores.len()];
        for (r, (row, probs)) in scores
            .chunks_exact(t)
            .zip(out.chunks_exact_mut(t))
            .enumerate()
        {
            let visible = (start + r % queries + 1).min(t);
            let row = &row[..visible];
            let mut max = row[0];
            for &v in row {
                max = max.larger(v);
            }
            let mut sum = T::ZERO;
            for (p, &v) in probs.iter_mut().zip(row) {
                *p = (v - max).exp();
                sum += *p;
            }
            let inverse = T::ONE / sum;
            for p in &mut probs[..visible] {
                *p *= inverse;
            }
        }
        out
    }
}

vectorized_fn! {
    /// The gradient of the softmax input, per row: `probs ⊙ (grad_probs - Σ grad_probs ⊙ probs)`.
    pub(crate) fn softmax_backward<T: Real>(probs: &[T], grad_probs: &[T], width: usize) -> Vec<T> {
        let width = width.max(1);
        let mut out = vec![T::ZERO; probs.len()];
        for ((p, g), o) in probs
            .chunks_exact(width)
            .zip(grad_probs.chunks_exact(width))
            .zip(out.chunks_exact_mut(width))
        {
            let mut dot = T::ZERO;
            for (&p, &g) in p.iter().zip(g) {
                dot += p * g;
            }
            for ((o, &p), &g) in o.iter_mut().zip(p).zip(g) {
                *o = p * (g - dot);
            }
        }
        out
    }
}

vectorized_fn! {
    /// `Σ x²` in f64, over 16 interleaved partial sums added in a fixed order at the end (the
    /// same bits for the same input, at any instruction width).
    pub(crate) fn squared_norm<T: Real>(x: &[T]) -> f64 {
        const LANES: usize = 16;
        let mut partial = [0.0f64; LANES];
        let mut chunks = x.chunks_exact(LANES);
        for chunk in &mut chunks {
            for (p, &v) in partial.iter_mut().zip(chunk) {
                let v = v.wide();
                *p += v * v;
            }
        }
        for (p, &v) in partial.iter_mut().zip(chunks.remainder()) {
            let v = v.wide();
            *p += v * v;
        }
        let mut total = 0.0;
        for p in partial {
            total += p;
        }
        total
    }
}

/// The scalars of one AdamW update, in the element type (see [`adamw`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWScalars<T> {
    /// The gradient's factor (clipping).
    pub(crate) grad_scale: T,
    /// `β1` and `1 - β1`.
    pub(crate) beta1: T,
    pub(crate) one_minus_beta1: T,
    /// `β2` and `1 - β2`.
    pub(crate) beta2: T,
    pub(crate) one_minus_beta2: T,
    /// `1 / √(1 - β2^t)`.
    pub(crate) inverse_bias2_sqrt: T,
    /// `ε`.
    pub(crate) eps: T,
    /// `lr / (1 - β1^t)`.
    pub(crate) step_size: T,
    /// `1 - lr·λ` (1 without decay).
    pub(crate) decay: T,
}

vectorized_fn! {
    /// One AdamW update of every element: `(param, m, v)` from the parameter, its gradient and
    /// the moments. Each element sees the same operations, in the same order and with the same
    /// roundings, as the composite of candle ops it replaces (`affine` as `x·a + b`), so the
    /// bits are those of the unfused update:
    /// `g = s·g`, `m = β1·m + (1-β1)·g`, `v = β2·v + (1-β2)·g²`,
    /// `p = decay·p - step·m / (√v·inv + ε)`.
    pub(crate) fn adamw<T: Real>(
        param: &[T],
        grad: &[T],
        m: &[T],
        v: &[T],
        k: &AdamWScalars<T>,
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let n = param.len().min(grad.len()).min(m.len()).min(v.len());
        let (mut new_p, mut new_m, mut new_v) = (Output::new(n), Output::new(n), Output::new(n));
        let zero = T::ZERO;
        for (((((np, nm), nv), &p), &g), (&m, &v)) in new_p
            .slots()
            .iter_mut()
            .zip(new_m.slots().iter_mut())
            .zip(new_v.slots().iter_mut())
            .zip(param)
            .zip(grad)
            .zip(m.iter().zip(v))
        {
            let g = g * k.grad_scale + zero;
            let m = (m * k.beta1 + zero) + (g * k.one_minus_beta1 + zero);
            let v = (v * k.beta2 + zero) + ((g * g) * k.one_minus_beta2 + zero);
            let denom = v.sqrt() * k.inverse_bias2_sqrt + k.eps;
            let update = (m / denom) * k.step_size + zero;
            np.write((p * k.decay + zero) - update);
            nm.write(m);
            nv.write(v);
        }
        // SAFETY: the loop wrote every slot of the three (`n` is the shortest input's length).
        unsafe { (new_p.assume_written(), new_m.assume_written(), new_v.assume_written()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
        }
    }

    #[test]
    fn gelu_and_its_slope_match_the_formula_and_a_difference() {
        let x: Vec<f64> = (-30..=30).map(|i| f64::from(i) * 0.2).collect();
        let y = gelu(&x);
        for (&x, &y) in x.iter().zip(&y) {
            let expected =
                0.5 * x * (1.0 + (SQRT_TWO_OVER_PI * (x + GELU_CUBIC * x.powi(3))).tanh());
            assert!((y - expected).abs() < 1e-15);
        }
        let ones = vec![1.0; x.len()];
        let slope = gelu_backward(&x, &ones);
        let h = 1e-6;
        let plus: Vec<f64> = x.iter().map(|v| v + h).collect();
        let minus: Vec<f64> = x.iter().map(|v| v - h).collect();
        for ((s, a), b) in slope.iter().zip(gelu(&plus)).zip(gelu(&minus)) {
            assert!((s - (a - b) / (2.0 * h)).abs() < 1e-8);
        }
    }

    #[test]
    fn row_work_matches_naive_sums() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        close(&row_sum(&x, 3), &[5.0, 7.0, 9.0]);
        close(
            &add_row(&x, &[1.0, 0.0, -1.0]),
            &[2.0, 2.0, 2.0, 5.0, 5.0, 5.0],
        );
        let (out, xhat, rstd) = layer_norm(&x, &[2.0, 2.0, 2.0], &[1.0, 1.0, 1.0], 0.0);
        let r = 1.0 / (2.0f64 / 3.0).sqrt();
        close(&rstd, &[r, r]);
        close(&xhat, &[-r, 0.0, r, -r, 0.0, r]);
        close(&out[..3], &[1.0 - 2.0 * r, 1.0, 1.0 + 2.0 * r]);
        let (gw, gb) = layer_norm_backward_weight(&x, &xhat, 3);
        close(&gb, &[5.0, 7.0, 9.0]);
        close(&gw, &[-r - 4.0 * r, 0.0, 3.0 * r + 6.0 * r]);
        let probs = causal_softmax(&[0.0, 9.0, 1.0, 1.0], 2, 2, 0);
        close(&probs, &[1.0, 0.0, 0.5, 0.5]);
        close(&softmax_backward(&[0.5, 0.5], &[1.0, 3.0], 2), &[-0.5, 0.5]);
    }
}
