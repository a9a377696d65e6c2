//! End-to-end execution on the threaded backend: every schedule gives the single-device gradients
//! (1e-12 relative, f64), and a failing or panicking rank stops the whole run, quickly, with an
//! error that names it; a compute that cannot honour a program's residency instructions is
//! refused before anything runs.

use pipeweave::backends::numeric::{total_gradients, AffineModel, AffineStage};
use pipeweave::backends::{
    run_threads, BackendError, Capabilities, Capability, StageCompute, StageError, ThreadOptions,
};
use pipeweave::core_ir::{project, CheckedPrograms, ProjectionOptions, RecvPolicy};
use pipeweave::{build_plan, PipelineConfig, StageCostsSpec, Task, Work};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const EXPRESSIONS: &[&str] = &[
    "gpipe",
    "f1b(gpipe)",
    "vpp(gpipe, chunks=2)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=3, group=4)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe), policy=h2)",
    "zero_bubble(f1b(gpipe), policy=auto, memory=6)",
    "zero_bubble(vpp(f1b(gpipe), chunks=2))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
    "dual(f1b(gpipe))",
    "zero_bubble(dual(f1b(gpipe)))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)), policy=auto)",
];

fn no_delay(_: &Task) -> Duration {
    Duration::ZERO
}

#[test]
fn every_schedule_gives_the_single_device_gradients() {
    let costs = StageCostsSpec::builder()
        .forward(1.0)
        .input_grad(1.2)
        .weight_grad(0.7)
        .build()
        .validate()
        .unwrap();
    for &(p, m) in &[(2u32, 4u32), (4, 8), (4, 12)] {
        let config = PipelineConfig::new(p, m)
            .unwrap()
            .with_costs(costs, 0.05)
            .unwrap();
        for expr in EXPRESSIONS {
            let plan =
                build_plan(expr, &config).unwrap_or_else(|e| panic!("{expr} P={p} M={m}: {e}"));
            let model = AffineModel::new(plan.problem());
            let reference = model.sequential_gradients(plan.problem());
            for recv in [RecvPolicy::Early, RecvPolicy::JustInTime] {
                let programs = project(
                    &plan,
                    ProjectionOptions {
                        recv,
                        forward_only: false,
                    },
                )
                .unwrap();
                let stages = run_threads(
                    &CheckedPrograms::check(plan.problem(), programs.clone()).unwrap(),
                    |_| model.stage(no_delay),
                    ThreadOptions::default(),
                )
                .unwrap_or_else(|e| panic!("{expr} P={p} M={m}: {e}"));
                let error = AffineModel::max_relative_error(&total_gradients(&stages), &reference);
                assert!(
                    error <= 1e-12,
                    "{expr} P={p} M={m} {recv:?}: relative error {error}"
                );
            }
        }
    }
}

#[test]
fn forward_only_runs_compute_losses_and_no_gradients() {
    let plan = build_plan(
        "zero_bubble(dual(f1b(gpipe)))",
        &PipelineConfig::new(4, 8).unwrap(),
    )
    .unwrap();
    let model = AffineModel::new(plan.problem());
    let programs = project(
        &plan,
        ProjectionOptions {
            recv: RecvPolicy::Early,
            forward_only: true,
        },
    )
    .unwrap();
    let stages = run_threads(
        &CheckedPrograms::check(plan.problem(), programs.clone()).unwrap(),
        |_| model.stage(no_delay),
        ThreadOptions::default(),
    )
    .unwrap();
    assert!(total_gradients(&stages)
        .iter()
        .all(|&(a, b)| a == 0.0 && b == 0.0));
}

/// A stage that fails (or panics) at one work item and behaves otherwise.
struct Faulty {
    inner: AffineStage,
    at: Option<Work>,
    panic: bool,
}

impl StageCompute for Faulty {
    type Tensor = f64;
    fn forward(&mut self, work: Work, input: Option<f64>) -> Result<f64, StageError> {
        if Some(work) == self.at {
            if self.panic {
                panic!("injected panic in stage {}", work.stage);
            }
            return Err(StageError::failed(format!(
                "injected failure in stage {}",
                work.stage
            )));
        }
        self.inner.forward(work, input)
    }
    fn loss(&mut self, work: Work, output: f64) -> Result<f64, StageError> {
        self.inner.loss(work, output)
    }
    fn backward_input(&mut self, work: Work, grad: f64) -> Result<Option<f64>, StageError> {
        self.inner.backward_input(work, grad)
    }
    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        self.inner.backward_weight(work)
    }
}

/// A stage whose `free_output` hook panics on rank 1.
struct PanicsInFree {
    inner: AffineStage,
    rank: u32,
}

impl StageCompute for PanicsInFree {
    type Tensor = f64;
    fn forward(&mut self, work: Work, input: Option<f64>) -> Result<f64, StageError> {
        self.inner.forward(work, input)
    }
    fn loss(&mut self, work: Work, output: f64) -> Result<f64, StageError> {
        self.inner.loss(work, output)
    }
    fn backward_input(&mut self, work: Work, grad: f64) -> Result<Option<f64>, StageError> {
        self.inner.backward_input(work, grad)
    }
    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        self.inner.backward_weight(work)
    }
    fn free_output(&mut self, work: Work) {
        if self.rank == 1 {
            panic!("free_output of stage {} broke", work.stage);
        }
    }
}

#[test]
fn a_panic_in_the_free_output_hook_is_a_run_error_naming_rank_and_instruction() {
    let plan = build_plan("f1b(gpipe)", &PipelineConfig::new(4, 4).unwrap()).unwrap();
    let model = AffineModel::new(plan.problem());
    let programs = project(&plan, ProjectionOptions::default()).unwrap();
    let err = run_threads(
        &CheckedPrograms::check(plan.problem(), programs.clone()).unwrap(),
        |rank| PanicsInFree {
            inner: model.stage(no_delay),
            rank: rank.get(),
        },
        ThreadOptions::default(),
    )
    .err()
    .expect("the run fails");
    match &err {
        BackendError::Panicked {
            rank,
            what,
            component,
            reason,
            ..
        } => {
            assert_eq!(rank.get(), 1);
            assert_eq!(what, "free-output(stage 1, mb 0)");
            assert_eq!(*component, "stage");
            assert_eq!(reason, "free_output of stage 1 broke");
        }
        other => panic!("expected the free_output panic of rank 1, got {other}"),
    }
}

fn run_with_fault(panic: bool) -> (BackendError, Duration) {
    let plan = build_plan(
        "vpp(f1b(gpipe), chunks=2)",
        &PipelineConfig::new(4, 8).unwrap(),
    )
    .unwrap();
    let model = AffineModel::new(plan.problem());
    let programs = project(&plan, ProjectionOptions::default()).unwrap();
    let bad = Work::new(6, 3); // stage 6 runs on rank 2
    let start = Instant::now();
    let err = run_threads(
        &CheckedPrograms::check(plan.problem(), programs.clone()).unwrap(),
        |rank| Faulty {
            inner: model.stage(no_delay),
            at: (rank.get() == 2).then_some(bad),
            panic,
        },
        ThreadOptions {
            receive_timeout: Duration::from_secs(30),
        },
    )
    .err()
    .expect("the run fails");
    (err, start.elapsed())
}

#[test]
fn a_failing_rank_stops_the_run_with_its_error() {
    let (err, took) = run_with_fault(false);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    match &err {
        BackendError::Stage {
            rank, what, source, ..
        } => {
            assert_eq!(rank.get(), 2);
            assert_eq!(what, "6F3");
            assert_eq!(source.to_string(), "injected failure in stage 6");
            assert_eq!(source.kind(), pipeweave::core_ir::FailureKind::Failed);
        }
        other => panic!("expected the stage error of rank 2, got {other}"),
    }
    assert!(err.to_string().starts_with("rank 2, instruction "), "{err}");
}

#[test]
fn a_panicking_rank_stops_the_run_with_its_message() {
    let (err, took) = run_with_fault(true);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    match &err {
        BackendError::Panicked {
            rank, what, reason, ..
        } => {
            assert_eq!((rank.get(), what.as_str()), (2, "6F3"));
            assert_eq!(reason, "injected panic in stage 6");
        }
        other => panic!("expected the panic of rank 2, got {other}"),
    }
}

#[test]
fn unchecked_programs_cannot_be_run() {
    // The backends take checked programs only; the check refuses a set that misses a rank.
    let plan = build_plan("f1b(gpipe)", &PipelineConfig::new(2, 2).unwrap()).unwrap();
    let mut programs = project(&plan, ProjectionOptions::default()).unwrap();
    programs.programs.pop();
    let err = CheckedPrograms::check(plan.problem(), programs).unwrap_err();
    assert_eq!(err.to_string(), "1 programs for 2 ranks");
}

/// The affine stage declaring recompute only, counting the calls it gets.
struct RecomputeOnly<'a> {
    inner: AffineStage,
    calls: &'a AtomicUsize,
}

impl StageCompute for RecomputeOnly<'_> {
    type Tensor = f64;
    fn forward(&mut self, work: Work, input: Option<f64>) -> Result<f64, StageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.forward(work, input)
    }
    fn loss(&mut self, work: Work, output: f64) -> Result<f64, StageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.loss(work, output)
    }
    fn backward_input(&mut self, work: Work, grad: f64) -> Result<Option<f64>, StageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.backward_input(work, grad)
    }
    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.backward_weight(work)
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            recompute: true,
            offload: false,
        }
    }
    fn drop_activations(&mut self, work: Work) -> Result<(), StageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.drop_activations(work)
    }
    fn recompute(&mut self, work: Work) -> Result<(), StageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.inner.recompute(work)
    }
}

#[test]
fn a_compute_without_offload_is_refused_an_offload_plan_before_anything_runs() {
    let costs = StageCostsSpec::builder()
        .forward(1.0)
        .input_grad(1.2)
        .weight_grad(0.7)
        .offload(0.25)
        .build()
        .validate()
        .unwrap();
    let config = PipelineConfig::new(4, 8)
        .unwrap()
        .with_costs(costs, 0.05)
        .unwrap();
    let plan = build_plan("offload(f1b(gpipe), memory=2)", &config).unwrap();
    assert!(plan.facts().residency.offloaded);
    let model = AffineModel::new(plan.problem());
    let checked = CheckedPrograms::of_plan(&plan, None, ProjectionOptions::default()).unwrap();
    let calls = AtomicUsize::new(0);
    let err = run_threads(
        &checked,
        |_| RecomputeOnly {
            inner: model.stage(no_delay),
            calls: &calls,
        },
        ThreadOptions::default(),
    )
    .err()
    .expect("the run is refused");
    assert_eq!(calls.load(Ordering::SeqCst), 0, "an instruction ran");
    match &err {
        BackendError::Unsupported {
            rank,
            instr,
            what,
            capability,
        } => {
            assert_eq!(*capability, Capability::Offload);
            let program = &checked.programs().programs[rank.index()];
            assert_eq!(what, &program.instrs[*instr].to_string());
            assert!(what.starts_with("offload("), "{what}");
        }
        other => panic!("expected the refusal of offload, got {other}"),
    }
    assert_eq!(err.kind(), pipeweave::core_ir::FailureKind::BadInput);
    let text = err.to_string();
    assert!(text.contains("does not support"), "{text}");
    // The affine stage declares offload: the same programs run to the single-device gradients.
    let stages = run_threads(
        &checked,
        |_| model.stage(no_delay),
        ThreadOptions::default(),
    )
    .unwrap();
    let reference = model.sequential_gradients(plan.problem());
    assert!(AffineModel::max_relative_error(&total_gradients(&stages), &reference) <= 1e-12);
}

#[test]
fn a_compute_without_recompute_is_refused_a_recompute_plan() {
    let plan = build_plan(
        "recompute(f1b(gpipe), memory=2)",
        &PipelineConfig::new(4, 8).unwrap(),
    )
    .unwrap();
    assert!(plan.facts().residency.recomputed);
    let model = AffineModel::new(plan.problem());
    let checked = CheckedPrograms::of_plan(&plan, None, ProjectionOptions::default()).unwrap();
    // `Faulty` declares no capability (the default).
    let err = run_threads(
        &checked,
        |_| Faulty {
            inner: model.stage(no_delay),
            at: None,
            panic: false,
        },
        ThreadOptions::default(),
    )
    .err()
    .expect("the run is refused");
    match &err {
        BackendError::Unsupported {
            capability, what, ..
        } => {
            assert_eq!(*capability, Capability::Recompute);
            assert!(what.starts_with("drop("), "{what}");
        }
        other => panic!("expected the refusal of recompute, got {other}"),
    }
}
