//! The optimizer's element-wise work: [`adamw_update`], one AdamW step of one parameter in a
//! single pass over its elements (on the CPU), where the composite of tensor ops would read and
//! write the parameter-sized tensors a dozen times (off the CPU, or for other dtypes, it runs
//! the composite; both give the same bits); [`squared_norm`] for gradient clipping; and
//! [`TensorSum`], the microbatches' weight gradients summed into one buffer in place.

use candle_core::{DType, Device, Tensor};

use super::fused::{self, AdamWScalars};
use super::slices::{tensor, with_slice, Real};
use crate::check;
use crate::error::{KernelError, Result};

/// The scalars of one AdamW step of one parameter (all finite; see [`adamw_update`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    /// The gradient's factor (a clipping scale; 1 for none).
    pub grad_scale: f64,
    /// Decay of the first moment, `β1`.
    pub beta1: f64,
    /// Decay of the second moment, `β2`.
    pub beta2: f64,
    /// `1 / √(1 - β2^t)` at step `t`.
    pub inverse_bias2_sqrt: f64,
    /// The denominator's `ε`.
    pub eps: f64,
    /// `lr / (1 - β1^t)` at step `t`.
    pub step_size: f64,
    /// The parameter's factor before the update, `1 - lr·λ` (1 without weight decay).
    pub decay: f64,
}

impl AdamWStep {
    fn scalars<T: Real>(&self) -> AdamWScalars<T> {
        AdamWScalars {
            grad_scale: T::of(self.grad_scale),
            beta1: T::of(self.beta1),
            one_minus_beta1: T::of(1.0 - self.beta1),
            beta2: T::of(self.beta2),
            one_minus_beta2: T::of(1.0 - self.beta2),
            inverse_bias2_sqrt: T::of(self.inverse_bias2_sqrt),
            eps: T::of(self.eps),
            step_size: T::of(self.step_size),
            decay: T::of(self.decay),
        }
    }
}

/// One AdamW step of `param` with gradient `grad` and moments `m`, `v` (all of one shape and
/// dtype): the new `(param, m, v)`, with
///
/// ```text
/// g = s·g    m = β1·m + (1 - β1)·g    v = β2·v + (1 - β2)·g²
/// p = decay·p - step_size · m / (√v · inverse_bias2_sqrt + ε)
/// ```
///
/// Mismatched shapes or dtypes are a [`KernelError::Shape`] or [`KernelError::DType`].
pub fn adamw_update(
    param: &Tensor,
    grad: &Tensor,
    m: &Tensor,
    v: &Tensor,
    step: &AdamWStep,
) -> Result<(Tensor, Tensor, Tensor)> {
    const OP: &str = "adamw_update";
    for (name, t) in [("grad", grad), ("m", m), ("v", v)] {
        if t.dims() != param.dims() {
            return Err(KernelError::Shape {
                layer: OP,
                tensor: name,
                actual: t.dims().to_vec(),
                expected: format!("{:?} (the parameter's shape)", param.dims()),
            });
        }
        let parameters = (param.dtype(), "the parameter's dtype");
        check::dtype_follows(OP, name, t.dtype(), parameters)?;
    }
    let operands = Operands { param, grad, m, v };
    let fused = match (param.device(), param.dtype()) {
        (Device::Cpu, DType::F32) => fused_update::<f32>(operands, step),
        (Device::Cpu, DType::F64) => fused_update::<f64>(operands, step),
        _ => composite_update(operands, step),
    };
    fused.map_err(KernelError::backend(OP))
}

/// What one AdamW step of one parameter reads: the parameter, its gradient and its moments.
#[derive(Clone, Copy)]
struct Operands<'a> {
    param: &'a Tensor,
    grad: &'a Tensor,
    m: &'a Tensor,
    v: &'a Tensor,
}

/// The new `(param, m, v)` of a step.
type Updated = candle_core::Result<(Tensor, Tensor, Tensor)>;

/// `Σ x²` over the elements of a float tensor, in f64: on the CPU one pass with 16 interleaved
/// partial sums (added in a fixed order, so the same tensor always gives the same bits), else
/// candle's sum of squares.
pub fn squared_norm(x: &Tensor) -> Result<f64> {
    let norm = match (x.device(), x.dtype()) {
        (Device::Cpu, DType::F32) => with_slice::<f32, _>(x, fused::squared_norm),
        (Device::Cpu, DType::F64) => with_slice::<f64, _>(x, fused::squared_norm),
        _ => x
            .to_dtype(DType::F64)
            .and_then(|x| x.sqr())
            .and_then(|x| x.sum_all())
            .and_then(|x| x.to_scalar::<f64>()),
    };
    norm.map_err(KernelError::backend("squared_norm"))
}

/// A running sum of tensors of one shape and dtype, added into in place: on the CPU one buffer
/// for the whole sum (no tensor allocated per addition, so no fresh memory to fault in per
/// microbatch), with the same bits as adding the tensors one after the other with candle's
/// `add` (each element is the same sequence of additions).
#[derive(Debug)]
pub struct TensorSum {
    dims: Vec<usize>,
    values: SumValues,
}

#[derive(Debug)]
enum SumValues {
    F32(Vec<f32>),
    F64(Vec<f64>),
    /// Other devices or dtypes: candle's `add`.
    Tensor(Tensor),
}

impl TensorSum {
    /// A sum starting at `first`.
    pub fn new(first: &Tensor) -> Result<TensorSum> {
        let copy = KernelError::backend("tensor_sum");
        let values = match (first.device(), first.dtype()) {
            (Device::Cpu, DType::F32) => {
                SumValues::F32(with_slice(first, <[f32]>::to_vec).map_err(copy)?)
            }
            (Device::Cpu, DType::F64) => {
                SumValues::F64(with_slice(first, <[f64]>::to_vec).map_err(copy)?)
            }
            _ => SumValues::Tensor(first.clone()),
        };
        Ok(TensorSum {
            dims: first.dims().to_vec(),
            values,
        })
    }

    /// Adds `x` (the sum's shape and dtype, else a [`KernelError::Shape`] or
    /// [`KernelError::DType`]).
    pub fn add(&mut self, x: &Tensor) -> Result<()> {
        const OP: &str = "tensor_sum";
        if x.dims() != self.dims.as_slice() {
            return Err(KernelError::Shape {
                layer: OP,
                tensor: "addend",
                actual: x.dims().to_vec(),
                expected: format!("{:?} (the sum's shape)", self.dims),
            });
        }
        let expected = match &self.values {
            SumValues::F32(_) => DType::F32,
            SumValues::F64(_) => DType::F64,
            SumValues::Tensor(t) => t.dtype(),
        };
        check::dtype_follows(OP, "addend", x.dtype(), (expected, "the sum's dtype"))?;
        match &mut self.values {
            SumValues::F32(sum) => with_slice(x, |x| fused::add_into(sum, x)),
            SumValues::F64(sum) => with_slice(x, |x| fused::add_into(sum, x)),
            SumValues::Tensor(sum) => sum.add(x).map(|t| *sum = t),
        }
        .map_err(KernelError::backend(OP))
    }

    /// The sum as a tensor.
    pub fn into_tensor(self) -> Result<Tensor> {
        let dims = self.dims;
        match self.values {
            SumValues::F32(v) => tensor(v, &dims),
            SumValues::F64(v) => tensor(v, &dims),
            SumValues::Tensor(t) => Ok(t),
        }
        .map_err(KernelError::backend("tensor_sum"))
    }
}

/// [`adamw_update`] in one pass over CPU slices.
fn fused_update<T: Real>(operands: Operands<'_>, step: &AdamWStep) -> Updated {
    let Operands { param, grad, m, v } = operands;
    let scalars = step.scalars::<T>();
    let (p1, m1, v1) = with_slice::<T, _>(param, |p| {
        with_slice(grad, |g| {
            with_slice(m, |m| with_slice(v, |v| fused::adamw(p, g, m, v, &scalars)))
        })
    })????;
    let dims = param.dims();
    Ok((tensor(p1, dims)?, tensor(m1, dims)?, tensor(v1, dims)?))
}

/// [`adamw_update`] as candle tensor ops (any device and float dtype).
fn composite_update(operands: Operands<'_>, step: &AdamWStep) -> Updated {
    let Operands { param, grad, m, v } = operands;
    let g = grad.affine(step.grad_scale, 0.0)?;
    let m = (m.affine(step.beta1, 0.0)? + g.affine(1.0 - step.beta1, 0.0)?)?;
    let v = (v.affine(step.beta2, 0.0)? + g.sqr()?.affine(1.0 - step.beta2, 0.0)?)?;
    let denom = v.sqrt()?.affine(step.inverse_bias2_sqrt, step.eps)?;
    let update = m.div(&denom)?.affine(step.step_size, 0.0)?;
    let p = (param.affine(step.decay, 0.0)? - update)?;
    Ok((p, m, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{dtype_error, shape_error};

    fn step() -> AdamWStep {
        AdamWStep {
            grad_scale: 0.7,
            beta1: 0.9,
            beta2: 0.95,
            inverse_bias2_sqrt: 1.0 / (1.0f64 - 0.95f64.powi(3)).sqrt(),
            eps: 1e-8,
            step_size: 3e-3 / (1.0 - 0.9f64.powi(3)),
            decay: 1.0 - 3e-3 * 0.1,
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 2001) as f32)
            .map(|x| (x - 1000.0) * 1e-3)
            .collect()
    }

    #[test]
    fn the_fused_update_has_the_bits_of_the_composite() {
        let n = 1037;
        let make = |seed| Tensor::from_vec(values(n, seed), (n,), &Device::Cpu).unwrap();
        let (p, g, m) = (make(1), make(2), make(3));
        let v = make(4).sqr().unwrap();
        let fused = adamw_update(&p, &g, &m, &v, &step()).unwrap();
        let operands = Operands {
            param: &p,
            grad: &g,
            m: &m,
            v: &v,
        };
        let composite = composite_update(operands, &step()).unwrap();
        for (a, b) in [
            (fused.0, composite.0),
            (fused.1, composite.1),
            (fused.2, composite.2),
        ] {
            let (a, b) = (a.to_vec1::<f32>().unwrap(), b.to_vec1::<f32>().unwrap());
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "the fused update differs from the composite");
        }
    }

    #[test]
    fn squared_norms_match_a_sum_in_f64() {
        let v = values(1037, 5);
        let t = Tensor::from_vec(v.clone(), (1037,), &Device::Cpu).unwrap();
        let exact: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
        let ours = squared_norm(&t).unwrap();
        assert!((ours - exact).abs() <= 1e-12 * exact, "{ours} vs {exact}");
        assert_eq!(ours.to_bits(), squared_norm(&t).unwrap().to_bits());
        let strided = Tensor::from_vec(v, (61, 17), &Device::Cpu)
            .unwrap()
            .t()
            .unwrap();
        assert!((squared_norm(&strided).unwrap() - exact).abs() <= 1e-12 * exact);
    }

    #[test]
    fn sums_in_place_have_the_bits_of_candles_adds() {
        let make = |seed| Tensor::from_vec(values(1037, seed), (61, 17), &Device::Cpu).unwrap();
        let parts = [make(1), make(2), make(3)];
        let mut sum = TensorSum::new(&parts[0]).unwrap();
        sum.add(&parts[1]).unwrap();
        sum.add(&parts[2]).unwrap();
        let ours = sum
            .into_tensor()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let candle = ((&parts[0] + &parts[1]).unwrap() + &parts[2]).unwrap();
        let candle = candle.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        assert!(ours
            .iter()
            .zip(&candle)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let mut sum = TensorSum::new(&parts[0]).unwrap();
        let wrong = Tensor::zeros((17, 61), DType::F32, &Device::Cpu).unwrap();
        assert!(matches!(sum.add(&wrong), Err(KernelError::Shape { .. })));
        let wide = Tensor::zeros((61, 17), DType::F64, &Device::Cpu).unwrap();
        assert!(matches!(sum.add(&wide), Err(KernelError::DType { .. })));
    }

    #[test]
    fn mismatched_moments_are_typed_errors() {
        let p = Tensor::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let short = Tensor::zeros((3,), DType::F32, &Device::Cpu).unwrap();
        let wide = Tensor::zeros((2, 3), DType::F64, &Device::Cpu).unwrap();
        let err = adamw_update(&p, &p, &short, &p, &step()).unwrap_err();
        assert_eq!(shape_error(&err), ("adamw_update", "m"));
        let err = adamw_update(&p, &p, &p, &wide, &step()).unwrap_err();
        assert_eq!(dtype_error(&err), ("adamw_update", "v"));
    }
}
