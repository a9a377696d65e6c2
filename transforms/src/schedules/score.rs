//! The one score by which schedules compete: the longest per-rank span (first start to last end,
//! what the Zero Bubble paper's bubble rate is measured on), then the makespan; a simulated
//! candidate ([`Scored`]) with the constraints searches hold it to, and the local search's budget.

use pipeweave_core::{max_peak, simulate, Plan, Simulation, Task, TOLERANCE};

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
        self.max_span < other.max_span - TOLERANCE
            || (self.max_span < other.max_span + TOLERANCE
                && self.makespan < other.makespan - TOLERANCE)
    }
}

/// A candidate order set, simulated, with its score and peak.
#[derive(Clone, Debug)]
pub struct Scored {
    /// The orders.
    pub orders: Vec<Vec<Task>>,
    /// Its score.
    pub score: Score,
    /// Its largest per-rank peak activations.
    pub peak: f64,
}

impl Scored {
    /// `orders` on `plan`, simulated: None when they do not hold every op of the plan or do not
    /// run, when their peak is above `limit` or their makespan above `bound`. Candidates come
    /// from this crate's generators: the op count (with the simulator rejecting repeats and
    /// deadlocks) stands in for full verification, which the driver runs on the winner.
    pub fn evaluate(
        plan: &Plan,
        orders: Vec<Vec<Task>>,
        limit: Option<f64>,
        bound: Option<f64>,
    ) -> Option<Scored> {
        let candidate = plan.clone().with_orders(orders).ok()?;
        let ops: usize = candidate
            .orders()
            .iter()
            .flatten()
            .map(|t| t.op_array().1)
            .sum();
        if ops != plan.problem().work_count() * 3 {
            return None;
        }
        let peak = max_peak(&candidate);
        if limit.is_some_and(|l| peak > l + TOLERANCE) {
            return None;
        }
        let simulation = simulate(&candidate).ok()?;
        if bound.is_some_and(|b| simulation.makespan() > b + TOLERANCE) {
            return None;
        }
        Some(Scored {
            score: Score::of(&simulation),
            peak,
            orders: candidate.orders().to_vec(),
        })
    }

    /// A better score, or an equal one and a lower peak.
    pub fn beats(&self, other: &Scored) -> bool {
        self.score.beats(other.score)
            || (!other.score.beats(self.score) && self.peak < other.peak - TOLERANCE)
    }
}

/// Simulated ops a local search ([`crate::schedules::refine`]) may spend on `plan`: its number of
/// candidate evaluations is 200,000 divided by the plan's op count, between 8 and 400.
pub fn refine_budget(plan: &Plan) -> usize {
    const OPS: usize = 200_000;
    let ops = plan.problem().work_count() * 3;
    (OPS / ops.max(1)).clamp(8, 400)
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
