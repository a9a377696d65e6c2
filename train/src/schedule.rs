//! [`LrSchedule`]: the learning rate of each optimizer step — a linear warm-up to the peak, then
//! a cosine decay to a floor, then the floor.
//!
//! Steps count from 1, as in the training log (`"step": 1` is the first optimizer step):
//!
//! - `1 ≤ step ≤ warmup`: `peak · step / warmup` (the peak is reached at step `warmup`);
//! - `warmup < step < total`: `min + (peak - min) · (1 + cos(π · (step - warmup) / (total -
//!   warmup))) / 2`;
//! - `step ≥ total` (after the warm-up): `min`.
//!
//! Step 0 (before any step) gives 0 with a warm-up, else the peak. With `warmup ≥ total` the
//! run only warms up (and the floor follows the warm-up).

use crate::error::{Result, TrainError};

/// A warm-up then cosine learning-rate schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    peak: f64,
    min_lr: f64,
    warmup: u64,
    total: u64,
}

impl LrSchedule {
    /// Warm-up over `warmup` steps to `peak`, cosine decay to `min_lr` at step `total`; fails
    /// unless `0 ≤ min_lr ≤ peak`, both finite.
    pub fn new(peak: f64, min_lr: f64, warmup: u64, total: u64) -> Result<LrSchedule> {
        if !(peak.is_finite() && peak >= 0.0) {
            return Err(TrainError::invalid(
                "lr",
                peak,
                "must be finite and non-negative",
            ));
        }
        if !(min_lr.is_finite() && (0.0..=peak).contains(&min_lr)) {
            let reason = format!("must be finite and within [0, lr = {peak}]");
            return Err(TrainError::invalid("min_lr", min_lr, reason));
        }
        Ok(LrSchedule {
            peak,
            min_lr,
            warmup,
            total,
        })
    }

    /// The constant learning rate `lr` (no warm-up, no decay).
    pub fn constant(lr: f64) -> Result<LrSchedule> {
        LrSchedule::new(lr, lr, 0, 0)
    }

    /// The peak learning rate.
    pub fn peak(&self) -> f64 {
        self.peak
    }

    /// The floor reached at the last step.
    pub fn min_lr(&self) -> f64 {
        self.min_lr
    }

    /// The learning rate of optimizer step `step` (counting from 1).
    pub fn lr(&self, step: u64) -> f64 {
        if self.warmup > 0 && step <= self.warmup {
            return self.peak * step as f64 / self.warmup as f64;
        }
        if step >= self.total {
            return self.min_lr;
        }
        let progress = (step - self.warmup) as f64 / (self.total - self.warmup) as f64;
        let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
        self.min_lr + (self.peak - self.min_lr) * cosine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn warm_up_reaches_the_peak_then_decays_to_the_floor() {
        let s = LrSchedule::new(1e-3, 1e-4, 10, 110).unwrap();
        assert_eq!(s.lr(0), 0.0);
        assert!(close(s.lr(1), 1e-4));
        assert!(close(s.lr(5), 5e-4));
        assert_eq!(s.lr(10), 1e-3);
        assert!(
            close(s.lr(60), 0.5 * (1e-3 + 1e-4)),
            "half-way down the cosine"
        );
        assert!(s.lr(11) < 1e-3 && s.lr(11) > s.lr(12));
        assert_eq!(s.lr(110), 1e-4);
        assert_eq!(s.lr(1_000), 1e-4);
    }

    #[test]
    fn without_warm_up_the_first_steps_are_near_the_peak() {
        let s = LrSchedule::new(2.0, 0.0, 0, 4).unwrap();
        assert_eq!(s.lr(0), 2.0);
        assert!(close(s.lr(2), 1.0));
        assert_eq!(s.lr(4), 0.0);
    }

    #[test]
    fn constant_and_warm_up_only_schedules() {
        let c = LrSchedule::constant(0.3).unwrap();
        assert!([0, 1, 7, u64::MAX].iter().all(|&k| c.lr(k) == 0.3));
        let w = LrSchedule::new(1.0, 0.5, 10, 5).unwrap();
        assert!(close(w.lr(5), 0.5) && w.lr(10) == 1.0 && w.lr(11) == 0.5);
    }

    #[test]
    fn bad_rates_are_refused() {
        assert!(LrSchedule::new(f64::NAN, 0.0, 1, 2).is_err());
        assert!(LrSchedule::new(1.0, 2.0, 1, 2).is_err());
        assert!(LrSchedule::new(-1.0, 0.0, 1, 2).is_err());
    }
}
