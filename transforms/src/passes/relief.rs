//! The memory-relief pass, [`Relief`]: `recompute(schedule, memory=N)` and
//! `offload(schedule, memory=N)`, one pass generic over what it does to a (stage, microbatch)
//! pair, its [`ReliefStrategy`] ([`Recompute`](super::Recompute), documented in `recompute.rs`,
//! and [`Offload`](super::Offload), in `offload.rs`).
//!
//! Both fit every rank's peak into `N` with the relief loop of [`crate::schedules::relief`]: the
//! strategy proposes, for each pair held across a break of the limit, the tasks that relieve it
//! with an estimate of their cost; the loop applies the cheapest until the plan fits. What the
//! two share is here: fitting with activations alone and, for a strategy that reaches what Ws
//! keep, with those too, keeping the faster (activations alone on ties; a plan where no W runs
//! apart from its I is fitted once, as both fits would be the same step for step); the
//! argument, the contract, the target limit, the error when the limit cannot be reached (naming
//! the least the strategy reaches on the plan) and the declared limit of the result.
//!
//! Cost: the loop re-times only what each rank's relief reaches (a
//! [`Retimer`](pipeweave_core::analysis::retime::Retimer)), so the pass grows with the plan as
//! the planner does: at 1000 ranks x 24 microbatches, 1F1B's plan takes 0.07 s on two cores,
//! `recompute(.., memory=5)` 0.2 s and `offload(.., memory=5)` 0.4 s (15 s and 79 s when every
//! step replayed the whole plan; `benches/memory_passes.rs`).
//!
//! Requires: a scheduled plan (any pacing but unscheduled), any layout, split or whole backwards,
//! none of the strategy's own residency tasks yet (the other strategy's are left as they are).
//! May change: the orders, the residency fact, the declared memory limit (`N`, or the lower of `N`
//! and `--memory-limit`).
//! Preconditions: `N > 0`; a limit (`memory=N` or a declared one) that the strategy can reach.

use crate::error::TransformError;
use crate::pass::{Changes, Contract, Pass, Requires};
use crate::schedules::relief::{
    floor, relieve, stuck_error, target_limit, windows, Proposal, Reach, Span, Step, Stuck, Window,
    EPSILON,
};
use pipeweave_core::{simulate, Plan, Residency, Task};
use std::fmt::Debug;

/// What a relief pass does to the pairs it relieves: recompute them, offload them, or a
/// researcher's own way; [`Relief`] is the pass around it.
pub trait ReliefStrategy: Copy + Debug + PartialEq + Send + Sync + 'static {
    /// The pass's name: in expressions, the registry and errors.
    const NAME: &'static str;
    /// What the strategy does to a pair, as errors say it (`recomputed`, `offloaded`).
    const DONE: &'static str;
    /// Proposals simulated per step of the relief loop (see [`relieve`]); by default one: the
    /// estimates decide alone, and every break of a rank is relieved in one sweep.
    const TRIES: usize = 1;
    /// The residencies the pass accepts: activations kept, or relieved by other strategies only.
    const ACCEPTS: &'static [Residency];
    /// The windows the strategy can relieve on `plan`: by default a pair's activations
    /// (forward to input-gradient backward); an offload also takes what a W keeps between a
    /// split backward's I and W, and a recompute does unless told to keep it (or the plan's
    /// sequences are split into chunks: a chunk's I run again would send its keys' gradients
    /// back twice).
    fn reach(&self, plan: &Plan) -> Reach {
        let _ = plan;
        Reach::Activations
    }

    /// The strategy's own arguments as `describe` writes them (`weight_grads=keep`), if any.
    fn arguments(&self) -> Option<String> {
        None
    }

    /// The proposal for `window`, one of `step`'s candidates, with its estimated cost.
    fn propose(&self, step: &Step<'_>, window: &Window) -> Proposal;

    /// The tasks that relieve `window`'s pair over its whole window (what the least the
    /// strategy can reach is measured with).
    fn relieve_whole(&self, window: &Window) -> Vec<(usize, Task)>;

    /// The plan that fits `limit`, finished (by default as it is).
    fn finish(&self, plan: Plan, limit: f64) -> Plan {
        let _ = limit;
        plan
    }
}

/// The relief pass with strategy `S`: named `S::NAME`, fitting `memory` activations per rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Relief<S: ReliefStrategy> {
    strategy: S,
    memory: Option<f64>,
}

impl<S: ReliefStrategy> Relief<S> {
    /// The pass's name: in expressions, the registry and errors.
    pub const NAME: &'static str = S::NAME;

    /// The pass fitting `memory` activations per rank (None: the plan's declared limit); `memory`
    /// must be a positive number.
    pub fn new(strategy: S, memory: Option<f64>) -> Result<Relief<S>, TransformError> {
        match memory {
            Some(m) if !(m.is_finite() && m > 0.0) => Err(TransformError::precondition(
                S::NAME,
                "memory > 0",
                format!("memory={m} is not a positive number of activations"),
            )),
            _ => Ok(Relief { strategy, memory }),
        }
    }

    /// The strategy.
    pub fn strategy(&self) -> S {
        self.strategy
    }
}

impl<S: ReliefStrategy> Pass for Relief<S> {
    fn name(&self) -> &str {
        S::NAME
    }

    fn contract(&self) -> Contract {
        Contract::new(
            Requires::paced(Requires::SCHEDULED).with_residency(S::ACCEPTS),
            Changes::RESIDENCY.and(Changes::MEMORY_LIMIT),
        )
    }

    fn describe(&self) -> String {
        let memory = self.memory.map(|m| format!("memory={m}"));
        let arguments: Vec<String> = memory
            .into_iter()
            .chain(self.strategy.arguments())
            .collect();
        if arguments.is_empty() {
            S::NAME.to_string()
        } else {
            format!("{}({})", S::NAME, arguments.join(", "))
        }
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let limit = target_limit(self.memory, &plan)?;
        let reach = self.strategy.reach(&plan);
        let fitted = match reach {
            // Without a W run apart from its I, the wider fit is this one, step for step.
            Reach::Activations => self.fit(&plan, limit, reach),
            _ if !keeps_for_weight_grads(&plan) => self.fit(&plan, limit, Reach::Activations),
            // What a W keeps is relieved only where that makes the plan faster: the estimates
            // of a W's relief can mislead the greedy loop, so activations alone are tried too,
            // and win ties (they need less of a runtime).
            Reach::WeightGrads => match self.fit(&plan, limit, Reach::Activations) {
                Err(_) => self.fit(&plan, limit, reach),
                Ok(activations) => match self.fit(&plan, limit, reach) {
                    Ok(wider) if makespan(&wider) < makespan(&activations) - EPSILON => Ok(wider),
                    _ => Ok(activations),
                },
            },
        }
        .map_err(|stuck| {
            let least = floor(&plan, reach, |window| self.strategy.relieve_whole(window));
            stuck_error(S::DONE, reach, limit, &stuck, least)
        })?;
        fitted
            .with_memory_limit(Some(limit))
            .map_err(|e| TransformError::core(S::NAME, e))
    }
}

impl<S: ReliefStrategy> Relief<S> {
    /// `plan` fitted to `limit` by relieving the windows `reach` takes, finished.
    fn fit(&self, plan: &Plan, limit: f64, reach: Reach) -> Result<Plan, Stuck> {
        let fitted = relieve(plan.clone(), limit, S::TRIES, reach, |step| {
            let propose = |window| self.strategy.propose(step, window);
            step.candidates.iter().map(propose).collect()
        })?;
        Ok(self.strategy.finish(fitted, limit))
    }
}

/// Whether some pair of `plan` keeps memory for its W between its I and W (a window
/// [`Reach::WeightGrads`] adds): relief never splits a backward, so a plan without one gets none.
fn keeps_for_weight_grads(plan: &Plan) -> bool {
    plan.orders().iter().any(|order| {
        windows(order, Reach::WeightGrads)
            .iter()
            .any(|w| w.span == Span::WeightGrad)
    })
}

/// The plan's simulated makespan (infinite where it does not simulate).
fn makespan(plan: &Plan) -> f64 {
    simulate(plan).map_or(f64::INFINITY, |s| s.makespan())
}
