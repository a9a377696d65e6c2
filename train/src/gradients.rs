//! Where weight gradients go: the [`GradSync`] trait, and its in-process implementation that
//! folds every position's gradients (DualPipe's mirrored replicas included) into one sum.
//!
//! With `deterministic`, the gradients of a position are summed in microbatch order — a left fold
//! `((g₀ + g₁) + g₂) + …` whatever the schedule, the rank count or the routes — so every schedule
//! gives the same bits as a single rank. A gradient that arrives early waits until its
//! predecessors have been added (the memory this costs is what the schedule runs out of order).
//! Without it, gradients are added as they arrive (within f32 rounding of the same sum).

use crate::error::TrainError;
use candle_core::Tensor;
use pipeweave_backends::StageError;
use pipeweave_core::FailureKind;
use pipeweave_kernels::{KernelError, TensorSum};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// What a stage compute hands its weight gradients to.
pub trait GradSync: Send + Sync {
    /// The weight gradients of one microbatch at one position, one per parameter.
    fn add(&self, position: usize, microbatch: u32, grads: Vec<Tensor>) -> Result<(), StageError>;

    /// A stage at `position` has produced its last weight gradient of the step on this rank: a
    /// data-parallel implementation starts its all-reduce here. In process, nothing to do.
    fn stage_complete(&self, _position: usize) -> Result<(), StageError> {
        Ok(())
    }
}

/// One position's running sum.
#[derive(Debug, Default)]
struct Fold {
    /// The next microbatch to add (deterministic order).
    next: u32,
    /// Gradients that arrived before their predecessors.
    waiting: BTreeMap<u32, Vec<Tensor>>,
    sum: Sum,
    added: u32,
}

/// A running sum: the first microbatch's tensors as they came (one microbatch needs no copy),
/// then one buffer per parameter that later microbatches are added into in place (the same bits
/// as candle's `add`, without a parameter-sized allocation per microbatch).
#[derive(Debug, Default)]
enum Sum {
    #[default]
    Empty,
    First(Vec<Tensor>),
    Running(Vec<TensorSum>),
}

fn summing_failed(e: KernelError) -> StageError {
    if e.is_about_data() {
        StageError::caused_by(FailureKind::Bug, "adding weight gradients", e)
    } else {
        StageError::caused_by(FailureKind::Failed, "adding weight gradients", e)
    }
}

impl Fold {
    fn add_now(&mut self, grads: Vec<Tensor>) -> Result<(), StageError> {
        self.added += 1;
        self.sum = match std::mem::take(&mut self.sum) {
            Sum::Empty => Sum::First(grads),
            Sum::First(first) => {
                if first.len() != grads.len() {
                    return Err(StageError::bug(format!(
                        "{} weight gradients where earlier microbatches had {}",
                        grads.len(),
                        first.len()
                    )));
                }
                let mut sums = first
                    .iter()
                    .map(TensorSum::new)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(summing_failed)?;
                Self::add_all(&mut sums, &grads)?;
                Sum::Running(sums)
            }
            Sum::Running(mut sums) => {
                if sums.len() != grads.len() {
                    return Err(StageError::bug(format!(
                        "{} weight gradients where earlier microbatches had {}",
                        grads.len(),
                        sums.len()
                    )));
                }
                Self::add_all(&mut sums, &grads)?;
                Sum::Running(sums)
            }
        };
        Ok(())
    }

    fn add_all(sums: &mut [TensorSum], grads: &[Tensor]) -> Result<(), StageError> {
        for (sum, grad) in sums.iter_mut().zip(grads) {
            sum.add(grad).map_err(summing_failed)?;
        }
        Ok(())
    }

    fn into_tensors(self) -> Result<Option<Vec<Tensor>>, TrainError> {
        match self.sum {
            Sum::Empty => Ok(None),
            Sum::First(first) => Ok(Some(first)),
            Sum::Running(sums) => sums
                .into_iter()
                .map(|sum| {
                    sum.into_tensor()
                        .map_err(TrainError::kernel("summing weight gradients"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
        }
    }
}

/// A position's summed gradients (None when it received none) and how many microbatches it summed.
pub type PositionSum = (Option<Vec<Tensor>>, u32);

/// The in-process [`GradSync`]: one fold per position, shared by the rank threads.
#[derive(Debug)]
pub struct LocalGradients {
    deterministic: bool,
    folds: Vec<Mutex<Fold>>,
}

impl LocalGradients {
    /// Folds for `positions` positions.
    pub fn new(positions: usize, deterministic: bool) -> LocalGradients {
        LocalGradients {
            deterministic,
            folds: (0..positions)
                .map(|_| Mutex::new(Fold::default()))
                .collect(),
        }
    }

    /// Every position's summed gradients (None for a position that received none), and how
    /// many microbatches each summed; fails when a deterministic fold still waits for a
    /// microbatch.
    pub fn into_sums(self) -> Result<Vec<PositionSum>, TrainError> {
        self.folds
            .into_iter()
            .enumerate()
            .map(|(position, fold)| {
                let fold = fold
                    .into_inner()
                    .map_err(|_| TrainError::invariant("a gradient fold was poisoned"))?;
                if let Some(&first) = fold.waiting.keys().next() {
                    return Err(TrainError::invariant(format!(
                        "position {position}: the gradient of microbatch {} never arrived, {first} waits for it",
                        fold.next
                    )));
                }
                let added = fold.added;
                Ok((fold.into_tensors()?, added))
            })
            .collect()
    }
}

impl GradSync for LocalGradients {
    fn add(&self, position: usize, microbatch: u32, grads: Vec<Tensor>) -> Result<(), StageError> {
        let fold = self
            .folds
            .get(position)
            .ok_or_else(|| StageError::bug(format!("no gradient fold for position {position}")))?;
        let mut fold = fold
            .lock()
            .map_err(|_| StageError::bug("a gradient fold was poisoned"))?;
        if !self.deterministic {
            return fold.add_now(grads);
        }
        if microbatch < fold.next || fold.waiting.contains_key(&microbatch) {
            return Err(StageError::bug(format!(
                "position {position}: the gradient of microbatch {microbatch} arrived twice"
            )));
        }
        fold.waiting.insert(microbatch, grads);
        loop {
            let next = fold.next;
            let Some(ready) = fold.waiting.remove(&next) else {
                break;
            };
            fold.add_now(ready)?;
            fold.next += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn scalar(x: f32) -> Vec<Tensor> {
        vec![Tensor::new(&[x], &Device::Cpu).unwrap()]
    }

    fn value(t: &[Tensor]) -> f32 {
        t[0].to_vec1::<f32>().unwrap()[0]
    }

    #[test]
    fn deterministic_sums_follow_microbatch_order_whatever_the_arrival() {
        // 1e8 + 1 - 1e8 depends on the order in f32.
        let values = [1.0e8f32, 1.0, -1.0e8];
        let in_order = LocalGradients::new(1, true);
        let shuffled = LocalGradients::new(1, true);
        for (m, v) in values.iter().enumerate() {
            in_order.add(0, m as u32, scalar(*v)).unwrap();
        }
        for m in [2usize, 0, 1] {
            shuffled.add(0, m as u32, scalar(values[m])).unwrap();
        }
        let a = in_order.into_sums().unwrap();
        let b = shuffled.into_sums().unwrap();
        assert_eq!(
            value(a[0].0.as_ref().unwrap()).to_bits(),
            value(b[0].0.as_ref().unwrap()).to_bits()
        );
        assert_eq!(a[0].1, 3);
    }

    #[test]
    fn a_missing_or_repeated_microbatch_is_an_error() {
        let grads = LocalGradients::new(1, true);
        grads.add(0, 1, scalar(1.0)).unwrap();
        let twice = grads.add(0, 1, scalar(1.0)).unwrap_err();
        assert!(twice.to_string().contains("arrived twice"), "{twice}");
        assert_eq!(twice.kind(), FailureKind::Bug);
        let missing = grads.into_sums().unwrap_err();
        assert!(
            missing.to_string().contains("microbatch 0 never arrived"),
            "{missing}"
        );
        assert_eq!(missing.kind(), FailureKind::Bug);
    }
}
