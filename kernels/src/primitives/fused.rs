//! The element-wise and row-wise work of the layers as single passes over slices: each function
//! reads its inputs once and writes one output (or two), with no intermediate tensors. Rows are
//! runs of `width` elements; every sum runs in row order, so results do not depend on anything but
//! the inputs.

use super::slices::Real;

/// `√(2/π)`, the GELU tanh approximation's scale.
const SQRT_TWO_OVER_PI: f64 = 0.797_884_560_802_865_4;
/// The cubic coefficient of the GELU tanh approximation.
const GELU_CUBIC: f64 = 0.044_715;

/// GPT-2's `gelu_new`: `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
pub(crate) fn gelu<T: Real>(x: &[T]) -> Vec<T> {
    let (c, a, half) = (T::of(SQRT_TWO_OVER_PI), T::of(GELU_CUBIC), T::of(0.5));
    x.iter()
        .map(|&x| {
            let t = (c * (x + a * x * x * x)).tanh();
            half * x * (T::ONE + t)
        })
        .collect()
}

/// `grad_y ⊙ gelu_new'(x)`: with `u = c·(x + a·x³)` and `t = tanh(u)`,
/// `gelu'(x) = 0.5·(1 + t) + 0.5·x·(1 - t²)·c·(1 + 3a·x²)`.
pub(crate) fn gelu_backward<T: Real>(x: &[T], grad_y: &[T]) -> Vec<T> {
    let (c, a, half) = (T::of(SQRT_TWO_OVER_PI), T::of(GELU_CUBIC), T::of(0.5));
    let three_a = T::of(3.0 * GELU_CUBIC);
    x.iter()
        .zip(grad_y)
        .map(|(&x, &g)| {
            let x2 = x * x;
            let t = (c * (x + a * x2 * x)).tanh();
            let slope = half * (T::ONE + t) + half * x * (T::ONE - t * t) * c * (T::ONE + three_a * x2);
            g * slope
        })
        .collect()
}

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

/// `x + row` on every row.
pub(crate) fn add_row<T: Real>(x: &[T], row: &[T]) -> Vec<T> {
    let mut out = Vec::with_capacity(x.len());
    for chunk in x.chunks_exact(row.len().max(1)) {
        out.extend(chunk.iter().zip(row).map(|(&a, &b)| a + b));
    }
    out
}

/// `a + b`.
pub(crate) fn add<T: Real>(a: &[T], b: &[T]) -> Vec<T> {
    a.iter().zip(b).map(|(&a, &b)| a + b).collect()
}

/// `a ⊙ b`.
pub(crate) fn mul<T: Real>(a: &[T], b: &[T]) -> Vec<T> {
    a.iter().zip(b).map(|(&a, &b)| a * b).collect()
}

/// `factor · x`.
pub(crate) fn scale<T: Real>(x: &[T], factor: T) -> Vec<T> {
    x.iter().map(|&v| factor * v).collect()
}

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
    let mut output = Vec::with_capacity(x.len());
    let mut normalized = Vec::with_capacity(x.len());
    let mut rstds = Vec::with_capacity(x.len() / width);
    for row in x.chunks_exact(width) {
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
        let rstd = T::ONE / (squares / n + eps).sqrt();
        rstds.push(rstd);
        for ((&v, &w), &b) in row.iter().zip(weight).zip(bias) {
            let h = (v - mean) * rstd;
            normalized.push(h);
            output.push(h * w + b);
        }
    }
    (output, normalized, rstds)
}

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
    let mut out = Vec::with_capacity(grad_y.len());
    for ((gy, xhat), &r) in grad_y
        .chunks_exact(width)
        .zip(normalized.chunks_exact(width))
        .zip(rstd)
    {
        let (mut sum_g, mut sum_gx) = (T::ZERO, T::ZERO);
        for ((&g, &w), &h) in gy.iter().zip(weight).zip(xhat) {
            let g = g * w;
            sum_g += g;
            sum_gx += g * h;
        }
        let (mean_g, mean_gx) = (sum_g / n, sum_gx / n);
        out.extend(
            gy.iter()
                .zip(weight)
                .zip(xhat)
                .map(|((&g, &w), &h)| (g * w - mean_g - h * mean_gx) * r),
        );
    }
    out
}

/// The parameter gradients of layer norm: `(Σ grad_y ⊙ x̂, Σ grad_y)` over the rows.
pub(crate) fn layer_norm_backward_weight<T: Real>(
    grad_y: &[T],
    normalized: &[T],
    width: usize,
) -> (Vec<T>, Vec<T>) {
    let width = width.max(1);
    let mut grad_weight = vec![T::ZERO; width];
    let mut grad_bias = vec![T::ZERO; width];
    for (gy, xhat) in grad_y.chunks_exact(width).zip(normalized.chunks_exact(width)) {
        for (((gw, gb), &g), &h) in grad_weight.iter_mut().zip(&mut grad_bias).zip(gy).zip(xhat) {
            *gw += g * h;
            *gb += g;
        }
    }
    (grad_weight, grad_bias)
}

/// Causal softmax of `[.., t, t]` scores: row `i` of each `t × t` block is the softmax of its
/// first `i + 1` entries (the keys up to the query), the rest 0.
pub(crate) fn causal_softmax<T: Real>(scores: &[T], t: usize) -> Vec<T> {
    let t = t.max(1);
    let mut out = vec![T::ZERO; scores.len()];
    for (r, (row, probs)) in scores.chunks_exact(t).zip(out.chunks_exact_mut(t)).enumerate() {
        let visible = r % t + 1;
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
            *p = *p * inverse;
        }
    }
    out
}

/// The gradient of the softmax input, per row: `probs ⊙ (grad_probs - Σ grad_probs ⊙ probs)`.
pub(crate) fn softmax_backward<T: Real>(probs: &[T], grad_probs: &[T], width: usize) -> Vec<T> {
    let width = width.max(1);
    let mut out = Vec::with_capacity(probs.len());
    for (p, g) in probs.chunks_exact(width).zip(grad_probs.chunks_exact(width)) {
        let mut dot = T::ZERO;
        for (&p, &g) in p.iter().zip(g) {
            dot += p * g;
        }
        out.extend(p.iter().zip(g).map(|(&p, &g)| p * (g - dot)));
    }
    out
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
            let expected = 0.5 * x * (1.0 + (SQRT_TWO_OVER_PI * (x + GELU_CUBIC * x.powi(3))).tanh());
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
        close(&add_row(&x, &[1.0, 0.0, -1.0]), &[2.0, 2.0, 2.0, 5.0, 5.0, 5.0]);
        let (out, xhat, rstd) = layer_norm(&x, &[2.0, 2.0, 2.0], &[1.0, 1.0, 1.0], 0.0);
        let r = 1.0 / (2.0f64 / 3.0).sqrt();
        close(&rstd, &[r, r]);
        close(&xhat, &[-r, 0.0, r, -r, 0.0, r]);
        close(&out[..3], &[1.0 - 2.0 * r, 1.0, 1.0 + 2.0 * r]);
        let (gw, gb) = layer_norm_backward_weight(&x, &xhat, 3);
        close(&gb, &[5.0, 7.0, 9.0]);
        close(&gw, &[-r - 4.0 * r, 0.0, 3.0 * r + 6.0 * r]);
        let probs = causal_softmax(&[0.0, 9.0, 1.0, 1.0], 2);
        close(&probs, &[1.0, 0.0, 0.5, 0.5]);
        close(&softmax_backward(&[0.5, 0.5], &[1.0, 3.0], 2), &[-0.5, 0.5]);
    }
}
