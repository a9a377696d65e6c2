//! Helpers shared by the train crate's integration tests.
#![allow(dead_code)]

use pipeweave_core::{CostModel, MemoryModel, Plan, ProblemSpec, StageCosts};
use pipeweave_transforms::compile_expression;

/// The verified plan of `expression` on `ranks` ranks and `microbatches` microbatches, unit costs.
pub fn plan(expression: &str, ranks: u32, microbatches: u32) -> Plan {
    let problem = ProblemSpec::builder()
        .ranks(ranks)
        .microbatches(microbatches)
        .build()
        .validate()
        .unwrap();
    let start = Plan::unscheduled(
        problem,
        CostModel::uniform(ranks, StageCosts::default(), 0.0).unwrap(),
        MemoryModel::uniform(ranks, Default::default()),
    )
    .unwrap();
    compile_expression(expression)
        .and_then(|passes| passes.run(start))
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
}
