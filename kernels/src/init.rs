//! GPT-2 initialisation from a `u64` seed, bit-identical on every machine and for every way of
//! cutting the model into stages.
//!
//! - [`SplitMix64`] is the generator (Steele, Lea and Flood's SplitMix64, integer-only);
//! - [`NormalSampler`] turns it into standard normals by the Box-Muller transform, with the
//!   pure-Rust `libm` crate for `log`, `sin` and `cos` (the system libm may differ between
//!   machines in the last bit) and IEEE-exact `sqrt`; values are drawn in f64 and rounded once
//!   to the parameter's dtype;
//! - [`parameter_seed`] derives each parameter's own stream from `(seed, GPT-2 name)`, so a
//!   parameter's values do not depend on which other parameters a stage holds.
//!
//! The scheme is GPT-2's: weights `N(0, 0.02)`, biases 0, layer-norm weights 1, the two
//! `c_proj.weight`s of each block `N(0, 0.02 / √(2·n_layer))`; `wte`, `wpe` and the untied
//! `lm_head` `N(0, 0.02)`.

use candle_core::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::primitives::Primitives;

/// GPT-2's `initializer_range`.
pub const INIT_STD: f64 = 0.02;

/// The SplitMix64 generator: a 64-bit state advanced by a constant and mixed.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// A uniform draw from `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// SplitMix64's output function (a bijective 64-bit mixer).
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Standard normal draws by the Box-Muller transform over a [`SplitMix64`].
#[derive(Debug, Clone)]
pub struct NormalSampler {
    uniform: SplitMix64,
    spare: Option<f64>,
}

impl NormalSampler {
    /// A sampler seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        NormalSampler {
            uniform: SplitMix64::new(seed),
            spare: None,
        }
    }

    /// The next standard normal draw.
    pub fn next_normal(&mut self) -> f64 {
        if let Some(spare) = self.spare.take() {
            return spare;
        }
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let radius_uniform = 1.0 - self.uniform.next_f64();
        let angle = std::f64::consts::TAU * self.uniform.next_f64();
        let radius = (-2.0 * libm::log(radius_uniform)).sqrt();
        self.spare = Some(radius * libm::sin(angle));
        radius * libm::cos(angle)
    }
}

/// The seed of the parameter named `name` in a model initialised from `seed`.
pub fn parameter_seed(seed: u64, name: &str) -> u64 {
    // FNV-1a over the name's bytes, then mixed with the seed.
    let name_hash = name.bytes().fold(0xCBF2_9CE4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01B3)
    });
    mix64(mix64(seed) ^ name_hash)
}

/// Makes parameter tensors of one dtype from one seed: what each model layer's
/// `ModelLayer::build` draws its parameters with (a layer made of parameters, such as
/// [`crate::Linear`], adds its own constructor to the factory in its file).
pub(crate) struct ParameterFactory<'a> {
    ops: &'a dyn Primitives,
    /// `None` for shapes only: every tensor one zero broadcast to its shape, nothing drawn.
    seed: Option<u64>,
    dtype: DType,
}

impl<'a> ParameterFactory<'a> {
    /// A factory for `dtype` tensors drawn from `seed`.
    pub(crate) fn new(ops: &'a dyn Primitives, seed: u64, dtype: DType) -> Self {
        let seed = Some(seed);
        ParameterFactory { ops, seed, dtype }
    }

    /// A factory of parameters with their shapes and no values (one zero broadcast to each
    /// shape): layers to read names and shapes from, at no cost in time or memory.
    pub(crate) fn shapes_only(ops: &'a dyn Primitives, dtype: DType) -> Self {
        ParameterFactory {
            ops,
            seed: None,
            dtype,
        }
    }

    /// `N(0, std²)` values drawn from the stream of parameter `name` (its GPT-2 name).
    pub(crate) fn normal(&self, name: &str, shape: &[usize], std: f64) -> Result<Tensor> {
        let Some(seed) = self.seed else {
            return self.shape_only(shape);
        };
        let mut sampler = NormalSampler::new(parameter_seed(seed, name));
        let count = shape.iter().product();
        let values: Vec<f64> = (0..count).map(|_| std * sampler.next_normal()).collect();
        self.ops.float_tensor(&values, shape, self.dtype)
    }

    /// A tensor filled with `value`.
    pub(crate) fn constant(&self, shape: &[usize], value: f64) -> Result<Tensor> {
        if self.seed.is_none() {
            return self.shape_only(shape);
        }
        let count = shape.iter().product();
        self.ops
            .float_tensor(&vec![value; count], shape, self.dtype)
    }

    /// One zero of the factory's dtype broadcast to `shape`.
    fn shape_only(&self, shape: &[usize]) -> Result<Tensor> {
        let zero = self.ops.float_tensor(&[0.0], &[], self.dtype)?;
        zero.broadcast_as(shape)
            .map_err(KernelError::backend("parameter shape"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // Vigna's splitmix64.c from state 0.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next_u64(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn normal_draws_are_pinned_and_standard() {
        let mut sampler = NormalSampler::new(parameter_seed(0, "transformer.wte.weight"));
        // Pinned bits: a change here changes every model initialised so far.
        let first: Vec<u64> = (0..4).map(|_| sampler.next_normal().to_bits()).collect();
        let pinned = [
            0x3FED_4568_8DE7_8C6A,
            0xBFC3_82D9_30F3_2FC5,
            0x3FE7_1346_FFD1_1434,
            0x3FF7_F969_542F_EA86,
        ];
        assert_eq!(first, pinned);
        let mut sampler = NormalSampler::new(7);
        let draws: Vec<f64> = (0..200_000).map(|_| sampler.next_normal()).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        let var = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / draws.len() as f64;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.01,
            "mean {mean}, var {var}"
        );
    }

    #[test]
    fn parameter_seeds_differ_by_name_and_seed() {
        let a = parameter_seed(1, "transformer.h.0.attn.c_attn.weight");
        assert_ne!(a, parameter_seed(1, "transformer.h.1.attn.c_attn.weight"));
        assert_ne!(a, parameter_seed(2, "transformer.h.0.attn.c_attn.weight"));
        assert_eq!(a, parameter_seed(1, "transformer.h.0.attn.c_attn.weight"));
    }
}
