//! Test fixtures shared by every crate of the workspace: small plans with unit costs and default
//! memory, written from sizes or from per-rank orders in action notation, and their few variants
//! (other stage costs, memory or layout, a latency, microbatch cost scales).
//!
//! Compiled only for this crate's own unit tests and with the cargo feature `testing`, which the
//! other crates enable from their dev-dependencies
//! (`pipeweave-core = { workspace = true, features = ["testing"] }`); a normal build does not
//! contain it. The fixtures panic instead of returning errors: each `expect` names the reason it
//! cannot fail, or the caller's side of the bargain (sizes within the problem limits, orders naming
//! tasks of the problem) when it depends on the arguments.

use crate::ir::cost::{CostModel, StageCosts, StageCostsSpec};
use crate::ir::memory::{MemoryModel, StageMemory};
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

/// The problem of `microbatches` microbatches whose stage `s` runs on rank `placement[s]` (as
/// many ranks as the placement names).
///
/// # Panics
/// If the placement leaves a rank without a stage or a size is out of the problem limits.
pub fn placed(microbatches: u32, placement: Vec<u32>) -> Problem {
    ProblemSpec::builder()
        .ranks(placement.iter().max().map_or(0, |r| r + 1))
        .microbatches(microbatches)
        .stage_to_rank(placement)
        .build()
        .validate()
        .expect("fixture placements name every rank and stay within the problem limits")
}

/// A stage's costs from its forward, input-gradient and weight-gradient durations; the others
/// derived from them ([`StageCostsSpec`]'s defaults: `B = I + W`, `FB = F + B`, `R` and offload
/// `= F`).
///
/// # Panics
/// If a duration is negative or not finite.
pub fn costs(forward: f64, input_grad: f64, weight_grad: f64) -> StageCosts {
    StageCostsSpec::builder()
        .forward(forward)
        .input_grad(input_grad)
        .weight_grad(weight_grad)
        .build()
        .validate()
        .expect("fixture durations are finite and >= 0")
}

/// The unscheduled plan of `problem` (any layout), every stage of `costs`, latency `comm`,
/// microbatch `m`'s costs scaled by `scales[m]` (empty: none), default memory.
fn priced(problem: Problem, costs: StageCosts, comm: f64, scales: Vec<f64>) -> Plan {
    let stages = problem.stages();
    let costs = CostModel::uniform(stages, costs, comm)
        .expect("fixture latencies are finite and >= 0")
        .with_microbatch_scales(scales)
        .expect("fixture microbatch scales are finite and > 0");
    Plan::unscheduled(
        problem,
        costs,
        MemoryModel::uniform(stages, Default::default()),
    )
    .expect("the cost and memory models have one entry per stage of the problem")
}

/// The unscheduled plan of `problem` (any layout), every stage of `costs`, no latency, default
/// memory.
pub fn unscheduled_on(problem: Problem, costs: StageCosts) -> Plan {
    priced(problem, costs, 0.0, Vec::new())
}

/// The unscheduled plan of `ranks` x `microbatches` on the plain layout, every stage of
/// `costs`, no latency, default memory.
///
/// # Panics
/// As [`problem`].
pub fn unscheduled(ranks: u32, microbatches: u32, costs: StageCosts) -> Plan {
    unscheduled_on(problem(ranks, microbatches), costs)
}

/// [`unscheduled`] with the latency `comm` on every edge between two ranks.
///
/// # Panics
/// As [`problem`], or if `comm` is negative or not finite.
pub fn unscheduled_with_latency(
    ranks: u32,
    microbatches: u32,
    costs: StageCosts,
    comm: f64,
) -> Plan {
    priced(problem(ranks, microbatches), costs, comm, Vec::new())
}

/// The unscheduled unit-cost plan of `ranks` x `microbatches` on the plain layout
/// ([`StageCosts::default`], no latency, default memory): what a pass list starts from.
///
/// # Panics
/// As [`problem`].
pub fn unit_plan(ranks: u32, microbatches: u32) -> Plan {
    unscheduled(ranks, microbatches, StageCosts::default())
}

/// [`unit_plan`] with microbatch `m`'s costs scaled by `scales[m]` (variable-length
/// microbatches; a microbatch beyond the list keeps the unit costs).
///
/// # Panics
/// As [`problem`], or if a scale is not finite and > 0.
pub fn unit_plan_scaled(ranks: u32, microbatches: u32, scales: Vec<f64>) -> Plan {
    priced(
        problem(ranks, microbatches),
        StageCosts::default(),
        0.0,
        scales,
    )
}

/// A unit-cost plan of the plain layout (stage `r` on rank `r`) with default memory, whose rank
/// `r` runs `orders[r]` (actions separated by spaces, see [`tasks`]); its facts are read off the
/// orders.
///
/// # Panics
/// As [`problem`] (no orders, or too many), or as [`plan_on`].
pub fn plan(microbatches: u32, orders: &[&str]) -> Plan {
    let ranks = u32::try_from(orders.len()).expect("fixtures have few ranks");
    plan_on(
        problem(ranks, microbatches),
        StageCosts::default(),
        StageMemory::default(),
        orders,
    )
}

/// A plan of `problem` (any layout), every stage of `costs` and `memory`, no latency, whose rank
/// `r` runs `orders[r]` (actions separated by spaces, see [`tasks`]); its facts are read off the
/// orders.
///
/// # Panics
/// If an action does not parse, if there is not one order per rank, or if the orders name a
/// rank, stage or microbatch outside the problem.
pub fn plan_on(problem: Problem, costs: StageCosts, memory: StageMemory, orders: &[&str]) -> Plan {
    let stages = problem.stages();
    Plan::new(
        problem,
        CostModel::uniform(stages, costs, 0.0).expect("a zero latency is a valid latency"),
        MemoryModel::uniform(stages, memory),
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
