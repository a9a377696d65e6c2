//! Helpers shared by the train crate's integration tests.
#![allow(dead_code)]

use pipeweave_core::testing::unit_plan_scaled;
use pipeweave_core::Plan;
use pipeweave_transforms::compile_expression;

/// The verified plan of `expression` on `ranks` ranks and `microbatches` microbatches, unit costs.
pub fn plan(expression: &str, ranks: u32, microbatches: u32) -> Plan {
    plan_scaled(expression, ranks, microbatches, Vec::new())
}

/// [`plan`] with microbatch `m`'s costs scaled by `scales[m]` (variable-length microbatches).
pub fn plan_scaled(expression: &str, ranks: u32, microbatches: u32, scales: Vec<f64>) -> Plan {
    let start = unit_plan_scaled(ranks, microbatches, scales);
    compile_expression(expression)
        .and_then(|passes| passes.run(start))
        .unwrap_or_else(|e| panic!("{expression}: {e}"))
}

/// Every schedule issue 8 names: gpipe, 1F1B, interleaving (2 and 3 chunks, standard and V),
/// zero bubble h1/h2/auto, ZB-V, DualPipe, DualPipeV and the full composition.
pub const SCHEDULES: &[&str] = &[
    "gpipe",
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=3, group=4)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe), policy=h2)",
    "zero_bubble(f1b(gpipe))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
    "zero_bubble(dual(f1b(gpipe)))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
];
