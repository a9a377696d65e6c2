//! `gpipe`: the baseline schedule (GPipe, Huang et al. 2019).
//!
//! Source: GPipe; PyTorch's `ScheduleGPipe`. Every rank runs all its forwards, then all its full
//! backwards (B), each in microbatch order; on a rank that holds several stages, forwards of one
//! microbatch go in route order and backwards in reverse route order.
//!
//! Preconditions: the plan is unscheduled (no pass has run, every order is empty).
//! May change: the per-rank orders only (placement, costs and memory stay).
//!
//! Before (unscheduled) and after, 2 ranks and 3 microbatches at unit costs:
//! ```text
//! rank 0 | F0 F1 F2 .  .  .  B0 ~  B1 ~  B2 ~
//! rank 1 | .  F0 F1 F2 B0 ~  B1 ~  B2 ~  .  .
//! ```

use crate::error::TransformError;
use crate::transform::{Position, Transform};
use pipeweave_core::{Plan, Task, Work};

/// The GPipe baseline pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct GPipe;

impl Transform for GPipe {
    fn name(&self) -> &'static str {
        "gpipe"
    }

    fn position(&self) -> Position {
        Position::Baseline
    }

    fn check(&self, plan: &Plan) -> Result<(), TransformError> {
        if !plan.passes().is_empty() || plan.task_count() != 0 {
            return Err(TransformError::precondition(
                "gpipe",
                "unscheduled plan",
                format!(
                    "the plan already has {} tasks from passes [{}]",
                    plan.task_count(),
                    plan.passes().join(", ")
                ),
            ));
        }
        Ok(())
    }

    fn apply(&self, plan: Plan) -> Result<Plan, TransformError> {
        let problem = plan.problem();
        let ranks = problem.ranks() as usize;
        let mut forwards: Vec<Vec<Task>> = vec![Vec::new(); ranks];
        let mut backwards: Vec<Vec<Task>> = vec![Vec::new(); ranks];
        for route in problem.routes() {
            for mb in route.first().get()..route.end().get() {
                for &stage in route.stages() {
                    let rank = problem
                        .rank_of(stage)
                        .expect("route stages are in range in a validated problem");
                    forwards[rank.index()].push(Task::Forward(Work::new(stage.get(), mb)));
                }
                for &stage in route.stages().iter().rev() {
                    let rank = problem
                        .rank_of(stage)
                        .expect("route stages are in range in a validated problem");
                    backwards[rank.index()].push(Task::Backward(Work::new(stage.get(), mb)));
                }
            }
        }
        let orders = forwards
            .into_iter()
            .zip(backwards)
            .map(|(mut f, b)| {
                f.extend(b);
                f
            })
            .collect();
        plan.with_orders(orders)
            .map_err(|e| TransformError::core("gpipe", e))
    }
}
