//! Runtime dispatch to the CPU's widest vector instructions for the fused kernels
//! ([`super::fused`]). The crate is built for the x86-64 baseline (SSE2, 4 floats per
//! instruction); [`vectorized_fn!`] compiles a kernel's body three times, for AVX-512, for
//! AVX2 + FMA and for the baseline, and each call runs the widest the CPU has.
//!
//! The three builds give bit-identical results: Rust never contracts `a·b + c` into a fused
//! multiply-add on its own, and the kernels' floating-point sums are sequential (LLVM does not
//! reorder them), so wider registers only change how many lanes run at once.

/// The vector instruction sets the kernels are built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// AVX-512 (foundation and vector-length extensions): 16 floats per instruction.
    Avx512,
    /// AVX2 with FMA: 8 floats per instruction.
    Avx2,
    /// The target's baseline.
    Baseline,
}

/// The widest [`Level`] this CPU runs (the standard library caches the detection).
#[inline]
pub(crate) fn level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            return Level::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Level::Avx2;
        }
    }
    Level::Baseline
}

/// Defines a kernel `fn name<T: Real>(args) -> Ret { body }` whose body is compiled for each
/// [`Level`] and run at the CPU's [`level`]. The body must do its work in plain loops (no calls
/// it does not inline), so that all of it is compiled for the wider instructions.
macro_rules! vectorized_fn {
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<T: Real>($($arg:ident: $ty:ty),* $(,)?) $body:block
    ) => {
        $crate::primitives::simd::vectorized_fn! {
            $(#[$meta])*
            $vis fn $name<T: Real>($($arg: $ty),*) -> () $body
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis fn $name:ident<T: Real>($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block
    ) => {
        $(#[$meta])*
        $vis fn $name<T: Real>($($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn body<T: Real>($($arg: $ty),*) -> $ret $body

            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
                unsafe fn avx512<T: Real>($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2<T: Real>($($arg: $ty),*) -> $ret {
                    body($($arg),*)
                }
                match $crate::primitives::simd::level() {
                    // SAFETY: `level` said this CPU has AVX-512F and AVX-512VL.
                    $crate::primitives::simd::Level::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: `level` said this CPU has AVX2 and FMA.
                    $crate::primitives::simd::Level::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::primitives::simd::Level::Baseline => {}
                }
            }
            body($($arg),*)
        }
    };
}

pub(crate) use vectorized_fn;

#[cfg(test)]
mod tests {
    use super::*;

    vectorized_fn! {
        /// A test kernel: `2·x + 1`.
        fn twice_plus_one<T: Real>(x: &[T]) -> Vec<T> {
            let mut out = vec![T::ZERO; x.len()];
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v + v + T::ONE;
            }
            out
        }
    }

    use super::super::slices::Real;

    #[test]
    fn a_vectorized_kernel_runs_at_the_detected_level() {
        let x: Vec<f32> = (0..37).map(|i| i as f32).collect();
        let y = twice_plus_one(&x);
        assert_eq!(y, x.iter().map(|v| 2.0 * v + 1.0).collect::<Vec<_>>());
        // Detection is stable between calls.
        assert_eq!(level(), level());
    }
}
