//! Against PyTorch's `ScheduleInterleaved1F1B` (orders written by `tools/pytorch_orders.py` with
//! torch 2.15 into `tests/fixtures/pytorch/`): where PyTorch runs an interleaved schedule, ours at
//! the same sizes and costs is verified and no slower, including the sizes Megatron refuses.

mod common;

use common::{field, json_files};
use pipeweave::core_ir::TOLERANCE;
use pipeweave::{
    build_plan, simulate, verify, PipelineConfig, Plan, ProblemSpec, StageCosts, Task,
};
use serde_json::Value;
use std::path::Path;

fn fixtures() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch");
    let out = json_files(&dir, "");
    assert!(out.len() >= 7, "the PyTorch fixtures are missing");
    out
}

/// PyTorch's order as a plan on the standard interleaved placement, unit costs of a rank's share.
fn pytorch_plan(file: &Value) -> Plan {
    let (p, m, v) = (
        field(file, "ranks"),
        field(file, "microbatches"),
        field(file, "chunks"),
    );
    let problem = ProblemSpec::builder()
        .ranks(p)
        .microbatches(m)
        .stage_to_rank((0..p * v).map(|s| s % p).collect())
        .build()
        .validate()
        .unwrap();
    let orders: Vec<Vec<Task>> = file["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().parse().unwrap())
                .collect()
        })
        .collect();
    Plan::from_rank_shares(problem, StageCosts::default(), 0.0, orders).unwrap()
}

#[test]
fn our_interleaving_is_no_slower_than_pytorchs_where_pytorch_runs() {
    for (name, file) in fixtures() {
        let theirs = pytorch_plan(&file);
        verify(&theirs).unwrap_or_else(|e| panic!("{name}: PyTorch's order: {e}"));
        let theirs = simulate(&theirs).unwrap().makespan();
        let (p, m) = (field(&file, "ranks"), field(&file, "microbatches"));
        let ours = build_plan(
            "vpp(f1b(gpipe), chunks=2)",
            &PipelineConfig::new(p, m).unwrap(),
        )
        .unwrap();
        let ours = simulate(&ours).unwrap().makespan();
        assert!(
            ours <= theirs + TOLERANCE,
            "{name}: ours {ours}, PyTorch's {theirs}"
        );
    }
}
