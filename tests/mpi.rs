//! The MPI backend end to end (cargo feature `mpi`; needs `mpirun`, see .ci/mpi): `pipeweave run
//! --backend mpi` under `mpirun -np 4` gives the single-device gradients for the client's
//! schedules; a world of the wrong size is one line and exit 2; and, with this test binary itself
//! started under `mpirun` (the ignored test `mpi_child`, one scenario per run), 4 MiB payloads
//! cross in one group both ways (sends completed at the end), a wrong message or
//! element type is reported naming both, ranks given different programs stop before running, a
//! failing rank ends the whole job with a report naming the rank and the instruction, and a
//! stalled one with who waits on whom (each waiting rank's instruction and message).
#![cfg(feature = "mpi")]

mod common;
#[path = "common/mpi_jobs.rs"]
mod mpi_jobs;

use common::cli::words;
use mpi_jobs::{kill_a_rank_and_expect_the_job_to_end, mpirun_command};
use pipeweave::backends::mpi::rsmpi;
use pipeweave::backends::mpi::wire::{WireDType, WirePayload};
use pipeweave::backends::mpi::{run_mpi, MpiOptions, MpiTransport};
use pipeweave::backends::numeric::{AffineModel, AffineStage};
use pipeweave::backends::{Incoming, Outgoing, StageCompute, StageError, Transport};
use pipeweave::core_ir::{project, CheckedPrograms, Message, ProjectionOptions};
use pipeweave::{build_plan, MicrobatchId, PipelineConfig, RankId, StageId, Task, Work};
use rsmpi::topology::Communicator;
use std::process::Output;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One `mpirun` at a time: the machine may have few cores, and jobs would slow each other down.
static MPIRUN: Mutex<()> = Mutex::new(());

/// Runs `program` with the words of `line` on `np` processes under `mpirun` (killed after two
/// minutes).
fn mpirun(np: usize, program: &str, line: &str, env: &[(&str, &str)]) -> Output {
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    let mut command = mpirun_command(np);
    for (key, value) in env {
        command.arg("-x").arg(format!("{key}={value}"));
        command.env(key, value);
    }
    command.arg(program).args(words(line));
    command
        .output()
        .expect("mpirun runs (install Open MPI: .ci/mpi)")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `pipeweave run EXPR --backend mpi` on 4 processes: exit 0 and equal gradients.
fn gradients_are_equal(expression: &str) {
    let start = Instant::now();
    let line = format!("run {expression} -p 4 -m 8 --backend mpi --json");
    let out = mpirun(4, env!("CARGO_BIN_EXE_pipeweave"), &line, &[]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "{expression}: {:?}\n{stdout}\n{}",
        out.status,
        text(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{expression}: one JSON report from rank 0 ({e}): {stdout}"));
    assert_eq!(report["backend"], "mpi");
    assert_eq!(report["gradients_equal"], true, "{expression}: {stdout}");
    // Rank 0 replays the plan with every rank's measured task times: no faster run is possible
    // (up to the ranks' clock alignment by a barrier).
    let measured = report["measured_seconds"].as_f64().unwrap_or(0.0);
    let replayed = report["replayed_seconds"].as_f64().unwrap_or(-1.0);
    assert!(
        replayed >= 0.0 && replayed <= measured + 1e-3,
        "{expression}: {stdout}"
    );
    eprintln!("{expression}: {:.2} s", start.elapsed().as_secs_f64());
}

#[test]
fn one_f_one_b_gives_the_single_device_gradients() {
    gradients_are_equal("f1b(gpipe)");
}

#[test]
fn dualpipe_v_with_zero_bubble_gives_the_single_device_gradients() {
    gradients_are_equal("zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))");
}

#[test]
fn recompute_and_offload_give_the_single_device_gradients() {
    gradients_are_equal(
        "offload(recompute(zero_bubble(vpp(f1b(gpipe), chunks=2)), memory=4), memory=3.5)",
    );
    // What late Ws keep, moved out between their I and W.
    gradients_are_equal("offload(zero_bubble(f1b(gpipe), policy=h1), memory=2)");
    // What late Ws keep, recomputed for them (RW).
    gradients_are_equal("recompute(zero_bubble(f1b(gpipe), policy=h1), memory=2)");
}

#[test]
fn zero_bubble_v_gives_the_single_device_gradients() {
    gradients_are_equal("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))");
}

#[test]
fn a_world_of_another_size_is_one_line_and_exit_2() {
    let line = "run f1b(gpipe) -p 4 -m 8 --backend mpi";
    let out = mpirun(2, env!("CARGO_BIN_EXE_pipeweave"), line, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    let ours: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(
        ours,
        ["error: option --ranks: 4 ranks need mpirun -np 4, but this MPI job has 2 processes"],
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
}

/// Runs this test binary's `mpi_child` on 2 processes with `scenario`.
fn child(scenario: &str) -> (Output, f64) {
    let exe = std::env::current_exe().expect("the test binary knows its path");
    let exe = exe.to_str().expect("a UTF-8 path");
    let start = Instant::now();
    let out = mpirun(
        2,
        exe,
        "mpi_child --exact --ignored --nocapture --test-threads=1",
        &[("PIPEWEAVE_MPI_SCENARIO", scenario)],
    );
    (out, start.elapsed().as_secs_f64())
}

/// [`child`] with `scenario`, which succeeds: its stdout.
fn child_succeeds(scenario: &str) -> String {
    let (out, _) = child(scenario);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    stdout
}

/// [`child`] with `scenario`, which fails within 45 s (a rank asleep in its stage would take a
/// minute): its stderr.
fn child_fails(scenario: &str) -> String {
    let (out, seconds) = child(scenario);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(seconds < 45.0, "{seconds} s");
    stderr
}

#[test]
fn a_wrong_message_or_element_type_is_reported_naming_both() {
    let stdout = child_succeeds("wrong_message");
    assert!(
        stdout.contains(
            "rank 1 got: expected act(stage 0 -> 1, mb 0) from rank 0, got act(stage 0 -> 1, mb 1)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "rank 1 got: rank 0 sent act(stage 0 -> 1, mb 2) as f32 [2], but this rank expects f64 []"
        ),
        "{stdout}"
    );
}

#[test]
fn large_payloads_cross_in_one_group() {
    let stdout = child_succeeds("large");
    for rank in 0..2 {
        assert!(
            stdout.contains(&format!("rank {rank} received 1048576 floats")),
            "{stdout}"
        );
    }
}

#[test]
fn ranks_given_different_programs_stop_before_running() {
    let stdout = child_succeeds("fingerprint");
    for rank in 0..2 {
        let line = format!(
            "rank {rank} got: rank {rank}, instruction 0 (before the program): the ranks were \
             given different programs: ranks whose fingerprint differs from rank 0's ("
        );
        assert!(stdout.contains(&line), "{line}\n{stdout}");
    }
    assert!(stdout.contains("): rank 1 ("), "{stdout}");
    assert!(!stdout.contains("): rank 0 ("), "{stdout}");
}

#[test]
fn a_stalled_rank_ends_the_job_with_who_waits_for_what() {
    // Rank 0 sleeps for a minute: the abort, not its end, stops the job.
    let stderr = child_fails("timeout");
    // Rank 1 times out, asks every rank where it stands, and reports who waits on whom: itself
    // on rank 0, which (asleep in its stage) does not answer.
    assert!(
        stderr.contains(
            "error: no progress within 0.5 s: rank 0 did not answer within 0.5 s (computing, \
             stalled or gone); rank 1 waits at instruction 0 for act(stage 0 -> 1, mb 0) from rank 0"
        ),
        "{stderr}"
    );
}

#[test]
fn a_failing_stage_aborts_every_rank() {
    let stderr = child_fails("stage_error");
    assert!(
        stderr.contains("the stage failed: injected failure")
            && stderr.contains("error: rank 1, instruction "),
        "{stderr}"
    );
}

/// A stage that stalls in its first forward (rank 0) or fails in its first input-gradient
/// backward (rank 1), around the affine model.
struct Faulty {
    inner: AffineStage,
    stall: bool,
    fail: bool,
}

impl StageCompute for Faulty {
    type Tensor = f64;
    fn forward(&mut self, work: Work, input: Option<f64>) -> Result<f64, StageError> {
        if self.stall {
            std::thread::sleep(Duration::from_secs(60));
        }
        self.inner.forward(work, input)
    }
    fn loss(&mut self, work: Work, output: f64) -> Result<f64, StageError> {
        self.inner.loss(work, output)
    }
    fn backward_input(&mut self, work: Work, grad: f64) -> Result<Option<f64>, StageError> {
        if self.fail {
            return Err(StageError::failed("injected failure"));
        }
        self.inner.backward_input(work, grad)
    }
    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        self.inner.backward_weight(work)
    }
}

/// A payload of another element type, to send where an `f64` is expected.
struct Floats(Vec<f32>);

impl WirePayload for Floats {
    fn dtype(&self) -> WireDType {
        WireDType::F32
    }
    fn shape(&self) -> Vec<usize> {
        vec![self.0.len()]
    }
    fn to_bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn from_bytes(_: WireDType, _: &[usize], bytes: &[u8]) -> Result<Floats, String> {
        Ok(Floats(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }
}

fn act(mb: u32) -> Message {
    Message::activation(StageId::new(0), StageId::new(1), MicrobatchId::new(mb))
}

/// One scenario on 2 processes, started by the tests above through `mpirun`; does nothing when
/// run otherwise.
#[test]
#[ignore = "run under mpirun by the other tests"]
fn mpi_child() {
    let Ok(scenario) = std::env::var("PIPEWEAVE_MPI_SCENARIO") else {
        return;
    };
    let universe = rsmpi::initialize().expect("MPI starts once");
    let world = universe.world();
    let rank = world.rank();
    let config = PipelineConfig::new(2, 4).unwrap();
    let expression = if scenario == "fingerprint" && rank == 1 {
        "gpipe"
    } else {
        "f1b(gpipe)"
    };
    let plan = build_plan(expression, &config).unwrap();
    let programs = project(&plan, ProjectionOptions::default()).unwrap();
    let checked = CheckedPrograms::check(plan.problem(), programs).unwrap();
    let model = AffineModel::new(plan.problem());
    let no_delay = |_: &Task| Duration::ZERO;
    match scenario.as_str() {
        "wrong_message" => {
            let mut transport = MpiTransport::new(&world, Duration::from_secs(20));
            if rank == 0 {
                fn send<T>(message: Message, payload: T) -> Vec<Outgoing<T>> {
                    vec![Outgoing {
                        to: RankId::new(1),
                        message,
                        payload,
                    }]
                }
                Transport::<f64>::exchange(&mut transport, send(act(1), 1.0), &[]).unwrap();
                let floats = send(act(2), Floats(vec![1.0, 2.0]));
                Transport::<Floats>::exchange(&mut transport, floats, &[]).unwrap();
                Transport::<f64>::finish(&mut transport).unwrap();
            } else {
                for mb in [0, 2] {
                    let incoming = [Incoming {
                        from: RankId::new(0),
                        message: act(mb),
                    }];
                    let err = Transport::<f64>::exchange(&mut transport, Vec::new(), &incoming)
                        .unwrap_err();
                    println!("rank 1 got: {err}");
                }
            }
        }
        "large" => {
            // 4 MiB each way in one group (past any eager limit): batched, not blocking, sends.
            let mut transport = MpiTransport::new(&world, Duration::from_secs(20));
            let peer = RankId::new(1 - rank as u32);
            let (mine, theirs) = if rank == 0 {
                (
                    act(0),
                    Message::gradient(StageId::new(1), StageId::new(0), MicrobatchId::new(0)),
                )
            } else {
                (
                    Message::gradient(StageId::new(1), StageId::new(0), MicrobatchId::new(0)),
                    act(0),
                )
            };
            let payload: Vec<f32> = (0..1 << 20).map(|i| (i * (rank + 1)) as f32).collect();
            let sends = vec![Outgoing {
                to: peer,
                message: mine,
                payload: Floats(payload),
            }];
            let incoming = [Incoming {
                from: peer,
                message: theirs,
            }];
            let got = Transport::<Floats>::exchange(&mut transport, sends, &incoming).unwrap();
            Transport::<Floats>::finish(&mut transport).unwrap();
            let other = 2 - rank;
            let expected: Vec<f32> = (0..1 << 20).map(|i| (i * other) as f32).collect();
            assert!(got.len() == 1 && got[0].0 == expected);
            println!("rank {rank} received {} floats", got[0].0.len());
        }
        "fingerprint" => {
            let mut stage = model.stage(no_delay);
            let err = run_mpi(&world, &checked, &mut stage, MpiOptions::default()).unwrap_err();
            println!("rank {rank} got: {err}");
        }
        "timeout" | "stage_error" => {
            let mut stage = Faulty {
                inner: model.stage(no_delay),
                stall: scenario == "timeout" && rank == 0,
                fail: scenario == "stage_error" && rank == 1,
            };
            let options = MpiOptions {
                receive_timeout: Duration::from_millis(500),
            };
            run_mpi(&world, &checked, &mut stage, options).unwrap();
            println!("rank {rank} finished");
        }
        other => panic!("unknown scenario {other}"),
    }
}

#[test]
fn a_rank_killed_from_outside_ends_the_job_within_ten_seconds() {
    let _one = MPIRUN.lock().unwrap_or_else(|e| e.into_inner());
    // A run that would take about 13 s: 33 units of 0.4 s at 4 ranks and 8 microbatches.
    let mut job = mpirun_command(4)
        .arg(env!("CARGO_BIN_EXE_pipeweave"))
        .args(words(
            "run f1b(gpipe) -p 4 -m 8 --backend mpi --time-scale 400",
        ))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("mpirun runs (install Open MPI: .ci/mpi)");
    // A rank's command line starts with the binary (mpirun's and timeout's do not).
    let pattern = format!(
        "^{} run f1b\\(gpipe\\) -p 4 -m 8 --backend mpi --time-scale 400",
        env!("CARGO_BIN_EXE_pipeweave")
    );
    kill_a_rank_and_expect_the_job_to_end(&mut job, &pattern, Duration::from_millis(1500));
}
