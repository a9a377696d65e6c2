//! Training runs in tests (`pipeweave train`, `train_gpt`): a tiny deterministic model on a fixed
//! text, and the losses a run logs.

use std::path::Path;

/// A tiny deterministic model on a fixed text (the checkout's ARCHITECTURE.md, not the default
/// corpus, which is the checkout the binary was built from): two blocks of width 32 with two
/// heads, sequences of 32 tokens, microbatches of 2 sequences, one thread per rank.
pub const TINY_MODEL: &[&str] = &[
    "--data",
    concat!(env!("CARGO_MANIFEST_DIR"), "/ARCHITECTURE.md"),
    "--layers",
    "2",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--seq-len",
    "32",
    "--microbatch-size",
    "2",
    "--deterministic",
    "--threads-per-rank",
    "1",
];

/// The losses of a `--log` file, one per step.
pub fn logged_losses(log: &Path) -> Vec<f64> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                .as_f64()
                .unwrap()
        })
        .collect()
}
