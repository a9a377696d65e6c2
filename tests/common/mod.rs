//! Shared helpers of the integration tests: reading `../shared/reference` files and other JSON
//! fixtures, building configs from costs, the persisted proptest config, (in [`cli`]) running
//! the `pipeweave` binary, and (in [`train`]) a tiny training run's options and logged losses.
#![allow(dead_code)]

pub mod cli;
pub mod train;

use pipeweave::core_ir::TOLERANCE;
use pipeweave::{PipelineConfig, Plan, Simulation, StageCostsSpec, Task};
use proptest::test_runner::{Config as ProptestConfig, FileFailurePersistence};
use serde_json::Value;
use std::path::{Path, PathBuf};

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

/// Reads and parses a JSON file.
pub fn read_json(path: impl AsRef<Path>) -> Value {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Reads one reference file.
pub fn reference(name: &str) -> Value {
    read_json(reference_dir().join(name))
}

/// The JSON files of `dir` whose name starts with `prefix`, by name.
pub fn json_files(dir: &Path, prefix: &str) -> Vec<(String, Value)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix) && n.ends_with(".json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let v = read_json(dir.join(&n));
            (n, v)
        })
        .collect()
}

/// All reference files whose name starts with `prefix`.
pub fn references(prefix: &str) -> Vec<(String, Value)> {
    json_files(&reference_dir(), prefix)
}

/// A JSON array of numbers.
pub fn f64s(values: &Value) -> Vec<f64> {
    values
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// A JSON array of non-negative integers.
pub fn u64s(values: &Value) -> Vec<u64> {
    values
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

/// The largest of a JSON array of numbers (0 for none).
pub fn max_of(values: &Value) -> f64 {
    f64s(values).into_iter().fold(0.0, f64::max)
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
    let expected: Vec<u32> = u64s(&file["stage_to_rank"])
        .into_iter()
        .map(|r| r as u32)
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

/// F, I and W of a rank's share, the other durations their defaults.
pub fn split_costs(f: f64, i: f64, w: f64) -> StageCostsSpec {
    StageCostsSpec::builder()
        .forward(f)
        .input_grad(i)
        .weight_grad(w)
        .build()
}

/// `ranks` x `microbatches` with `costs` (validated here) and latency `comm`.
pub fn costed(ranks: u32, microbatches: u32, costs: StageCostsSpec, comm: f64) -> PipelineConfig {
    PipelineConfig::new(ranks, microbatches)
        .unwrap()
        .with_costs(costs.validate().unwrap(), comm)
        .unwrap()
}

/// `ranks` x `microbatches` with uniform costs F, I, W (and F&B when given), no latency.
pub fn uniform_config(
    ranks: u32,
    microbatches: u32,
    f: f64,
    i: f64,
    w: f64,
    fb: Option<f64>,
) -> PipelineConfig {
    let costs = StageCostsSpec::builder()
        .forward(f)
        .input_grad(i)
        .weight_grad(w)
        .overlapped_opt(fb)
        .build();
    costed(ranks, microbatches, costs, 0.0)
}

/// The highest peak of activations over the ranks of a simulation.
pub fn peak(sim: &Simulation) -> f64 {
    sim.ranks()
        .iter()
        .map(|r| r.peak_activations)
        .fold(0.0, f64::max)
}

/// Equal up to floating-point noise.
pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= TOLERANCE * (1.0 + a.abs().max(b.abs()))
}

/// Whether the deep property runs are asked for (`PIPEWEAVE_DEEP_TESTS=1`, which CI sets): the
/// quick runs of `cargo test --workspace` keep a newcomer's wait short, CI keeps the depth.
pub fn deep() -> bool {
    std::env::var_os("PIPEWEAVE_DEEP_TESTS").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `quick` cases, or `deep` ones where [`deep`] asks for them.
pub fn depth(quick: u32, deep: u32) -> u32 {
    if self::deep() {
        deep
    } else {
        quick
    }
}

/// `cases` random cases, failures kept in (and replayed from) `path`, e.g.
/// `"proptest-regressions/properties.txt"`.
pub fn persisted(cases: u32, path: &'static str) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(path))),
        ..ProptestConfig::default()
    }
}

/// The example trainer `train_gpt`, built beside the test binaries by `cargo test`.
pub fn train_gpt() -> std::process::Command {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pipeweave"));
    let path = bin
        .parent()
        .map(|dir| dir.join("examples").join("train_gpt"))
        .expect("the binary has a folder");
    assert!(path.exists(), "{} is missing", path.display());
    std::process::Command::new(path)
}
