//! [`Threshold`]: the outcomes of a run's comparisons against one value (a memory limit, a
//! bound), so that a deterministic search can tell which other values would have made it run
//! exactly the same way. The list scheduler ([`super::greedy`]) and the local search
//! ([`super::refine`]) record them; the ladder's memo ([`super::memo`]) reuses their runs.

use pipeweave_core::TOLERANCE;

/// The outcomes of a run's comparisons `x <= v + TOLERANCE` against one value `v` (a memory
/// limit, a bound): the largest `x` that passed and the smallest that failed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    passed: f64,
    failed: Option<f64>,
}

impl Default for Threshold {
    fn default() -> Threshold {
        Threshold::new()
    }
}

impl Threshold {
    /// No comparison made yet: admits every value.
    pub const fn new() -> Threshold {
        Threshold {
            passed: f64::NEG_INFINITY,
            failed: None,
        }
    }

    /// Whether `x <= v + TOLERANCE`, recorded.
    #[inline]
    pub fn check(&mut self, x: f64, v: f64) -> bool {
        let ok = x <= v + TOLERANCE;
        self.record(x, ok);
        ok
    }

    /// Records that `x` passed (`ok`) or failed the comparison. A NaN never passes, against any
    /// value, so a NaN failure constrains nothing.
    #[inline]
    pub fn record(&mut self, x: f64, ok: bool) {
        if ok {
            self.passed = self.passed.max(x);
        } else if !x.is_nan() {
            self.failed = Some(self.failed.map_or(x, |f| f.min(x)));
        }
    }

    /// Whether every recorded comparison has the same outcome against `v`.
    pub fn admits(&self, v: f64) -> bool {
        self.passed <= v + TOLERANCE && self.failed.is_none_or(|f| f > v + TOLERANCE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threshold_admits_the_values_that_give_every_comparison_its_outcome() {
        let mut t = Threshold::new();
        assert!(t.admits(0.0) && t.admits(1e9));
        assert!(t.check(2.0, 3.0));
        assert!(!t.check(5.0, 3.0));
        assert!(t.admits(2.0) && t.admits(4.5) && t.admits(5.0 - 2.0 * TOLERANCE));
        assert!(!t.admits(1.0) && !t.admits(5.0));
        // A NaN fails against everything: it constrains nothing.
        assert!(!t.check(f64::NAN, 3.0));
        assert!(t.admits(4.0));
    }
}
