//! Test fixtures shared by every crate of the workspace: small plans with unit costs and default
//! memory, written from sizes or from per-rank orders in action notation.
//!
//! Compiled only for this crate's own unit tests and with the cargo feature `testing`, which the
//! other crates enable from their dev-dependencies
//! (`pipeweave-core = { workspace = true, features = ["testing"] }`); a normal build does not
//! contain it. The fixtures panic instead of returning errors: each `expect` names the reason it
//! cannot fail, or the caller's side of the bargain (sizes within the problem limits, orders naming
//! tasks of the problem) when it depends on the arguments.

use crate::ir::cost::{CostModel, StageCosts};
use crate::ir::memory::MemoryModel;
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use crate::ir::problem::{Problem, ProblemSpec};

/// The problem of `ranks` x `microbatches` on the plain layout (stage `r` on rank `r`).
///
/// # Panics
/// If a size is 0 or above the problem limits.
pub fn problem(ranks: u32, microbatches: u32) -> Problem {
    ProblemSpec::builder()
        .ranks(ranks)
        .microbatches(microbatches)
        .build()
        .validate()
        .expect("fixture sizes are positive and within the problem limits")
}

/// The unscheduled plan of `problem` (any layout), every stage of `costs`, no latency, default
/// memory.
pub fn unscheduled_on(problem: Problem, costs: StageCosts) -> Plan {
    let stages = problem.stages();
    Plan::unscheduled(
        problem,
        CostModel::uniform(stages, costs, 0.0).expect("a zero latency is a valid latency"),
        MemoryModel::uniform(stages, Default::default()),
    )
    .expect("the cost and memory models have one entry per stage of the problem")
}

/// The unscheduled plan of `ranks` x `microbatches` on the plain layout, every stage of
/// `costs`, no latency, default memory.
///
/// # Panics
/// As [`problem`].
pub fn unscheduled(ranks: u32, microbatches: u32, costs: StageCosts) -> Plan {
    unscheduled_on(problem(ranks, microbatches), costs)
}

/// The unscheduled unit-cost plan of `ranks` x `microbatches` on the plain layout
/// ([`StageCosts::default`], no latency, default memory): what a pass list starts from.
///
/// # Panics
/// As [`problem`].
pub fn unit_plan(ranks: u32, microbatches: u32) -> Plan {
    unscheduled(ranks, microbatches, StageCosts::default())
}

/// A unit-cost plan of the plain layout (stage `r` on rank `r`) with default memory, whose rank
/// `r` runs `orders[r]` (actions separated by spaces, see [`tasks`]); its facts are read off the
/// orders.
///
/// # Panics
/// As [`problem`] (no orders, or too many), if an action does not parse, or if the orders name a rank, stage or microbatch outside the
/// problem.
pub fn plan(microbatches: u32, orders: &[&str]) -> Plan {
    let ranks = u32::try_from(orders.len()).expect("fixtures have few ranks");
    Plan::new(
        problem(ranks, microbatches),
        CostModel::uniform(ranks, StageCosts::default(), 0.0)
            .expect("a zero latency is a valid latency"),
        MemoryModel::uniform(ranks, Default::default()),
        orders.iter().map(|o| tasks(o)).collect(),
    )
    .expect("fixture orders name only tasks of the fixture's ranks, stages and microbatches")
}

/// Tasks written in action notation (`0F1`, `1B0`, `0OFFLOAD2`, ...), separated by spaces.
///
/// # Panics
/// If an action does not parse.
pub fn tasks(text: &str) -> Vec<Task> {
    text.split_whitespace()
        .map(|t| {
            t.parse()
                .unwrap_or_else(|e| panic!("fixture action `{t}` is not action notation: {e}"))
        })
        .collect()
}
