//! [`AdamW`] over candle tensors, and global-norm gradient clipping.
//!
//! **The update** is PyTorch's `torch.optim.AdamW` (no AMSGrad), per parameter `p` with gradient
//! `g` at step `t` (counting from 1):
//!
//! ```text
//! m = β1·m + (1 - β1)·g            v = β2·v + (1 - β2)·g²
//! p = p·(1 - lr·λ) - lr / (1 - β1^t) · m / (√v / √(1 - β2^t) + ε)
//! ```
//!
//! with the decoupled weight decay `λ` applied only to parameters of two dimensions (the
//! matrices and embeddings of a GPT; biases and layer-norm gains are not decayed, the GPT-2 /
//! nanoGPT convention). Defaults: `β1 = 0.9`, `β2 = 0.95`, `ε = 1e-8`, `λ = 0.1`.
//!
//! The moments `m` and `v` are kept as tensors of the parameter's shape and dtype, updated with
//! the parameter in one fused pass per parameter ([`adamw_update`]: element-wise, no
//! reductions), so the same parameters, gradients and learning rate always give the same bits.
//!
//! **Clipping.** Each rank computes the squared norms of its gradients ([`squared_norms`]); the
//! caller gathers them, [`global_norm`] sums them, and [`clip_scale`] gives the factor to pass to
//! [`AdamW::step_scaled`]. For results independent of how parameters fall onto ranks, pass one
//! squared norm per parameter in the model's global parameter order.

use std::collections::BTreeMap;

use candle_core::Tensor;

use pipeweave_kernels::{adamw_update, squared_norm, AdamWStep};

use crate::error::{Result, TrainError};

/// AdamW's hyper-parameters (the learning rate is given per step).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Decay of the first moment, `β1`.
    pub beta1: f64,
    /// Decay of the second moment, `β2`.
    pub beta2: f64,
    /// The denominator's `ε`.
    pub eps: f64,
    /// Decoupled weight decay `λ`, applied to parameters of two dimensions only.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        }
    }
}

impl AdamWConfig {
    /// Fails unless `0 ≤ β1, β2 < 1`, `ε > 0` and `λ ≥ 0`, all finite.
    pub fn validate(&self) -> Result<()> {
        let in_unit = |field: &'static str, value: f64| match (0.0..1.0).contains(&value) {
            true => Ok(()),
            false => Err(TrainError::invalid(field, value, "must lie in [0, 1)")),
        };
        in_unit("beta1", self.beta1)?;
        in_unit("beta2", self.beta2)?;
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(TrainError::invalid(
                "eps",
                self.eps,
                "must be finite and positive",
            ));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            let reason = "must be finite and non-negative";
            return Err(TrainError::invalid(
                "weight_decay",
                self.weight_decay,
                reason,
            ));
        }
        Ok(())
    }
}

/// An optimizer's state by parameter name, for checkpoints: the step count and both moments.
#[derive(Debug, Clone, Default)]
pub struct OptimizerState {
    /// Steps taken.
    pub step: u64,
    /// First moments by parameter name.
    pub m: BTreeMap<String, Tensor>,
    /// Second moments by parameter name.
    pub v: BTreeMap<String, Tensor>,
}

impl OptimizerState {
    /// Adds the moments of `other` (e.g. another rank's parameters); fails if the step counts
    /// differ (unless `self` is empty) or a parameter is in both.
    pub fn merge(&mut self, other: OptimizerState) -> Result<()> {
        if !self.m.is_empty() && self.step != other.step {
            let reason = format!("differs from the {} steps of the other part", self.step);
            return Err(TrainError::invalid("optimizer step", other.step, reason));
        }
        if let Some(name) = other.m.keys().find(|name| self.m.contains_key(*name)) {
            let reason = "is held by two parts of the optimizer state";
            return Err(TrainError::invalid("parameter", name, reason));
        }
        self.step = other.step;
        self.m.extend(other.m);
        self.v.extend(other.v);
        Ok(())
    }
}

/// AdamW over a fixed list of named parameters.
#[derive(Debug, Clone)]
pub struct AdamW {
    config: AdamWConfig,
    names: Vec<String>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    step: u64,
}

impl AdamW {
    /// An optimizer for `params` (name, current value) with zero moments.
    pub fn new(config: AdamWConfig, params: &[(String, Tensor)]) -> Result<AdamW> {
        config.validate()?;
        let zeros = |(name, p): &(String, Tensor)| {
            p.zeros_like()
                .map_err(TrainError::tensor(format!("zero moments of {name}")))
        };
        let m = params.iter().map(zeros).collect::<Result<Vec<_>>>()?;
        Ok(AdamW {
            config,
            names: params.iter().map(|(name, _)| name.clone()).collect(),
            v: m.clone(),
            m,
            step: 0,
        })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// The parameter names, in order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Steps taken so far.
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// One step with learning rate `lr`: the new parameters, in order.
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor], lr: f64) -> Result<Vec<Tensor>> {
        self.step_scaled(params, grads, lr, 1.0)
    }

    /// One step on the gradients multiplied by `grad_scale` (e.g. a [`clip_scale`]). On error
    /// the optimizer's state is unchanged.
    pub fn step_scaled(
        &mut self,
        params: &[Tensor],
        grads: &[Tensor],
        lr: f64,
        grad_scale: f64,
    ) -> Result<Vec<Tensor>> {
        self.check_step_args(params, grads, lr, grad_scale)?;
        let t = self.step.saturating_add(1);
        let mut new_params = Vec::with_capacity(params.len());
        let (mut new_m, mut new_v) = (Vec::new(), Vec::new());
        for i in 0..params.len() {
            let (p, m, v) = self
                .update_one(i, &params[i], &grads[i], lr, grad_scale, t)
                .map_err(TrainError::kernel(format!(
                    "AdamW step of {}",
                    self.names[i]
                )))?;
            new_params.push(p);
            new_m.push(m);
            new_v.push(v);
        }
        (self.m, self.v, self.step) = (new_m, new_v, t);
        Ok(new_params)
    }

    /// The new parameter and moments of parameter `i` at step `t` (one fused pass over its
    /// elements: [`adamw_update`]).
    fn update_one(
        &self,
        i: usize,
        p: &Tensor,
        g: &Tensor,
        lr: f64,
        grad_scale: f64,
        t: u64,
    ) -> pipeweave_kernels::Result<(Tensor, Tensor, Tensor)> {
        let c = &self.config;
        let exponent = i32::try_from(t).unwrap_or(i32::MAX);
        let bias1 = 1.0 - c.beta1.powi(exponent);
        let bias2_sqrt = (1.0 - c.beta2.powi(exponent)).sqrt();
        let decay = match p.rank() {
            2 => 1.0 - lr * c.weight_decay,
            _ => 1.0,
        };
        let step = AdamWStep {
            grad_scale,
            beta1: c.beta1,
            beta2: c.beta2,
            inverse_bias2_sqrt: 1.0 / bias2_sqrt,
            eps: c.eps,
            step_size: lr / bias1,
            decay,
        };
        adamw_update(p, g, &self.m[i], &self.v[i], &step)
    }

    /// Fails unless the lists match the optimizer's parameters and the scalars are finite.
    fn check_step_args(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        lr: f64,
        grad_scale: f64,
    ) -> Result<()> {
        let n = self.names.len();
        if params.len() != n || grads.len() != n {
            let value = format!("{} parameters and {} gradients", params.len(), grads.len());
            return Err(TrainError::invalid(
                "AdamW step",
                value,
                format!("expected {n} of each"),
            ));
        }
        if !(lr.is_finite() && lr >= 0.0) {
            return Err(TrainError::invalid(
                "lr",
                lr,
                "must be finite and non-negative",
            ));
        }
        if !grad_scale.is_finite() {
            return Err(TrainError::invalid(
                "grad_scale",
                grad_scale,
                "must be finite",
            ));
        }
        for ((name, p), (g, m)) in self.names.iter().zip(params).zip(grads.iter().zip(&self.m)) {
            check_like(name, p, m)?;
            check_like(name, g, m)?;
        }
        Ok(())
    }

    /// The state by parameter name.
    pub fn state(&self) -> OptimizerState {
        let named = |tensors: &[Tensor]| {
            let pairs = self.names.iter().cloned().zip(tensors.iter().cloned());
            pairs.collect::<BTreeMap<_, _>>()
        };
        OptimizerState {
            step: self.step,
            m: named(&self.m),
            v: named(&self.v),
        }
    }

    /// Takes this optimizer's moments (and the step count) from `state`, which may hold other
    /// parameters too; fails, changing nothing, if one is missing or has another shape or dtype.
    pub fn load_state(&mut self, state: &OptimizerState) -> Result<()> {
        let pick = |moments: &BTreeMap<String, Tensor>, kind: &str, current: &[Tensor]| {
            let pairs = self.names.iter().zip(current);
            pairs
                .map(|(name, like)| {
                    let tensor = moments.get(name).ok_or_else(|| TrainError::MissingTensor {
                        path: "optimizer state".into(),
                        name: format!("optimizer.{kind}.{name}"),
                    })?;
                    check_like(name, tensor, like)?;
                    Ok(tensor.clone())
                })
                .collect::<Result<Vec<_>>>()
        };
        let m = pick(&state.m, "m", &self.m)?;
        let v = pick(&state.v, "v", &self.v)?;
        (self.m, self.v, self.step) = (m, v, state.step);
        Ok(())
    }
}

/// Fails unless `tensor` has the shape and dtype of `like`.
fn check_like(name: &str, tensor: &Tensor, like: &Tensor) -> Result<()> {
    if tensor.dims() != like.dims() {
        return Err(TrainError::TensorShape {
            path: Default::default(),
            name: name.to_string(),
            actual: tensor.dims().to_vec(),
            expected: like.dims().to_vec(),
        });
    }
    if tensor.dtype() != like.dtype() {
        return Err(TrainError::TensorDType {
            path: Default::default(),
            name: name.to_string(),
            actual: format!("{:?}", tensor.dtype()),
            expected: format!("{:?}", like.dtype()),
        });
    }
    Ok(())
}

/// One step of every position's optimizer (`optimizers[k]` for `params[k]` with `grads[k]`;
/// positions without gradients, which another process updates, are skipped and come back as
/// `None`), the positions spread over up to `threads` threads: the new parameters by position.
/// Each position's update is independent, so the result does not depend on `threads`; the first
/// error (in position order) is returned.
pub fn step_positions(
    optimizers: &mut [AdamW],
    params: &[Vec<Tensor>],
    grads: &[Option<Vec<Tensor>>],
    lr: f64,
    grad_scale: f64,
    threads: usize,
) -> Result<Vec<Option<Vec<Tensor>>>> {
    if optimizers.len() != params.len() || optimizers.len() != grads.len() {
        let reason = format!(
            "{} optimizers, {} parameter lists and {} gradient lists",
            optimizers.len(),
            params.len(),
            grads.len()
        );
        return Err(TrainError::invalid("positions", optimizers.len(), reason));
    }
    let work: Vec<(usize, &mut AdamW, &[Tensor], &[Tensor])> = optimizers
        .iter_mut()
        .zip(params)
        .zip(grads)
        .enumerate()
        .filter_map(|(k, ((o, p), g))| g.as_ref().map(|g| (k, o, p.as_slice(), g.as_slice())))
        .collect();
    let threads = threads.clamp(1, work.len().max(1));
    let mut lanes: Vec<Vec<_>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, item) in work.into_iter().enumerate() {
        lanes[i % threads].push(item);
    }
    let run = |lane: Vec<(usize, &mut AdamW, &[Tensor], &[Tensor])>| {
        lane.into_iter()
            .map(|(k, o, p, g)| (k, o.step_scaled(p, g, lr, grad_scale)))
            .collect::<Vec<_>>()
    };
    let mut done: Vec<(usize, Result<Vec<Tensor>>)> = if threads == 1 {
        lanes.into_iter().flat_map(run).collect()
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = lanes
                .into_iter()
                .map(|lane| scope.spawn(move || run(lane)))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join().unwrap_or_else(|_| {
                        vec![(
                            0,
                            Err(TrainError::invariant("an optimizer thread panicked")),
                        )]
                    })
                })
                .collect()
        })
    };
    done.sort_by_key(|(k, _)| *k);
    let mut updated: Vec<Option<Vec<Tensor>>> = vec![None; optimizers.len()];
    for (k, result) in done {
        updated[k] = Some(result?);
    }
    Ok(updated)
}

/// The squared L2 norm of each tensor, summed in f64.
pub fn squared_norms(grads: &[Tensor]) -> Result<Vec<f64>> {
    grads
        .iter()
        .enumerate()
        .map(|(i, g)| {
            squared_norm(g).map_err(TrainError::kernel(format!("squared norm of gradient {i}")))
        })
        .collect()
}

/// The global L2 norm from squared norms, summed in the order given.
pub fn global_norm(norms_squared: &[f64]) -> f64 {
    norms_squared.iter().sum::<f64>().sqrt()
}

/// The factor that scales gradients of norm `global_norm` to at most `max_norm`, as PyTorch's
/// `clip_grad_norm_`: `min(1, max_norm / (global_norm + 1e-6))`. Fails for a non-finite norm
/// ([`TrainError::NonFiniteNorm`]) or a `max_norm` that is not finite and positive.
pub fn clip_scale(global_norm: f64, max_norm: f64) -> Result<f64> {
    if !global_norm.is_finite() {
        return Err(TrainError::NonFiniteNorm { norm: global_norm });
    }
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(TrainError::invalid(
            "max_norm",
            max_norm,
            "must be finite and positive",
        ));
    }
    Ok((max_norm / (global_norm + 1e-6)).min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn tensor(values: &[f64], shape: &[usize], dtype: DType) -> Tensor {
        let t = Tensor::from_vec(values.to_vec(), shape, &Device::Cpu).unwrap();
        t.to_dtype(dtype).unwrap()
    }

    fn values(t: &Tensor) -> Vec<f64> {
        let t = t.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
        t.to_vec1::<f64>().unwrap()
    }

    fn assert_close(actual: &[f64], expected: &[f64], tol: f64) {
        assert_eq!(actual.len(), expected.len());
        for (a, e) in actual.iter().zip(expected) {
            assert!((a - e).abs() <= tol, "{actual:?} vs {expected:?}");
        }
    }

    /// Two steps by hand, lr 0.1, defaults (β1 0.9, β2 0.95, ε 1e-8, λ 0.1), gradients `g`
    /// then `-g` for a matrix (decayed) and a bias (not decayed):
    /// step 1: m = 0.1g, v = 0.05g², m̂ = g, √v̂ = |g|, so p1 = p·(1 - λ·lr) - lr·g/(|g| + ε);
    /// step 2: m = 0.09g - 0.1g = -0.01g, v = (0.0475 + 0.05)g² = 0.0975g² = (1 - β2²)g², so
    /// √v̂ = |g|, m̂ = -0.01g/0.19, and p2 = p1·(1 - λ·lr) + lr·(0.01/0.19)·g/(|g| + ε).
    fn hand_computed(p: f64, g: f64, decay: bool) -> [f64; 2] {
        let keep = if decay { 1.0 - 0.1 * 0.1 } else { 1.0 };
        let unit = g / (g.abs() + 1e-8);
        let p1 = p * keep - 0.1 * unit;
        let p2 = p1 * keep + 0.1 * (0.01 / 0.19) * unit;
        [p1, p2]
    }

    fn two_steps(dtype: DType, tol: f64) {
        let (w, gw) = ([1.0, -2.0, 0.5, 3.0], [0.5, -1.0, 2.0, 0.25]);
        let (b, gb) = ([0.1, -0.3], [-4.0, 1e-3]);
        let params = vec![
            ("w".to_string(), tensor(&w, &[2, 2], dtype)),
            ("b".to_string(), tensor(&b, &[2], dtype)),
        ];
        let mut opt = AdamW::new(AdamWConfig::default(), &params).unwrap();
        let mut current: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
        for (step, sign) in [1.0, -1.0].into_iter().enumerate() {
            let grads = [
                tensor(&gw.map(|g| sign * g), &[2, 2], dtype),
                tensor(&gb.map(|g| sign * g), &[2], dtype),
            ];
            current = opt.step(&current, &grads, 0.1).unwrap();
            let expect_w: Vec<f64> = (0..4)
                .map(|i| hand_computed(w[i], gw[i], true)[step])
                .collect();
            let expect_b: Vec<f64> = (0..2)
                .map(|i| hand_computed(b[i], gb[i], false)[step])
                .collect();
            assert_close(&values(&current[0]), &expect_w, tol);
            assert_close(&values(&current[1]), &expect_b, tol);
            assert_eq!(current[0].dtype(), dtype);
        }
        assert_eq!(opt.steps_taken(), 2);
    }

    #[test]
    fn two_steps_match_the_hand_computation() {
        two_steps(DType::F64, 1e-12);
        two_steps(DType::F32, 1e-6);
    }

    #[test]
    fn zero_gradients_decay_only_matrices() {
        let params = vec![
            ("w".to_string(), tensor(&[2.0; 4], &[2, 2], DType::F64)),
            ("b".to_string(), tensor(&[2.0; 2], &[2], DType::F64)),
        ];
        let mut opt = AdamW::new(AdamWConfig::default(), &params).unwrap();
        let current: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
        let grads = [
            tensor(&[0.0; 4], &[2, 2], DType::F64),
            tensor(&[0.0; 2], &[2], DType::F64),
        ];
        let next = opt.step(&current, &grads, 0.5).unwrap();
        assert_eq!(values(&next[0]), vec![2.0 * 0.95; 4]);
        assert_eq!(values(&next[1]), vec![2.0; 2]);
    }

    #[test]
    fn state_round_trips_by_name_and_steps_are_deterministic() {
        let params = vec![("w".to_string(), tensor(&[1.0, 2.0], &[1, 2], DType::F32))];
        let grads = [tensor(&[0.3, -0.7], &[1, 2], DType::F32)];
        let p = [params[0].1.clone()];
        let mut a = AdamW::new(AdamWConfig::default(), &params).unwrap();
        let p1 = a.step(&p, &grads, 0.01).unwrap();
        let mut b = AdamW::new(AdamWConfig::default(), &params).unwrap();
        b.load_state(&a.state()).unwrap();
        let (pa, pb) = (
            a.step(&p1, &grads, 0.01).unwrap(),
            b.step(&p1, &grads, 0.01).unwrap(),
        );
        assert_eq!(values(&pa[0]), values(&pb[0]));
        assert_eq!(b.steps_taken(), 2);
        let mut empty = OptimizerState::default();
        assert!(matches!(
            b.load_state(&empty),
            Err(TrainError::MissingTensor { .. })
        ));
        empty.merge(a.state()).unwrap();
        assert!(empty.merge(a.state()).is_err(), "a parameter held twice");
    }

    #[test]
    fn mismatched_arguments_are_refused_without_changing_state() {
        let params = vec![("w".to_string(), tensor(&[1.0, 2.0], &[2], DType::F32))];
        let mut opt = AdamW::new(AdamWConfig::default(), &params).unwrap();
        let p = [params[0].1.clone()];
        let wrong = [tensor(&[1.0, 2.0, 3.0], &[3], DType::F32)];
        assert!(matches!(
            opt.step(&p, &wrong, 0.1),
            Err(TrainError::TensorShape { .. })
        ));
        assert!(opt.step(&p, &[], 0.1).is_err());
        assert!(opt.step(&p, &p, f64::NAN).is_err());
        assert_eq!(opt.steps_taken(), 0);
        let bad = AdamWConfig {
            beta2: 1.0,
            ..Default::default()
        };
        assert!(AdamW::new(bad, &params).is_err());
    }

    #[test]
    fn clipping_scales_only_large_norms() {
        let norms = squared_norms(&[
            tensor(&[3.0], &[1], DType::F32),
            tensor(&[4.0], &[1], DType::F64),
        ]);
        let norm = global_norm(&norms.unwrap());
        assert_eq!(norm, 5.0);
        assert_eq!(clip_scale(norm, 10.0).unwrap(), 1.0);
        assert!((clip_scale(norm, 1.0).unwrap() - 1.0 / (5.0 + 1e-6)).abs() < 1e-15);
        assert!(matches!(
            clip_scale(f64::NAN, 1.0),
            Err(TrainError::NonFiniteNorm { .. })
        ));
        assert!(matches!(
            clip_scale(f64::INFINITY, 1.0),
            Err(TrainError::NonFiniteNorm { .. })
        ));
        assert!(clip_scale(1.0, 0.0).is_err());
    }
}
