//! Fixtures of the unit tests: plans written as per-rank orders in action notation.

use crate::ir::cost::{CostModel, StageCosts};
use crate::ir::memory::MemoryModel;
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use crate::ir::problem::ProblemSpec;

/// A plan of the plain layout (stage `r` on rank `r`) with unit costs and default memory, whose
/// rank `r` runs `orders[r]` (actions separated by spaces); its facts are read off the orders.
pub fn plan(microbatches: u32, orders: &[&str]) -> Plan {
    let ranks = orders.len() as u32;
    let problem = ProblemSpec::builder()
        .ranks(ranks)
        .microbatches(microbatches)
        .build()
        .validate()
        .expect("fixture sizes are valid");
    let orders = orders.iter().map(|o| tasks(o)).collect();
    Plan::new(
        problem,
        CostModel::uniform(ranks, StageCosts::default(), 0.0).expect("unit costs are valid"),
        MemoryModel::uniform(ranks, Default::default()),
        orders,
    )
    .expect("fixture plans are consistent")
}

/// Tasks written in action notation, separated by spaces.
pub fn tasks(text: &str) -> Vec<Task> {
    text.split_whitespace()
        .map(|t| t.parse().expect("fixture actions parse"))
        .collect()
}
