//! `recompute(schedule, memory=N)`: activation recomputation chosen per (stage, microbatch) pair,
//! so that every rank's peak fits `N`.
//!
//! Source: activation checkpointing (Chen et al. 2016), chosen per stage by AdaPipe and placed into
//! the pipeline's bubbles by Mario (Liu et al. 2024). A recomputed pair's forward keeps only its
//! stage input (the memory model's `checkpoint`, default 0); an `R` task (cost key `R`, default F)
//! runs the forward again right before the pair's backward, so on a rank that waits there for the
//! gradient the recompute fills that wait instead of delaying the backward.
//!
//! What a W keeps between a split backward's I and W (ZB-H1/H2, ZB-V, V-Half/V-Min, DualPipe)
//! can be recomputed too: the pair's I drops it, keeping the stage input and the output gradient
//! it received (the memory model's `weight_grad_checkpoint`, twice `checkpoint`), and an `RW`
//! task right before the W runs the forward and the I again (cost `R` + `I`) to rebuild it.
//! The pass fits with activations alone and, where that fits, takes the RWs only if the plan
//! with them is faster (the greedy loop's estimates of an RW can mislead it: ZB-H1 at 4 x 8 with
//! PyTorch's 2/3 of a stage kept for W, 3.1 units: 36 with RWs, 33 without).
//! `weight_grads=keep` leaves what a W keeps alone (recomputing activations only): for runtimes
//! that cannot rebuild it, such as PyTorch's, whose I keeps the autograd graph for the W.
//!
//! Which pairs: the relief loop of [`crate::schedules::relief`]. At the first task where a rank
//! holds more than `N`, every pair held across it is a candidate; each is estimated by the time its
//! recompute adds beyond the idle time before its backward and the backward's slack (how late it
//! may start before the plan ends later; longest-held first on ties), and the cheapest are taken
//! until the break fits; every break of the rank in one sweep, then the plan is simulated again
//! for the next rank's estimates; repeated until the plan fits. A pair whose
//! backward is the next task still saves its memory everywhere before it. The estimates decide
//! alone (the relief loop's default of one proposal simulated per step): with the backwards'
//! slack they rank within 2.5% of simulating the three cheapest per break, at a tenth of the
//! time (measured over 1F1B, ZB-V and V-Min at 16 ranks).
//!
//! The pass is [`Relief<Recompute>`](super::Relief) (`relief.rs`: the argument, the contract and
//! the limit it shares with `offload`); this file holds the strategy.
//! Requires: a scheduled plan (any pacing but unscheduled), any layout, split or whole backwards,
//! no recompute yet (offloaded pairs are left as they are). May change: the orders, the residency
//! fact, the declared memory limit (`N`, or the lower of `N` and `--memory-limit`).
//! Preconditions: `N > 0`; a limit (`memory=N` or a declared one) that recomputing can reach: the
//! error names the least it reaches on the plan (what a running task holds, and what a whole
//! backward's W keeps, cannot be dropped).
//!
//! Before and after, 1F1B at 2 ranks and 3 microbatches, `memory=1`, unit costs: rank 0 holds two
//! forwards at its peak; every pair of rank 0 is recomputed, microbatch 0 while the rank waits for
//! its gradient (free), the others on the critical path.
//! ```text
//! rank  0 | F0 F1 .  .  B0 ~  F2 B1 ~  .  B2 ~
//! rank  1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  .  .
//!
//! rank  0 | F0 F1 R0 .  B0 ~  F2 R1 B1 ~  R2 B2 ~
//! rank  1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  .  .  .
//! ```

use super::relief::ReliefStrategy;
use crate::pass::Requires;
use crate::schedules::relief::{idle_before, Proposal, Reach, Span, Step, Window};
use pipeweave_core::{Plan, Residency, Task};

/// The recompute strategy: `recompute` is [`Relief<Recompute>`](super::Relief), built with
/// `Relief::new(Recompute::default(), memory)`; by default it also recomputes what a W keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recompute {
    weight_grads: WeightGrads,
}

/// What `recompute` does with what a split backward's W keeps between its I and W
/// (`weight_grads=recompute|keep`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightGrads {
    /// Dropped after the I where that fits the limit, rebuilt by an `RW` before the W.
    #[default]
    Recompute,
    /// Kept: only activations are recomputed.
    Keep,
}

impl Default for Recompute {
    fn default() -> Recompute {
        Recompute::new(WeightGrads::default())
    }
}

impl Recompute {
    /// The strategy doing `weight_grads` with what a W keeps.
    pub fn new(weight_grads: WeightGrads) -> Recompute {
        Recompute { weight_grads }
    }

    /// What it does with what a W keeps.
    pub fn weight_grads(&self) -> WeightGrads {
        self.weight_grads
    }
}

/// What rebuilds `window`'s pair: an `R` for its activations, an `RW` for what its W keeps.
fn rebuild(window: &Window) -> Task {
    match window.span {
        Span::Activations => Task::Recompute(window.work),
        Span::WeightGrad => Task::RecomputeWeightGrad(window.work),
    }
}

/// The recompute of `window`'s pair, right before the backward that needs it (its I, or its W).
fn recompute_before_backward(window: &Window) -> Vec<(usize, Task)> {
    vec![(window.backward, rebuild(window))]
}

impl ReliefStrategy for Recompute {
    const NAME: &'static str = "recompute";
    const DONE: &'static str = "recomputed";
    /// Kept, or offloaded (left as they are).
    const ACCEPTS: &'static [Residency] = Requires::KEPT_OR_OFFLOADED;
    /// Activations, and unless `weight_grads=keep` what a W keeps between a split backward's I
    /// and W (an `RW`); activations alone on a plan of sequence chunks (an `RW` would run a
    /// chunk's I again, sending its keys' gradients back twice).
    fn reach(&self, plan: &Plan) -> Reach {
        match self.weight_grads {
            WeightGrads::Recompute if !plan.problem().is_seq_split() => Reach::WeightGrads,
            _ => Reach::Activations,
        }
    }

    fn arguments(&self) -> Option<String> {
        (self.weight_grads == WeightGrads::Keep).then(|| "weight_grads=keep".to_string())
    }

    /// The pair's recompute before its backward (its I, or for what a W keeps its W),
    /// estimated by the time the recompute adds beyond the idle time there and the backward's
    /// slack.
    fn propose(&self, step: &Step<'_>, window: &Window) -> Proposal {
        let task = rebuild(window);
        let idle = idle_before(step.timeline, window.backward);
        let delay = (step.plan.costs().task_duration(&task) - idle).max(0.0);
        let memory = step
            .plan
            .memory()
            .of(window.work.stage, window.work.microbatch)
            .unwrap_or_default();
        let relieves = match window.span {
            Span::Activations => memory.dropped(),
            Span::WeightGrad => memory.weight_grad() - memory.weight_grad_checkpoint(),
        };
        Proposal {
            estimate: (delay - step.slack[window.backward]).max(0.0),
            relieves,
            frees: window.forward + 1..window.backward,
            work: window.work,
            inserted: recompute_before_backward(window),
        }
    }

    fn relieve_whole(&self, window: &Window) -> Vec<(usize, Task)> {
        recompute_before_backward(window)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::TransformError;
    use crate::testing::built;
    use pipeweave_core::{max_peak, simulate, Plan, StageCosts};

    /// The plan `expression` builds at `ranks` x `microbatches`, unit costs.
    fn build(expression: &str, ranks: u32, microbatches: u32) -> Result<Plan, TransformError> {
        built(expression, ranks, microbatches, StageCosts::default())
    }

    fn grid(plan: &Plan) -> Vec<String> {
        let sim = simulate(plan).unwrap();
        pipeweave_core::render_grid(plan, &sim)
            .lines()
            .map(|l| l.trim_end().to_string())
            .collect()
    }

    #[test]
    fn recomputes_fit_the_limit_and_fill_the_wait_for_the_gradient() {
        let plan = build("recompute(f1b(gpipe), memory=1)", 2, 3).unwrap();
        assert_eq!(
            grid(&plan),
            [
                "rank  0 | F0 F1 R0 .  B0 ~  F2 R1 B1 ~  R2 B2 ~",
                "rank  1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  .  .  .",
            ]
        );
        assert_eq!(plan.memory_limit(), Some(1.0));
        assert!(plan.facts().residency.recomputed);
        let plan = build("recompute(f1b(gpipe), memory=2)", 4, 8).unwrap();
        assert!(max_peak(&plan) <= 2.0);
        assert_eq!(plan.passes().last().unwrap(), "recompute");
    }

    #[test]
    fn what_delayed_weight_gradients_keep_is_recomputed_for_them() {
        // ZB-H1 keeps each pair from its F to its W; at 2 ranks x 4 microbatches and one unit,
        // the last rank drops pairs after their I and builds them again (RW: forward and I)
        // for the W.
        let plan = build(
            "recompute(zero_bubble(f1b(gpipe), policy=h1), memory=1)",
            2,
            4,
        )
        .unwrap();
        let rows = grid(&plan);
        assert!(rows.iter().any(|r| r.contains("RW")), "{rows:#?}");
        assert!(max_peak(&plan) <= 1.0 + 1e-9, "{rows:#?}");
        assert!(plan.facts().residency.recomputed);
        for task in plan.orders().iter().flatten() {
            assert_eq!(
                task.to_string().parse::<pipeweave_core::Task>().unwrap(),
                *task
            );
        }
        // The issue's case: ZB-H1 at 8 x 32 fitted to 3 units, which offload cannot reach.
        let plan = build(
            "recompute(zero_bubble(f1b(gpipe), policy=h1), memory=3)",
            8,
            32,
        )
        .unwrap();
        assert!(max_peak(&plan) <= 3.0 + 1e-9);
        assert_eq!(simulate(&plan).unwrap().makespan(), 193.0);
    }

    #[test]
    fn a_plan_that_fits_is_left_as_it_is() {
        let plain = build("f1b(gpipe)", 4, 8).unwrap();
        let fitted = build("recompute(f1b(gpipe), memory=4)", 4, 8).unwrap();
        assert_eq!(fitted.orders(), plain.orders());
        assert!(!fitted.manages_residency());
    }

    #[test]
    fn bad_limits_and_places_are_typed_errors() {
        let cases: [(&str, &[&str]); 5] = [
            ("recompute(f1b(gpipe))", &["give memory=N"]),
            (
                "recompute(f1b(gpipe), memory=0)",
                &["memory=0 is not a positive number"],
            ),
            // A running forward holds its own activations: no plan gets below one microbatch,
            // split backwards included (what their Ws keep is recomputed for them).
            (
                "recompute(zero_bubble(f1b(gpipe), policy=h1), memory=0.5)",
                &[
                    "precondition `memory=0.5 reachable with pairs recomputed`",
                    "while it runs 0F0",
                    "this plan still needs 1.0000",
                ],
            ),
            (
                "zero_bubble(recompute(f1b(gpipe), memory=2))",
                &["needs activations kept"],
            ),
            (
                "recompute(recompute(f1b(gpipe), memory=3), memory=2)",
                &["cannot run after `recompute`"],
            ),
        ];
        for (expression, needs) in cases {
            // 4 ranks for the ZB-H1 case; the others fail at every size.
            let err = build(expression, 4, 8).unwrap_err().to_string();
            for need in needs {
                assert!(err.contains(need), "{expression}: {err}");
            }
        }
    }
}
