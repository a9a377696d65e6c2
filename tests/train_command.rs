//! `pipeweave train`: the trainer of TRAIN.md behind the CLI, the same code as
//! `examples/train_gpt.rs` (same options, same losses), and its refusals in one line.

mod common;

use common::cli::{cli, scratch_dir, stderr, words};
use common::train::{logged_losses, TINY_MODEL};
use common::train_gpt;

/// A tiny deterministic run of [`TINY_MODEL`]: two ranks, three steps.
const RUN: &str = "--schedule zero_bubble(f1b(gpipe)) --ranks 2 --microbatches 4 --steps 3";

#[test]
fn pipeweave_train_logs_the_losses_of_train_gpt() {
    let dir = scratch_dir("train-command");
    let (ours, example) = (dir.join("cli.jsonl"), dir.join("example.jsonl"));
    cli("train")
        .args(TINY_MODEL)
        .line(RUN)
        .arg("--log")
        .arg(&ours)
        .ok();
    let out = train_gpt()
        .args(TINY_MODEL)
        .args(words(RUN))
        .arg("--log")
        .arg(&example)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let (a, b) = (logged_losses(&ours), logged_losses(&example));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(a.len(), 3);
    assert!(a.iter().all(|l| l.is_finite()), "{a:?}");
    assert_eq!(a, b, "pipeweave train against train_gpt");
}

#[test]
fn pipeweave_train_has_help() {
    let help = cli("train --help").ok();
    for option in ["--schedule", "--dp", "--backend", "--resume", "--fail"] {
        assert!(help.contains(option), "{option}: {help}");
    }
}

#[test]
fn bad_train_options_are_one_line_and_exit_2() {
    cli("train --no-such-option").refused("--no-such-option");
    cli("train --ranks two").refused("--ranks");
    cli("train --backend nccl").refused("nccl");
    cli("train --dp 0").refused("--dp 0");
    cli("train --timeout=0").refused("--timeout 0");
    cli("train --eval text.txt").refused("--eval needs --resume");
}
