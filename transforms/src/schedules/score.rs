//! The one score by which schedules compete: the longest per-rank span (first start to last end,
//! what the Zero Bubble paper's bubble rate is measured on), then the makespan.

use pipeweave_core::Simulation;

/// Differences below this are floating-point noise.
const EPSILON: f64 = 1e-9;

/// A schedule's score; lower is better.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Score {
    /// The longest per-rank span.
    pub max_span: f64,
    /// When the last task ends.
    pub makespan: f64,
}

impl Score {
    /// The score of a simulated schedule.
    pub fn of(simulation: &Simulation) -> Score {
        Score {
            max_span: simulation.max_span(),
            makespan: simulation.makespan(),
        }
    }

    /// Whether this score beats `other`: a shorter span, or the same span and a shorter
    /// makespan, beyond floating-point noise.
    pub fn beats(self, other: Score) -> bool {
        self.max_span < other.max_span - EPSILON
            || (self.max_span < other.max_span + EPSILON
                && self.makespan < other.makespan - EPSILON)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_first_then_makespan_beyond_noise() {
        let s = |max_span, makespan| Score { max_span, makespan };
        assert!(s(9.0, 20.0).beats(s(10.0, 10.0)));
        assert!(s(10.0, 9.0).beats(s(10.0, 10.0)));
        assert!(!s(10.0 + 1e-12, 10.0).beats(s(10.0, 10.0)));
        assert!(!s(10.0, 10.0).beats(s(10.0, 10.0)));
    }
}
