//! DualPipe's overlapped F&B pairs in training, measured (issue 46): the step of an MoE GPT with
//! expert parallelism whose pairs run overlapped (each all-to-all of one half waited for while
//! the other half computes, `train/src/stage/pair.rs`) against the same run with the halves in
//! turn (`--sequential-pairs`), on MPI processes (`mpirun -np P·X`, one per expert rank of each
//! pipeline rank) and on threads.
//!
//! Each round runs both, in alternating order, as `pipeweave train` processes (one compute
//! thread per rank); a run's step time is the median of its logged step seconds after the first
//! (warm-up) step. Printed: per round the two medians and their ratio, then the median ratio
//! (overlapped / in turn: below 1 is the overlap's gain). The runs' losses are checked equal
//! bit for bit (`--deterministic`), so both did the same work.
//!
//! Each backend is measured twice: as the exchanges come (on one machine they cost almost
//! nothing: shared memory, and the expert ranks run in step, so there is little to hide), and
//! with every exchange made to last [`LATENCY`] from its issue (`--exchange-latency`: an
//! emulated interconnect whose all-to-all takes that long, what the plan's `a2a` cost models).
//!
//! `cargo bench --features mpi --bench moe_pairs [-- ROUNDS]` (needs Open MPI, see README);
//! without the feature it measures threads only.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The run: DualPipeV, an MoE GPT of 4 experts (top 2) on 2 pipeline ranks x 2 expert ranks.
const SCHEDULE: &str = "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))";
const MODEL: &[&str] = &[
    "--ranks",
    "2",
    "--microbatches",
    "8",
    "--experts",
    "4",
    "--top-k",
    "2",
    "--expert-parallel",
    "2",
    "--layers",
    "4",
    "--d-model",
    "128",
    "--heads",
    "4",
    "--seq-len",
    "64",
    "--microbatch-size",
    "4",
    "--steps",
    "6",
    "--threads-per-rank",
    "1",
    "--deterministic",
];
const ROUNDS: usize = 5;
/// The emulated all-to-all's duration of the second measurement, in seconds.
const LATENCY: &str = "0.003";

/// One run's logged losses and step seconds.
struct Run {
    losses: Vec<f64>,
    seconds: Vec<f64>,
}

impl Run {
    /// The median step after the first.
    fn step(&self) -> f64 {
        median(self.seconds[1..].to_vec())
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A field of a log line (`"name":value`).
fn field(line: &str, name: &str) -> f64 {
    let key = format!("\"{name}\":");
    let at = line.find(&key).expect("the log line has the field") + key.len();
    let rest = &line[at..];
    let end = rest.find([',', '}']).expect("a JSON number ends");
    rest[..end].parse().expect("a number")
}

/// How a measurement runs: under `mpirun` or on threads, with an emulated exchange latency.
#[derive(Clone, Copy)]
struct Setup {
    mpi: bool,
    latency: Option<&'static str>,
}

/// Runs `pipeweave train` as `setup` says, its pairs in turn when `in_turn`.
fn run(binary: &Path, setup: Setup, in_turn: bool, log: &Path) -> Run {
    let mut command = match setup.mpi {
        true => {
            let mut c = Command::new("mpirun");
            c.args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
                .arg(binary)
                .args(["train", "--backend", "mpi"]);
            c
        }
        false => {
            let mut c = Command::new(binary);
            c.arg("train");
            c
        }
    };
    command
        .args(["--schedule", SCHEDULE])
        .args(MODEL)
        .arg("--log")
        .arg(log);
    if in_turn {
        command.arg("--sequential-pairs");
    }
    if let Some(latency) = setup.latency {
        command.args(["--exchange-latency", latency]);
    }
    let out = command.output().expect("pipeweave train starts");
    assert!(
        out.status.success(),
        "pipeweave train failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(log).expect("the run wrote its log");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("\"step\"")).collect();
    Run {
        losses: lines.iter().map(|l| field(l, "loss")).collect(),
        seconds: lines.iter().map(|l| field(l, "seconds")).collect(),
    }
}

/// Alternating rounds of both runs; prints the figures and returns the median ratio.
fn measure(binary: &Path, setup: Setup, rounds: usize, dir: &Path) -> f64 {
    let backend = if setup.mpi {
        "MPI (4 processes)"
    } else {
        "threads"
    };
    let exchanges = match setup.latency {
        Some(latency) => format!("each exchange lasting {latency} s"),
        None => "exchanges as they come".to_string(),
    };
    println!("{backend}: {SCHEDULE}, 2 ranks x 2 expert ranks, {exchanges}");
    let mut ratios = Vec::new();
    for round in 0..rounds {
        let log = |name: &str| dir.join(format!("{name}-{round}.jsonl"));
        let (overlapped, in_turn) = if round % 2 == 0 {
            let o = run(binary, setup, false, &log("overlapped"));
            (o, run(binary, setup, true, &log("in-turn")))
        } else {
            let t = run(binary, setup, true, &log("in-turn"));
            (run(binary, setup, false, &log("overlapped")), t)
        };
        assert_eq!(
            overlapped.losses, in_turn.losses,
            "the overlapped pairs compute the same numbers"
        );
        let ratio = overlapped.step() / in_turn.step();
        println!(
            "  round {round}: overlapped {:.4} s, in turn {:.4} s per step: ratio {ratio:.3}",
            overlapped.step(),
            in_turn.step()
        );
        ratios.push(ratio);
    }
    let ratio = median(ratios);
    println!("  median ratio (overlapped / in turn): {ratio:.3}");
    ratio
}

fn main() {
    let rounds = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(ROUNDS);
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_pipeweave"));
    let dir = std::env::temp_dir().join(format!("pipeweave-moe-pairs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let backends: &[bool] = if cfg!(feature = "mpi") {
        &[false, true]
    } else {
        &[false]
    };
    for &mpi in backends {
        for latency in [None, Some(LATENCY)] {
            measure(&binary, Setup { mpi, latency }, rounds, &dir);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
