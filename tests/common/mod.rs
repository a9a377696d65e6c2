//! Shared helpers of the integration tests: reading `../shared/reference` files.
#![allow(dead_code)]

use pipeweave::{Plan, Task};
use serde_json::Value;
use std::path::PathBuf;

/// The folder with the peers' reference schedules.
pub fn reference_dir() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for candidate in [
        root.join("../shared/reference"),
        root.join("shared/reference"),
    ] {
        if candidate.is_dir() {
            return candidate;
        }
    }
    panic!("../shared/reference is missing next to the checkout");
}

/// Reads one reference file.
pub fn reference(name: &str) -> Value {
    let path = reference_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// All reference files whose name starts with `prefix`.
pub fn references(prefix: &str) -> Vec<(String, Value)> {
    let mut names: Vec<String> = std::fs::read_dir(reference_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let v = reference(&n);
            (n, v)
        })
        .collect()
}

/// Expands tasks into atomic ops as text (`B` becomes `I` then `W`), the form in which two
/// orders are compared.
pub fn expand(tasks: impl IntoIterator<Item = Task>) -> Vec<String> {
    tasks
        .into_iter()
        .flat_map(|t| t.ops())
        .map(|op| op.to_string())
        .collect()
}

/// A reference file's orders, expanded.
pub fn reference_orders(file: &Value) -> Vec<Vec<String>> {
    file["order"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            expand(
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().parse::<Task>().unwrap()),
            )
        })
        .collect()
}

/// A plan's orders, expanded.
pub fn plan_orders(plan: &Plan) -> Vec<Vec<String>> {
    plan.orders()
        .iter()
        .map(|o| expand(o.iter().copied()))
        .collect()
}

/// Integer field of a reference file.
pub fn field(file: &Value, name: &str) -> u32 {
    file[name].as_u64().unwrap() as u32
}

/// Asserts that `plan` has the file's placement and, rank by rank, its order (a `B` equal to an
/// `I` directly followed by its `W`).
pub fn assert_same_order(name: &str, plan: &Plan, file: &Value) {
    let placement: Vec<u32> = plan
        .problem()
        .stage_to_rank()
        .iter()
        .map(|r| r.get())
        .collect();
    let expected: Vec<u32> = file["stage_to_rank"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(placement, expected, "{name}: placement");
    for (rank, (ours, theirs)) in plan_orders(plan)
        .iter()
        .zip(&reference_orders(file))
        .enumerate()
    {
        assert_eq!(ours, theirs, "{name}: rank {rank}");
    }
}

/// `ranks` x `microbatches` with uniform costs F, I, W (and F&B when given), no latency.
pub fn uniform_config(
    ranks: u32,
    microbatches: u32,
    f: f64,
    i: f64,
    w: f64,
    fb: Option<f64>,
) -> pipeweave::PipelineConfig {
    let builder = pipeweave::StageCostsSpec::builder()
        .forward(f)
        .input_grad(i)
        .weight_grad(w);
    let costs = match fb {
        Some(fb) => builder.overlapped(fb).build(),
        None => builder.build(),
    }
    .validate()
    .unwrap();
    pipeweave::PipelineConfig::new(ranks, microbatches)
        .unwrap()
        .with_costs(costs, 0.0)
        .unwrap()
}

/// Equal up to floating-point noise.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()))
}
