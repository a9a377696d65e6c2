//! Matrix products on slices through the `gemm` crate (the one candle's CPU backend runs, here
//! with its AVX-512 kernels): transposed operands are read through their strides, never copied,
//! the output is written once (no zeroing first), and a bias row can start the output so that
//! `x·W + b` is one pass.

use super::slices::Real;

/// The shape of a (batched) product `a · b`: `batch` products of `[m, k] · [k, n]`, each operand
/// stored row-major as written or, when transposed, as its transpose (`[k, m]`, `[n, k]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Product {
    /// Independent products, one after the other in every operand.
    pub batch: usize,
    /// Rows of the output.
    pub m: usize,
    /// Columns of the output.
    pub n: usize,
    /// The inner dimension.
    pub k: usize,
    /// `a` is stored as `[k, m]`.
    pub a_transposed: bool,
    /// `b` is stored as `[n, k]`.
    pub b_transposed: bool,
}

/// How many threads a product may use: `RAYON_NUM_THREADS`, as candle reads it.
pub(crate) fn parallelism() -> gemm::Parallelism {
    match candle_core::utils::get_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        n => gemm::Parallelism::Rayon(n),
    }
}

/// `a · b` (plus `row` on every output row), `[batch, m, n]` row-major; None when an operand's
/// length does not match the shape.
pub(crate) fn product<T: Real>(
    shape: Product,
    a: &[T],
    b: &[T],
    row: Option<&[T]>,
) -> Option<Vec<T>> {
    let Product {
        batch,
        m,
        n,
        k,
        a_transposed,
        b_transposed,
    } = shape;
    let (a_len, b_len, out_len) = (m.checked_mul(k)?, k.checked_mul(n)?, m.checked_mul(n)?);
    if a.len() != batch.checked_mul(a_len)?
        || b.len() != batch.checked_mul(b_len)?
        || row.is_some_and(|r| r.len() != n)
    {
        return None;
    }
    let total = batch.checked_mul(out_len)?;
    if k == 0 || total == 0 {
        let zeros = vec![T::ZERO; n];
        let row = row.unwrap_or(&zeros);
        return Some(row.iter().copied().cycle().take(total).collect());
    }
    let mut out: Vec<T> = Vec::with_capacity(total);
    if let Some(row) = row {
        for _ in 0..batch * m {
            out.extend_from_slice(row);
        }
    }
    let read_dst = row.is_some();
    // Element strides (column, row) of each operand as `gemm` indexes them: `x[i, j]` at
    // `i·rs + j·cs`.
    let (a_cs, a_rs) = if a_transposed { (m, 1) } else { (1, k) };
    let (b_cs, b_rs) = if b_transposed { (k, 1) } else { (1, n) };
    let dst = out.as_mut_ptr();
    for i in 0..batch {
        // SAFETY: `a`, `b` hold `batch` operands of `m·k` and `k·n` elements (checked above), and
        // the strides above address exactly the elements `0 .. m·k` of operand `i` (and `k·n`),
        // so every read is in bounds; `out` has capacity for `batch·m·n` elements, and `gemm`
        // writes (or, with `read_dst`, reads then writes, those initialised with `row` above) the
        // `m·n` elements of block `i` at row stride `n`, each once, within that capacity; the
        // output does not overlap the operands (a fresh allocation).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.add(i * out_len),
                1,
                n as isize,
                read_dst,
                a.as_ptr().add(i * a_len),
                a_cs as isize,
                a_rs as isize,
                b.as_ptr().add(i * b_len),
                b_cs as isize,
                b_rs as isize,
                T::ONE,
                T::ONE,
                false,
                false,
                false,
                parallelism(),
            );
        }
    }
    // SAFETY: the loop above wrote every one of the `total` elements (each block's `m·n`, blocks
    // covering `0 .. total`), and `total` is within the capacity.
    unsafe { out.set_len(total) };
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The product by definition, in f64.
    fn naive(shape: Product, a: &[f64], b: &[f64]) -> Vec<f64> {
        let Product { batch, m, n, k, .. } = shape;
        let mut out = vec![0.0; batch * m * n];
        for t in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let mut sum = 0.0;
                    for l in 0..k {
                        let x = if shape.a_transposed {
                            a[t * m * k + l * m + i]
                        } else {
                            a[t * m * k + i * k + l]
                        };
                        let y = if shape.b_transposed {
                            b[t * k * n + j * k + l]
                        } else {
                            b[t * k * n + l * n + j]
                        };
                        sum += x * y;
                    }
                    out[t * m * n + i * n + j] = sum;
                }
            }
        }
        out
    }

    #[test]
    fn products_of_every_layout_match_the_definition() {
        for (a_transposed, b_transposed) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let shape = Product {
                batch: 2,
                m: 5,
                n: 7,
                k: 3,
                a_transposed,
                b_transposed,
            };
            let a: Vec<f64> = (0..30).map(|i| f64::from(i) * 0.5 - 3.0).collect();
            let b: Vec<f64> = (0..42).map(|i| f64::from(i % 11) - 4.0).collect();
            let row: Vec<f64> = (0..7).map(f64::from).collect();
            let got = product(shape, &a, &b, Some(&row)).unwrap();
            let want = naive(shape, &a, &b);
            for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - (w + row[idx % 7])).abs() < 1e-12,
                    "{a_transposed} {b_transposed}: {g} vs {w}"
                );
            }
        }
        let shape = Product {
            batch: 1,
            m: 2,
            n: 2,
            k: 0,
            a_transposed: false,
            b_transposed: false,
        };
        assert_eq!(product::<f64>(shape, &[], &[], None), Some(vec![0.0; 4]));
        let bad = Product {
            batch: 1,
            m: 2,
            n: 2,
            k: 2,
            a_transposed: false,
            b_transposed: false,
        };
        assert_eq!(product::<f64>(bad, &[1.0; 3], &[1.0; 4], None), None);
    }
}
