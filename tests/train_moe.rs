//! `pipeweave train --experts E --top-k K --expert-parallel X` (TRAIN.md): a GPT whose blocks'
//! MLPs are routed mixtures of experts trains through every schedule, with `--deterministic`
//! bit-identical across schedules, pipeline ranks, data-parallel replicas and expert ranks
//! (`X > 1` gives the bits of `X = 1`; DualPipe's pairs overlapped or in turn); it really routes
//! (its losses are not the dense model's) and learns; its checkpoints resume at another `X`; bad
//! sizes are refused in one line. Under MPI (cargo feature `mpi`, with `train_gpt` built with it
//! as .ci/mpi does), a mixture logs the threads' losses of one rank bit for bit with one expert
//! rank per pipeline rank and with `X = 2` (a process per expert rank: 1F1B, ZB-V, DualPipe,
//! DualPipeV and a recompute plan, each at P = 2 and 4), its checkpoint (written once, weights
//! and moments) resumes on threads, and a world that is not `D x P x X` processes is refused in
//! one line.

mod common;
#[cfg(feature = "mpi")]
#[allow(dead_code)]
#[path = "common/mpi_jobs.rs"]
mod mpi_jobs;

use common::cli::{cli, scratch_dir, Cli};
use common::train::{logged_losses, TINY_MODEL};

/// The schedules of the issue: 1F1B, ZB-V, DualPipe and DualPipeV.
const SCHEDULES: &[&str] = &[
    "f1b(gpipe)",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
    "zero_bubble(dual(f1b(gpipe)))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
];

/// The logged losses of `pipeweave train` on [`TINY_MODEL`] with the options of `line` (the run must
/// exit 0).
fn losses(name: &str, line: &str) -> Vec<f64> {
    let dir = scratch_dir(&format!("train-moe-{name}"));
    let log = dir.join("log.jsonl");
    train().line(line).arg("--log").arg(&log).ok();
    let losses = logged_losses(&log);
    let _ = std::fs::remove_dir_all(&dir);
    losses
}

/// `pipeweave train` on [`TINY_MODEL`].
fn train() -> Cli {
    cli("train").args(TINY_MODEL)
}

/// Three steps of 4 experts, top-2, `x` expert ranks, on `p` ranks through `schedule` with `m`
/// microbatches.
fn moe(schedule: &str, p: u32, x: u32, m: u32) -> String {
    format!(
        "--schedule {schedule} --ranks {p} --microbatches {m} --experts 4 --top-k 2 \
         --expert-parallel {x} --steps 3"
    )
}

#[test]
fn moe_losses_are_bit_identical_across_schedules_ranks_and_expert_ranks() {
    let reference = losses("reference", &moe(SCHEDULES[0], 1, 1, 4));
    assert_eq!(reference.len(), 3);
    assert!(reference.iter().all(|l| l.is_finite()), "{reference:?}");
    let mut cases: Vec<String> = Vec::new();
    for schedule in SCHEDULES {
        for x in [1, 2] {
            cases.push(moe(schedule, 2, x, 4));
        }
    }
    for schedule in [SCHEDULES[0], SCHEDULES[3]] {
        cases.push(moe(schedule, 4, 2, 4));
    }
    // Recomputation as the plan says, and of every stage; data parallelism beside the experts.
    let recompute = "recompute(zero_bubble(dual(vpp(f1b(gpipe), chunks=2))), memory=3)";
    cases.push(moe(recompute, 2, 2, 4));
    cases.push(moe(recompute, 2, 4, 4));
    cases.push(moe(SCHEDULES[1], 2, 2, 4) + " --recompute");
    cases.push(moe(SCHEDULES[0], 2, 2, 2) + " --dp 2");
    // The pairs' halves in turn rather than overlapped (the overlap's baseline).
    cases.push(moe(SCHEDULES[3], 2, 2, 4) + " --sequential-pairs");
    // An emulated interconnect changes when the exchanges end, not what they carry.
    cases.push(moe(SCHEDULES[3], 2, 2, 4) + " --exchange-latency 0.001");
    for (i, case) in cases.iter().enumerate() {
        let ours = losses(&format!("case-{i}"), case);
        assert_eq!(ours, reference, "{case} against one rank's MoE run");
    }
}

#[test]
fn an_moe_run_routes_learns_and_adds_its_balancing_loss() {
    let steps = "--steps 6 --lr 1e-2 --microbatches 4";
    let dense = losses("dense", steps);
    let moe = format!("{steps} --experts 4 --top-k 2 --expert-parallel 2");
    let routed = losses("moe", &moe);
    assert_ne!(routed, dense, "an MoE model is not the dense one");
    assert!(routed.iter().all(|l| l.is_finite()), "{routed:?}");
    assert!(
        routed[5] < routed[0] - 0.1,
        "the loss decreases: {routed:?}"
    );
    // The logged loss is the LM loss: the first step's does not see the balancing loss, the
    // next ones train with its gradient.
    let unbalanced = losses("unbalanced", &format!("{moe} --aux-coefficient 0"));
    assert_eq!(unbalanced[0], routed[0]);
    let later = (&unbalanced[1..], &routed[1..]);
    assert_ne!(later.0, later.1, "the balancing loss's gradient flows");
}

#[test]
fn a_checkpoint_of_an_expert_parallel_run_resumes_on_one_expert_rank() {
    let dir = scratch_dir("train-moe-resume");
    let checkpoint = dir.join("moe.safetensors");
    let parallel = moe(SCHEDULES[0], 2, 2, 4);
    let whole = losses("uninterrupted", &parallel);
    let first = dir.join("first.jsonl");
    train()
        .line(&parallel)
        .line("--stop-after 2 --save")
        .arg(&checkpoint)
        .arg("--log")
        .arg(&first)
        .ok();
    let config = std::fs::read_to_string(dir.join("moe.safetensors.config.json")).unwrap();
    assert!(config.contains("\"n_experts\": 4"), "{config}");
    let rest = dir.join("rest.jsonl");
    train()
        .line(&moe(SCHEDULES[0], 2, 1, 4))
        .arg("--resume")
        .arg(&checkpoint)
        .arg("--log")
        .arg(&rest)
        .ok();
    let resumed: Vec<f64> = logged_losses(&first)
        .into_iter()
        .chain(logged_losses(&rest))
        .collect();
    // A dense run cannot resume it.
    let dense = train().line("--steps 3 --resume").arg(&checkpoint).output();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(resumed, whole);
    let refusal = String::from_utf8(dense.stderr).unwrap();
    assert_eq!(dense.status.code(), Some(2), "{refusal}");
    assert!(refusal.contains("n_experts"), "{refusal}");
}

#[test]
fn bad_mixture_options_are_one_line_and_exit_2() {
    let refused = |line: &str, expected: &str| train().line(line).refused(expected);
    refused("--experts 2 --top-k 3", "--top-k 3 is above --experts 2");
    refused(
        "--experts 4 --expert-parallel 3",
        "--expert-parallel 3 does not divide --experts 4",
    );
    refused("--top-k 2", "--top-k needs --experts");
    refused("--expert-parallel 2", "--expert-parallel needs --experts");
    refused("--aux-coefficient 0.1", "--aux-coefficient needs --experts");
    refused("--sequential-pairs", "--sequential-pairs needs --experts");
    refused(
        "--exchange-latency 0.1",
        "--exchange-latency needs --experts",
    );
    refused(
        "--experts 4 --expert-parallel 2 --exchange-latency=-1",
        "--exchange-latency -1: must be between 0 and 10 seconds",
    );
    refused("--experts 0", "--experts 0");
    refused("--experts 4 --top-k 0", "--top-k 0");
    refused("--experts 4 --expert-parallel 0", "--expert-parallel 0");
    refused("--experts 4 --aux-coefficient=-1", "--aux-coefficient -1");
}

/// `train_gpt` on [`TINY_MODEL`] with the options of `line`, on threads or, given `np`, as
/// `mpirun -np np ... --backend mpi`: its output and its logged losses.
#[cfg(feature = "mpi")]
fn train_gpt_run(name: &str, line: &str, np: Option<usize>) -> (std::process::Output, Vec<f64>) {
    let dir = scratch_dir(&format!("train-moe-mpi-{name}"));
    let log = dir.join("log.jsonl");
    let mut command = match np {
        Some(np) => {
            let mut mpirun = mpi_jobs::mpirun_command(np);
            mpirun
                .arg(common::train_gpt().get_program())
                .args(["--backend", "mpi"]);
            mpirun
        }
        None => common::train_gpt(),
    };
    let out = command
        .args(TINY_MODEL)
        .args(common::cli::words(line))
        .arg("--log")
        .arg(&log)
        .output()
        .unwrap();
    let losses = match out.status.success() {
        true => logged_losses(&log),
        false => Vec::new(),
    };
    let _ = std::fs::remove_dir_all(&dir);
    (out, losses)
}

/// [`train_gpt_run`]'s losses (the run must exit 0).
#[cfg(feature = "mpi")]
fn train_gpt_losses(name: &str, line: &str, np: Option<usize>) -> Vec<f64> {
    let (out, losses) = train_gpt_run(name, line, np);
    let err = common::cli::stderr(&out);
    assert!(out.status.success(), "{name} ({line}): {err}");
    losses
}

#[cfg(feature = "mpi")]
#[test]
fn under_mpi_a_mixture_logs_the_threads_losses_bit_for_bit() {
    let reference = train_gpt_losses("threads", &moe(SCHEDULES[0], 1, 1, 4), None);
    assert_eq!(reference.len(), 3);
    // (schedule, P, X): the matrix, every schedule and a recompute plan at P = 2 and 4,
    // one expert rank per process's pipeline rank and a process per expert rank (world P x X;
    // the exchange's two phases called at once by DualPipe's overlapped pairs).
    let recompute = "recompute(zero_bubble(dual(vpp(f1b(gpipe), chunks=2))), memory=3)";
    let mut cases: Vec<(&str, u32, u32)> = Vec::new();
    for schedule in SCHEDULES.iter().copied().chain([recompute]) {
        for (p, x) in [(2, 1), (2, 2), (4, 1), (4, 2)] {
            cases.push((schedule, p, x));
        }
    }
    for (i, &(schedule, p, x)) in cases.iter().enumerate() {
        let line = moe(schedule, p, x, 4);
        let np = (p * x) as usize;
        let mpi = train_gpt_losses(&format!("case-{i}"), &line, Some(np));
        assert_eq!(
            mpi, reference,
            "{line} on {np} MPI processes against one rank"
        );
    }
}

#[cfg(feature = "mpi")]
#[test]
fn under_mpi_an_expert_parallel_checkpoint_resumes_on_one_expert_rank_of_threads() {
    let dir = scratch_dir("train-moe-mpi-checkpoint");
    let checkpoint = dir.join("moe.safetensors").display().to_string();
    let whole = train_gpt_losses("whole", &moe(SCHEDULES[2], 2, 1, 4), None);
    let saved = format!(
        "{} --stop-after 2 --save {checkpoint}",
        moe(SCHEDULES[2], 2, 2, 4)
    );
    let head = train_gpt_losses("saved", &saved, Some(4));
    let resumed = format!("{} --resume {checkpoint}", moe(SCHEDULES[2], 2, 1, 4));
    let tail = train_gpt_losses("resumed", &resumed, None);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!([head, tail].concat(), whole);
}

#[cfg(feature = "mpi")]
#[test]
fn under_mpi_a_world_of_other_than_dp_x_ranks_x_expert_ranks_is_refused() {
    let (out, _) = train_gpt_run("world", &moe(SCHEDULES[0], 2, 2, 4), Some(2));
    let err = common::cli::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    // Each process prints the line; two processes' lines may interleave.
    let line = "invalid MPI processes = 2: the run needs ranks x dp x expert ranks = 2 x 1 x 2 = \
                4 processes (mpirun -np 4)";
    assert!(err.contains(line), "{err}");
}
