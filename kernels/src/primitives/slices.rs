//! How the fused kernels ([`super::fused`]) see candle CPU tensors: a float type's arithmetic
//! ([`Real`], for F32 and F64), a tensor's elements as a slice ([`with_slice`]) and a tensor made
//! from a vector ([`tensor`]).

use std::mem::MaybeUninit;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub};

use candle_core::{Device, Storage, Tensor, WithDType};

/// The float element types the kernels compute in.
pub(crate) trait Real:
    WithDType
    + Copy
    + Default
    + PartialOrd
    + Add<Output = Self>
    + AddAssign
    + Sub<Output = Self>
    + Mul<Output = Self>
    + MulAssign
    + Div<Output = Self>
    + Neg<Output = Self>
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// `x` rounded to this type.
    fn of(x: f64) -> Self;
    /// This value as f64 (exact).
    fn wide(self) -> f64;
    /// `eˣ`.
    fn exp(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent: for f32 a rational approximation within about 2 ulp, which vectorises
    /// (Eigen's `ptanh` coefficients); for f64 the library function.
    fn tanh(self) -> Self;
    /// The larger of two.
    #[inline(always)]
    fn larger(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
}

/// The items of [`Real`] that F32 and F64 implement alike: the constants, and `exp` and `sqrt`
/// from the standard library.
macro_rules! library_real {
    ($float:ident) => {
        const ZERO: Self = 0.0;
        const ONE: Self = 1.0;
        #[inline(always)]
        fn exp(self) -> Self {
            $float::exp(self)
        }
        #[inline(always)]
        fn sqrt(self) -> Self {
            $float::sqrt(self)
        }
    };
}

impl Real for f32 {
    library_real!(f32);
    #[inline(always)]
    fn of(x: f64) -> Self {
        x as f32
    }
    #[inline(always)]
    fn wide(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        // tanh(x) = x·P(x²)/Q(x²), the argument clamped to |x| <= 7.9053111. Plain products and
        // sums, not `mul_add`: without the `fma` target feature that is a library call.
        const LIMIT: f32 = 7.905_311;
        const A1: f32 = 4.893_524_6e-3;
        const A3: f32 = 6.372_619_3e-4;
        const A5: f32 = 1.485_722_4e-5;
        const A7: f32 = 5.122_297e-8;
        const A9: f32 = -8.604_672e-11;
        const A11: f32 = 2.000_188e-13;
        const A13: f32 = -2.760_768_5e-16;
        const B0: f32 = 4.893_525e-3;
        const B2: f32 = 2.268_434_7e-3;
        const B4: f32 = 1.185_347_1e-4;
        const B6: f32 = 1.198_258_4e-6;
        // `max`/`min`, not `clamp`: `clamp` checks its bounds, a branch that stops vectorising.
        #[allow(clippy::manual_clamp)]
        let x = self.max(-LIMIT).min(LIMIT);
        let x2 = x * x;
        let p = x2 * A13 + A11;
        let p = x2 * p + A9;
        let p = x2 * p + A7;
        let p = x2 * p + A5;
        let p = x2 * p + A3;
        let p = x2 * p + A1;
        let q = x2 * B6 + B4;
        let q = x2 * q + B2;
        let q = x2 * q + B0;
        let t = x * p / q;
        let size = self.abs();
        if size < 4e-4 {
            self
        } else if size >= 9.0 {
            // tanh(9) = 1 - 3e-8: 1 in f32.
            1.0f32.copysign(self)
        } else {
            t
        }
    }
}

impl Real for f64 {
    library_real!(f64);
    #[inline(always)]
    fn of(x: f64) -> Self {
        x
    }
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }
    #[inline(always)]
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
}

/// Calls `body` with the elements of `t` (a CPU tensor of `T`) in row-major order: borrowed when
/// the tensor is contiguous, from a contiguous copy otherwise.
pub(crate) fn with_slice<T: Real, R>(
    t: &Tensor,
    body: impl FnOnce(&[T]) -> R,
) -> candle_core::Result<R> {
    let contiguous;
    let t = if t.is_contiguous() {
        t
    } else {
        contiguous = t.contiguous()?;
        &contiguous
    };
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(cpu), Some((start, end))) => Ok(body(&cpu.as_slice::<T>()?[start..end])),
        _ => Err(candle_core::Error::Msg(
            "the CPU primitives read contiguous CPU tensors".to_string(),
        )),
    }
}

/// An output buffer the element-wise kernels write slot by slot, without the zeroing that
/// `vec![0.0; n]` costs (a pass over memory that is about to be overwritten).
pub(crate) struct Output<T> {
    slots: Vec<MaybeUninit<T>>,
}

impl<T: Copy> Output<T> {
    /// `n` unwritten slots.
    #[inline(always)]
    pub(crate) fn new(n: usize) -> Output<T> {
        let mut slots = Vec::with_capacity(n);
        // SAFETY: `MaybeUninit` needs no initialisation, and the capacity is `n`.
        unsafe { slots.set_len(n) };
        Output { slots }
    }

    /// The slots, to be written with [`MaybeUninit::write`].
    #[inline(always)]
    pub(crate) fn slots(&mut self) -> &mut [MaybeUninit<T>] {
        &mut self.slots
    }

    /// The written values.
    ///
    /// # Safety
    ///
    /// Every slot must have been written.
    #[inline(always)]
    pub(crate) unsafe fn assume_written(self) -> Vec<T> {
        let mut slots = std::mem::ManuallyDrop::new(self.slots);
        let (ptr, len, capacity) = (slots.as_mut_ptr(), slots.len(), slots.capacity());
        // SAFETY: `MaybeUninit<T>` has `T`'s layout, the allocation is the vector's own (not
        // dropped: `ManuallyDrop`), and the caller promises every slot is initialised.
        unsafe { Vec::from_raw_parts(ptr.cast::<T>(), len, capacity) }
    }
}

/// A CPU tensor of `shape` holding `values`.
pub(crate) fn tensor<T: Real>(values: Vec<T>, shape: &[usize]) -> candle_core::Result<Tensor> {
    Tensor::from_vec(values, shape, &Device::Cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_f32_tanh_is_within_a_few_ulp_of_the_library() {
        let mut worst = 0.0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 5e-5;
            let ours = Real::tanh(x) as f64;
            let exact = (x as f64).tanh();
            worst = worst.max((ours - exact).abs() / exact.abs().max(1e-30));
        }
        assert!(worst < 6e-7, "largest relative error {worst}");
        assert_eq!(Real::tanh(100.0f32), 1.0);
        assert_eq!(Real::tanh(-100.0f32), -1.0);
        assert_eq!(Real::tanh(1e-5f32), 1e-5);
    }

    #[test]
    fn slices_of_strided_tensors_are_copied_in_order() {
        let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], (2, 2), &Device::Cpu).unwrap();
        let transposed = t.t().unwrap();
        let values = with_slice::<f32, _>(&transposed, |s| s.to_vec()).unwrap();
        assert_eq!(values, [1.0, 3.0, 2.0, 4.0]);
        assert!(with_slice::<f64, _>(&t, |s| s.len()).is_err());
    }
}
