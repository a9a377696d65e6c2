//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the fuzz harnesses on stable
//! Rust, so every input the fuzzers found interesting keeps passing without nightly or libFuzzer.
//! A missing or empty corpus folder fails the test: it must never pass vacuously.
//! To fuzz for new inputs, see `fuzz/README.md`.

#[path = "../fuzz/src/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;

/// Feeds every file of `fuzz/corpus/<target>/` to `run`; fails naming every input that panics.
fn replay(target: &str, run: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz")
        .join("corpus")
        .join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus folder {} is missing: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a readable corpus folder").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "corpus folder {} holds no inputs",
        dir.display()
    );
    let start = Instant::now();
    let mut failures = Vec::new();
    for path in &files {
        let data =
            std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        if catch_unwind(AssertUnwindSafe(|| run(&data))).is_err() {
            failures.push(path.display().to_string());
        }
    }
    println!(
        "{target}: replayed {} inputs in {:.2?}",
        files.len(),
        start.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{target}: {} of {} corpus inputs panic (messages above):\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn expression_corpus() {
    replay("expression", harness::run_expression);
}

#[test]
fn csv_import_corpus() {
    replay("csv_import", harness::run_csv_import);
}

#[test]
fn reference_json_corpus() {
    replay("reference_json", harness::run_reference_json);
}

#[test]
fn programs_checker_corpus() {
    replay("programs_checker", harness::run_programs_checker);
}
