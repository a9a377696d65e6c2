//! The trainer over MPI (cargo feature `mpi`; needs `mpirun` and the `train_gpt` example built
//! with the feature, see .ci/mpi): `mpirun -np 4 train_gpt --backend mpi --deterministic` logs the
//! threads' losses bit for bit for the full composition, ZB-V, DualPipe and sequence chunks
//! (Seq1F1B); two data-parallel
//! replicas of a two-rank pipeline log the losses of one rank on the whole batch, bit for bit, on
//! both backends; a failing, a stalled and a killed rank each end the job within 10 s of the
//! fault with a report naming the rank (for the stall: who waits on whom).
#![cfg(feature = "mpi")]

#[path = "common/mpi_jobs.rs"]
mod mpi_jobs;

use mpi_jobs::{kill_a_rank_and_expect_the_job_to_end, mpirun_command};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One `mpirun` at a time: the machine may have few cores.
static MPIRUN: Mutex<()> = Mutex::new(());

/// The example trainer, built beside this test's binaries (`cargo build --features mpi
/// --example train_gpt`, done by .ci/mpi).
fn trainer() -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pipeweave"));
    let path = bin
        .parent()
        .map(|dir| dir.join("examples").join("train_gpt"))
        .expect("the binary has a folder");
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --features mpi --example train_gpt` first (.ci/mpi does)",
        path.display()
    );
    path
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The small model and run every test trains.
const MODEL: [&str; 16] = [
    "--layers",
    "4",
    "--d-model",
    "32",
    "--heads",
    "2",
    "--seq-len",
    "16",
    "--microbatch-size",
    "2",
    "--threads-per-rank",
    "1",
    "--eval-every",
    "1000",
    "--seed",
    "7",
];

/// Runs the trainer (under `mpirun -np np` when `np` is given) and returns its output.
fn train(np: Option<usize>, args: &[&str]) -> Output {
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let mut command = match np {
        Some(np) => {
            let mut c = mpirun_command(np);
            c.arg(trainer()).args(["--backend", "mpi"]);
            c
        }
        None => Command::new(trainer()),
    };
    command.args(MODEL).args(args);
    command.output().expect("the trainer runs")
}

/// The losses a run logged, as bits.
fn logged_losses(np: Option<usize>, args: &[&str], name: &str) -> Vec<u64> {
    logged_run(np, args, name).0
}

/// The losses' bits a run logs, and its stderr.
fn logged_run(np: Option<usize>, args: &[&str], name: &str) -> (Vec<u64>, String) {
    let log = std::env::temp_dir().join(format!(
        "pipeweave-mpi-train-{name}-{}.jsonl",
        std::process::id()
    ));
    let log_arg = log.to_string_lossy().into_owned();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--log", &log_arg]);
    let out = train(np, &all);
    assert!(
        out.status.success(),
        "{name}: {:?}\n{}",
        out.status,
        text(&out.stderr)
    );
    let lines = std::fs::read_to_string(&log).expect("the log was written");
    let _ = std::fs::remove_file(&log);
    let losses = lines
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
            value["loss"].as_f64().expect("a loss").to_bits()
        })
        .collect();
    (losses, text(&out.stderr))
}

fn equal_on_both_backends(schedule: &str, ranks: &str, microbatches: &str) {
    let args = [
        "--schedule",
        schedule,
        "--ranks",
        ranks,
        "--microbatches",
        microbatches,
        "--steps",
        "3",
        "--deterministic",
    ];
    let threads = logged_losses(None, &args, "threads");
    let np: usize = ranks.parse().expect("a rank count");
    let mpi = logged_losses(Some(np), &args, "mpi");
    assert_eq!(threads.len(), 3);
    assert_eq!(mpi, threads, "{schedule}: MPI and threads differ");
}

#[test]
fn variable_length_microbatches_give_the_threads_losses_bit_for_bit() {
    // Blank-line-separated documents of different lengths: microbatches of different shapes
    // travel between processes (the wire's header carries them). Threads and MPI run per-step
    // plans with the data in other slots (every process prices the same lengths and agrees on
    // the programs), MPI also the one uniform plan; the bits agree.
    let data = std::env::temp_dir().join(format!("pipeweave-mpi-docs-{}.txt", std::process::id()));
    let text: Vec<String> = (0..200)
        .map(|i| "word ".repeat(1 + (i * 37) % 19))
        .collect();
    std::fs::write(&data, text.join("\n\n")).expect("a data file");
    let data_arg = data.to_string_lossy().into_owned();
    let args = [
        "--schedule",
        "zero_bubble(f1b(gpipe))",
        "--ranks",
        "2",
        "--microbatches",
        "8",
        "--steps",
        "3",
        "--deterministic",
        "--variable-length",
        "--data",
        &data_arg,
    ];
    let threads = logged_losses(None, &args, "variable-threads");
    let (mpi, stderr) = logged_run(Some(2), &args, "variable-mpi");
    let mut uniform_args = args.to_vec();
    uniform_args.push("--uniform-plan");
    let uniform = logged_losses(Some(2), &uniform_args, "variable-mpi-uniform");
    let _ = std::fs::remove_file(&data);
    assert_eq!(threads.len(), 3);
    assert_eq!(mpi, threads);
    assert_eq!(uniform, threads);
    // The MPI run planned its steps: some put the cheapest microbatches first.
    let planned = stderr
        .lines()
        .find(|l| l.starts_with("variable-length plans"))
        .unwrap_or_else(|| panic!("the run reports its per-step plans:\n{stderr}"));
    assert!(!planned.contains(": 0 of 3 steps"), "{planned}");
}

#[test]
fn the_full_composition_gives_the_threads_losses_bit_for_bit() {
    equal_on_both_backends("zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))", "4", "8");
}

#[test]
fn zero_bubble_v_gives_the_threads_losses_bit_for_bit() {
    equal_on_both_backends("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", "4", "8");
}

#[test]
fn sequence_chunks_give_the_threads_losses_bit_for_bit() {
    // Seq1F1B: the chunks of a sequence hand their keys and values on within a stage, and
    // only chunk-sized activations travel.
    equal_on_both_backends("seq_split(f1b(gpipe), chunks=4)", "2", "4");
    equal_on_both_backends(
        "seq_split(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), chunks=4)",
        "4",
        "8",
    );
}

#[test]
fn dualpipe_gives_the_threads_losses_bit_for_bit() {
    equal_on_both_backends("zero_bubble(dual(f1b(gpipe)))", "4", "8");
}

#[test]
fn recompute_and_offload_give_the_threads_losses_bit_for_bit() {
    equal_on_both_backends(
        "offload(recompute(zero_bubble(dual(vpp(f1b(gpipe), chunks=2))), memory=4), memory=3.5)",
        "4",
        "8",
    );
    // What late Ws keep, moved out between their I and W.
    equal_on_both_backends(
        "offload(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), memory=2)",
        "4",
        "8",
    );
    // What late Ws keep, recomputed for them (RW).
    equal_on_both_backends(
        "recompute(zero_bubble(f1b(gpipe), policy=h1), memory=2)",
        "4",
        "8",
    );
}

#[test]
fn two_replicas_of_two_ranks_equal_one_rank_on_the_whole_batch() {
    let one = [
        "--schedule",
        "f1b(gpipe)",
        "--ranks",
        "1",
        "--microbatches",
        "8",
        "--steps",
        "3",
        "--deterministic",
    ];
    let dp = [
        "--schedule",
        "f1b(gpipe)",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--dp",
        "2",
        "--steps",
        "3",
        "--deterministic",
    ];
    let single = logged_losses(None, &one, "one-rank");
    assert_eq!(logged_losses(None, &dp, "dp-threads"), single, "threads");
    assert_eq!(logged_losses(Some(4), &dp, "dp-mpi"), single, "MPI");
}

#[test]
fn a_checkpoint_saved_over_mpi_resumes_on_threads() {
    let dir = std::env::temp_dir().join(format!("pipeweave-mpi-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary folder");
    let ckpt = dir.join("run.safetensors").to_string_lossy().into_owned();
    let common = [
        "--schedule",
        "zero_bubble(dual(f1b(gpipe)))",
        "--ranks",
        "2",
        "--microbatches",
        "4",
        "--steps",
        "4",
        "--deterministic",
    ];
    let whole = logged_losses(None, &common, "whole");
    let mut first: Vec<&str> = common.to_vec();
    first.extend(["--stop-after", "2", "--save", &ckpt]);
    let head = logged_losses(Some(2), &first, "saved");
    let mut second: Vec<&str> = common.to_vec();
    second.extend(["--resume", &ckpt]);
    let tail = logged_losses(None, &second, "resumed");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!([head, tail].concat(), whole);
}

/// Runs the trainer on 4 processes with `fault` (`--fail R@S` or `--stall R@S`), which must fail
/// the job, and returns its standard error and how long it ran.
fn faulty(fault: &[&str]) -> (String, f64) {
    let mut args = vec![
        "--schedule",
        "f1b(gpipe)",
        "--ranks",
        "4",
        "--microbatches",
        "8",
        "--steps",
        "50",
        "--timeout",
        "3",
    ];
    args.extend_from_slice(fault);
    let start = Instant::now();
    let out = train(Some(4), &args);
    let seconds = start.elapsed().as_secs_f64();
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    (stderr, seconds)
}

#[test]
fn a_failing_rank_ends_the_job_naming_rank_step_and_instruction() {
    let (stderr, seconds) = faulty(&["--fail", "2@2"]);
    assert!(
        stderr.contains("error: step 2: rank 2, instruction ")
            && stderr.contains("the stage failed"),
        "{stderr}"
    );
    // The whole job (start, one step, the fault) ends within 10 s.
    assert!(seconds < 10.0, "{seconds} s");
}

#[test]
fn a_stalled_rank_ends_the_job_with_who_waits_on_whom() {
    let (stderr, seconds) = faulty(&["--stall", "3@2"]);
    assert!(
        stderr.contains("error: step 2: no progress within 3 s: "),
        "{stderr}"
    );
    assert!(
        stderr.contains("rank 2 waits at instruction ") && stderr.contains("from rank 3"),
        "{stderr}"
    );
    assert!(stderr.contains("rank 3 did not answer"), "{stderr}");
    // The stall sleeps 6 s; the whole job ends at the 3 s timeout plus the 1 s report window,
    // within 10 s.
    assert!(seconds < 10.0, "{seconds} s");
}

#[test]
fn a_rank_killed_from_outside_ends_the_job_within_ten_seconds() {
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let trainer = trainer();
    let mut job = mpirun_command(4)
        .arg(&trainer)
        .args(["--backend", "mpi"])
        .args(MODEL)
        .args(["--ranks", "4", "--microbatches", "8", "--steps", "100000"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mpirun runs");
    let pattern = format!("^{} --backend mpi", trainer.display());
    // Let the training run for a while, then kill one rank.
    kill_a_rank_and_expect_the_job_to_end(&mut job, &pattern, Duration::from_secs(3));
}
