//! Trains a GPT on bytes through any pipeweave schedule (contract: ../shared/TRAIN.md).
//!
//! `cargo run --release --example train_gpt -- --schedule 'zero_bubble(f1b(gpipe))' --ranks 2`
//!
//! The same trainer as `pipeweave train` (`pipeweave_train::command`, with the plans of
//! `pipeweave::cli::train_command`): every rank runs in its own thread over the checked per-rank
//! programs of the plan, or, with `--backend mpi` (cargo feature `mpi`), in its own process under
//! `mpirun -np RANKS·DP target/release/examples/train_gpt --backend mpi ...`; the model is cut
//! into the plan's stages; losses equal a single-rank run (bit for bit with `--deterministic`, on
//! either backend). Without `--data` it trains on the source files of this checkout. Under MPI,
//! world rank 0 prints, logs and writes the files; a failing rank reports and aborts the job.

use clap::Parser;
use pipeweave::cli::train_command::{run, TrainOptions};
use std::process::ExitCode;

/// Train a GPT on bytes through a pipeline schedule.
#[derive(Debug, Parser)]
#[command(name = "train_gpt")]
struct Args {
    #[command(flatten)]
    options: TrainOptions,
}

fn main() -> ExitCode {
    let args = Args::parse();
    ExitCode::from(run(&args.options, &mut std::io::stderr()))
}
