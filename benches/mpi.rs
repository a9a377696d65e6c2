//! The MPI backend's figures (issue 9), against threads, measured in one run:
//!
//! - **Training throughput**: the model of `benches/train.rs` (4 blocks, width 192, 4 heads,
//!   64-byte sequences, 16 microbatches of 2 sequences) trained on one rank with one compute
//!   thread (`f1b(gpipe)` at P=1: one microbatch's activations at a time, as each pp2 rank holds
//!   few), against pp2 (`f1b(gpipe)`) as two MPI processes with one compute thread each
//!   (`mpirun -np 2` of this binary, which then acts as a rank), beside pp2 on two threads. Target:
//!   throughput ratio >= 1.7 (the 1F1B bubble at P=2, M=16 bounds it by 2M/(M+P-1) = 1.88 when
//!   an op runs as fast in a rank holding half the model as in one holding all of it; measured
//!   here, the halves run faster and the ratio can pass 1.88).
//! - **Sleep kernels**: `pipeweave run f1b(gpipe) -p 8 -m 32 --costs F=1,B=1 --time-scale 1`
//!   (every op sleeps 1 ms) on threads and under `mpirun -np 8`, [`SLEEP_RUNS`] runs each: the
//!   measured makespan over the simulated one (target <= 1.05 on both), and the measured makespan
//!   over the plan replayed with the times the sleeps actually took (`overhead`: what the
//!   interpreter and the transport cost, without the kernels' own lateness: a 1 ms sleep of 8
//!   ranks on 2 cores may end tens of microseconds late on a virtual machine).
//!
//! - **Predictions**: a profile from a threads run (pp2 `f1b(gpipe)`, 16 microbatches) predicts
//!   the pipeline step of MPI runs with other microbatch counts and cuts; each is measured
//!   (rank 0's span, median of the steps after a warm-up) beside the prediction.
//!
//! `cargo bench --features mpi --bench mpi` (needs Open MPI, see README). The ranks' role is
//! chosen by an environment variable that the driver passes through `mpirun`.

use pipeweave::{build_and_simulate, build_plan, PipelineConfig, Plan};
use pipeweave_backends::mpi::rsmpi;
use pipeweave_kernels::GptConfig;
use pipeweave_train::data::BatchShape;
use pipeweave_train::mpi::MpiCluster;
use pipeweave_train::{Corpus, TrainSettings, Trainer};
use std::process::Command;
use std::time::{Duration, Instant};

const STEPS: u64 = 4;
const MICROBATCHES: u32 = 16;
const SEQ_LEN: usize = 64;
const SEQUENCES: usize = 2;
/// Set (to anything) in the ranks started by the driver.
const RANK_ROLE: &str = "PIPEWEAVE_BENCH_MPI_RANK";
/// Set to `MICROBATCHES:CUT` (e.g. `16:1,3`) in the ranks of a prediction check.
const PREDICT_ROLE: &str = "PIPEWEAVE_BENCH_MPI_PREDICT";

fn config() -> GptConfig {
    GptConfig::new(4, 192, 4, SEQ_LEN).expect("the bench's model is valid")
}

fn settings() -> TrainSettings {
    settings_for(MICROBATCHES, None)
}

fn settings_for(microbatches: u32, cut: Option<Vec<usize>>) -> TrainSettings {
    let shape = BatchShape::new(SEQ_LEN, SEQUENCES, microbatches as usize).expect("valid shape");
    TrainSettings {
        eval_sequences: 1,
        receive_timeout: Duration::from_secs(120),
        layers_per_stage: cut,
        ..TrainSettings::new(config(), shape)
    }
}

fn plan(expression: &str, ranks: u32) -> Plan {
    build_plan(
        expression,
        &PipelineConfig::new(ranks, MICROBATCHES).expect("sizes"),
    )
    .expect("the bench's plans build")
}

/// Seconds per step after one warm-up step.
fn seconds_per_step(trainer: &mut Trainer) -> f64 {
    trainer.step().expect("warm-up step");
    let start = Instant::now();
    for _ in 0..STEPS {
        trainer.step().expect("step");
    }
    start.elapsed().as_secs_f64() / STEPS as f64
}

/// A rank of the pp2 job: trains, and rank 0 prints its seconds per step.
fn rank() {
    let universe = rsmpi::initialize().expect("MPI initialises under mpirun");
    let world = universe.world();
    let corpus = Corpus::default_sources().expect("the checkout's sources");
    let plan = plan("f1b(gpipe)", 2);
    let settings = settings();
    let cluster = MpiCluster::new(
        &world,
        &plan,
        &settings.config,
        (1, 1),
        settings.deterministic,
        settings.receive_timeout,
    )
    .expect("the cluster starts");
    let writer = cluster.world_rank() == 0;
    let mut trainer =
        Trainer::on_cluster(&plan, &corpus, settings, Box::new(cluster)).expect("trainer");
    let seconds = seconds_per_step(&mut trainer);
    if writer {
        println!("{seconds}");
    }
}

/// A rank of a prediction check (`PREDICT_ROLE`): `f1b(gpipe)` on 2 processes with the given
/// microbatches and cut; rank 0 prints the median of its measured pipeline spans (first op
/// start to last op end: rank 0 runs the first forward and the last backward of 1F1B).
fn rank_predict(what: &str) {
    let (microbatches, cut) = what.split_once(':').expect("MICROBATCHES:CUT");
    let microbatches: u32 = microbatches.parse().expect("a microbatch count");
    let cut: Vec<usize> = cut
        .split(',')
        .map(|c| c.parse().expect("a block count"))
        .collect();
    let universe = rsmpi::initialize().expect("MPI initialises under mpirun");
    let world = universe.world();
    let corpus = Corpus::default_sources().expect("the checkout's sources");
    let plan = build_plan(
        "f1b(gpipe)",
        &PipelineConfig::new(2, microbatches).expect("sizes"),
    )
    .expect("f1b builds");
    let settings = settings_for(microbatches, Some(cut));
    let cluster = MpiCluster::new(
        &world,
        &plan,
        &settings.config,
        (1, 1),
        false,
        settings.receive_timeout,
    )
    .expect("the cluster starts");
    let writer = cluster.world_rank() == 0;
    let mut trainer =
        Trainer::on_cluster(&plan, &corpus, settings, Box::new(cluster)).expect("trainer");
    let mut spans = Vec::new();
    for i in 0..2 + STEPS {
        trainer.step().expect("a step");
        if i >= 2 {
            let ops = trainer.last_measured().iter().flatten();
            let start = ops.clone().map(|op| op.start).fold(f64::INFINITY, f64::min);
            let end = ops.map(|op| op.end).fold(f64::NEG_INFINITY, f64::max);
            spans.push(end - start);
        }
    }
    if writer {
        println!("{}", median(spans));
    }
}

/// A profile from a threads run (pp2 `f1b(gpipe)`, 16 microbatches, even cut), its predictions
/// of MPI runs with other microbatch counts and cuts, and those runs measured.
fn report_predictions(corpus: &Corpus) {
    let two_plan = plan("f1b(gpipe)", 2);
    let mut trainer = Trainer::new(&two_plan, corpus, settings()).expect("trainer");
    // Two warm-up steps, then the steps the calibration takes its medians from.
    for _ in 0..2 + pipeweave_train::CALIBRATION_STEPS {
        trainer.step().expect("a step");
    }
    let profile = trainer.profile(5).expect("the profile");
    println!("predictions of MPI runs from a threads run's profile (f1b(gpipe), 2 processes):");
    let mut errors = Vec::new();
    for (microbatches, cut) in [(16u32, "2,2"), (16, "1,3"), (8, "3,1"), (32, "2,2")] {
        let layers: Vec<usize> = cut
            .split(',')
            .map(|c| c.parse().expect("a count"))
            .collect();
        let (config, _) = PipelineConfig::new(2, microbatches)
            .expect("sizes")
            .with_profile(&profile, Some(&layers))
            .expect("the profile costs the cut");
        let (_, simulation) = build_and_simulate("f1b(gpipe)", &config).expect("the plan builds");
        let predicted = simulation.makespan();
        let mut job = mpirun(2);
        job.args(["-x", PREDICT_ROLE, "-x", "RAYON_NUM_THREADS"])
            .env(PREDICT_ROLE, format!("{microbatches}:{cut}"))
            .arg(std::env::current_exe().expect("this bench's path"));
        let measured: f64 = stdout_of(job)
            .trim()
            .parse()
            .expect("rank 0 prints its pipeline span");
        let error = (predicted - measured) / measured;
        errors.push(error.abs());
        println!(
            "  M {microbatches:>2}, cut {cut}: predicted {predicted:.4} s, measured {measured:.4} s ({:+.1}%)",
            100.0 * error
        );
    }
    println!(
        "  median |error| {:.1}%, largest {:.1}%",
        100.0 * median(errors.clone()),
        100.0 * errors.iter().copied().fold(0.0, f64::max)
    );
}

fn mpirun(np: usize) -> Command {
    let mut command = Command::new("mpirun");
    command
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(np.to_string())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    command
}

fn stdout_of(mut command: Command) -> String {
    let out = command
        .output()
        .expect("the command runs (is Open MPI installed?)");
    assert!(
        out.status.success(),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs of each sleep-kernel measurement.
const SLEEP_RUNS: usize = 9;

/// Measured over simulated makespan of the 1 ms sleep kernels, on `mpi` or threads, and measured
/// over the makespan replayed with the kernels' measured times.
fn sleep_ratio(mpi: bool) -> (f64, f64) {
    let args = [
        "run",
        "f1b(gpipe)",
        "-p",
        "8",
        "-m",
        "32",
        "--costs",
        "F=1,B=1",
        "--time-scale",
        "1",
        "--json",
    ];
    let bin = env!("CARGO_BIN_EXE_pipeweave");
    let command = if mpi {
        let mut c = mpirun(8);
        c.arg(bin).args(args).args(["--backend", "mpi"]);
        c
    } else {
        let mut c = Command::new(bin);
        c.args(args);
        c
    };
    let report: serde_json::Value =
        serde_json::from_str(&stdout_of(command)).expect("a JSON report");
    let measured = report["measured_seconds"]
        .as_f64()
        .expect("measured_seconds");
    let simulated = report["simulated_seconds"]
        .as_f64()
        .expect("simulated_seconds");
    let overhead = report["overhead"].as_f64().expect("overhead");
    (measured / simulated, overhead)
}

/// The median of `values` (not empty).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Prints the sleep-kernel figures of `SLEEP_RUNS` runs on a backend.
fn report_sleep(name: &str, mpi: bool) {
    let runs: Vec<(f64, f64)> = (0..SLEEP_RUNS).map(|_| sleep_ratio(mpi)).collect();
    let list = |pick: fn(&(f64, f64)) -> f64| {
        runs.iter()
            .map(|run| format!("{:.3}", pick(run)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "  {name}: measured / simulated median {:.3} ({}), overhead median {:.3} ({})",
        median(runs.iter().map(|r| r.0).collect()),
        list(|r| r.0),
        median(runs.iter().map(|r| r.1).collect()),
        list(|r| r.1),
    );
}

fn main() {
    pipeweave_train::allocator::keep_freed_memory();
    // candle's matrix products take their thread count from this variable: one per rank.
    std::env::set_var("RAYON_NUM_THREADS", "1");
    if std::env::var_os(RANK_ROLE).is_some() {
        rank();
        return;
    }
    if let Ok(what) = std::env::var(PREDICT_ROLE) {
        rank_predict(&what);
        return;
    }
    let corpus = Corpus::default_sources().expect("the checkout's sources");
    let one_plan = plan("f1b(gpipe)", 1);
    let mut one = Trainer::new(&one_plan, &corpus, settings()).expect("trainer");
    let single = seconds_per_step(&mut one);
    let two_plan = plan("f1b(gpipe)", 2);
    let mut two = Trainer::new(&two_plan, &corpus, settings()).expect("trainer");
    let threads_pp2 = seconds_per_step(&mut two);
    let mut job = mpirun(2);
    job.args(["-x", RANK_ROLE, "-x", "RAYON_NUM_THREADS"])
        .env(RANK_ROLE, "1")
        .arg(std::env::current_exe().expect("this bench's path"));
    let pp2: f64 = stdout_of(job)
        .trim()
        .parse()
        .expect("rank 0 prints its seconds per step");
    println!(
        "model: 4 blocks, width 192, 16 microbatches of 2 x 64 bytes; one compute thread per rank"
    );
    println!("one rank (threads backend): {single:.3} s/step");
    println!("pp2 (1F1B) as two threads: {threads_pp2:.3} s/step");
    println!("pp2 (1F1B) as two MPI processes: {pp2:.3} s/step");
    println!(
        "throughput ratio pp2 over MPI / one rank: {:.2} (target >= 1.7; the bubble alone allows \
         1.88 at equal per-op speed)",
        single / pp2
    );
    println!(
        "throughput ratio pp2 on threads / one rank: {:.2} (the same schedule in one process)",
        single / threads_pp2
    );
    println!(
        "1 ms sleep kernels, f1b(gpipe) at pp8 m32, {SLEEP_RUNS} runs each \
         (target: measured / simulated <= 1.05):"
    );
    report_sleep("threads", false);
    report_sleep("MPI", true);
    report_predictions(&corpus);
}
