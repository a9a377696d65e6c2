//! `f1b`: one-forward-one-backward (PipeDream-Flush; Megatron-Core's
//! `forward_backward_pipelining_without_interleaving`).
//!
//! Rewrites each rank's GPipe order: rank `r` of `P` keeps `min(P - r - 1, M)` forwards as warm-up,
//! then alternates its next forward with its next backward, and ends with the remaining backwards.
//! Activations held on rank `r` peak at `min(P - r, M)` microbatches instead of GPipe's `M`.
//!
//! Preconditions: the input is the `gpipe` plan of the plain layout (one stage per rank, stage `s`
//! on rank `s`, one route through all stages).
//! May change: the per-rank orders only (each rank's forwards and backwards keep their own order).
//!
//! Before (`gpipe`) and after, 2 ranks and 3 microbatches at unit costs:
//! ```text
//! rank 0 | F0 F1 F2 .  .  .  B0 ~  B1 ~  B2 ~        rank 0 | F0 F1 .  .  B0 ~  F2 B1 ~  .  B2 ~
//! rank 1 | .  F0 F1 F2 B0 ~  B1 ~  B2 ~  .  .        rank 1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  .
//! ```

use crate::error::TransformError;
use crate::order::warmup_merge;
use crate::transform::{Position, Transform};
use pipeweave_core::{Plan, Task};

/// The 1F1B pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct OneForwardOneBackward;

impl Transform for OneForwardOneBackward {
    fn name(&self) -> &'static str {
        "f1b"
    }

    fn position(&self) -> Position {
        Position::OneForwardOneBackward
    }

    fn check(&self, plan: &Plan) -> Result<(), TransformError> {
        if plan.passes() != ["gpipe"] {
            return Err(TransformError::precondition(
                "f1b",
                "input is the gpipe baseline",
                format!("the plan came from passes [{}]", plan.passes().join(", ")),
            ));
        }
        if !plan.problem().is_linear() {
            return Err(TransformError::precondition(
                "f1b",
                "plain layout: one stage per rank, stage s on rank s, one route",
                format!(
                    "the problem has {} stages on {} ranks with {} route(s)",
                    plan.problem().stages(),
                    plan.problem().ranks(),
                    plan.problem().routes().len()
                ),
            ));
        }
        Ok(())
    }

    fn apply(&self, plan: Plan) -> Result<Plan, TransformError> {
        let ranks = plan.problem().ranks() as usize;
        let orders = plan
            .orders()
            .iter()
            .enumerate()
            .map(|(r, order)| {
                let (forwards, backwards): (Vec<Task>, Vec<Task>) =
                    order.iter().partition(|t| t.is_forward());
                warmup_merge(&forwards, &backwards, ranks - r - 1)
            })
            .collect();
        plan.with_orders(orders)
            .map_err(|e| TransformError::core("f1b", e))
    }
}
