//! End-to-end execution on the threaded backend: every schedule gives the single-device gradients
//! (1e-12 relative, f64), and a failing or panicking rank stops the whole run, quickly, with an
//! error that names it; a compute that cannot honour a program's residency instructions is
//! refused before anything runs; a mixture of experts' all-to-all instructions pass by a compute
//! without experts.

mod common;

use common::costed;
use pipeweave::backends::numeric::{total_gradients, AffineModel, AffineStage};
use pipeweave::backends::{
    run_threads, BackendError, Capabilities, Capability, StageCompute, StageError, ThreadOptions,
};
use pipeweave::core_ir::{project, CheckedPrograms, Instr, ProjectionOptions, RecvPolicy};
use pipeweave::{build_plan, PipelineConfig, Plan, StageCostsSpec, Task, Work};
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

/// The plan of `expression` on `ranks` ranks and `microbatches` microbatches, unit costs.
fn plan(expression: &str, ranks: u32, microbatches: u32) -> Plan {
    build_plan(
        expression,
        &PipelineConfig::new(ranks, microbatches).unwrap(),
    )
    .unwrap()
}

fn no_delay(_: &Task) -> Duration {
    Duration::ZERO
}

/// `plan`'s programs (receives placed by `recv`, forward-only or not), projected and checked.
fn programs(plan: &Plan, recv: RecvPolicy, forward_only: bool) -> CheckedPrograms {
    CheckedPrograms::of_plan(plan, None, ProjectionOptions { recv, forward_only }).unwrap()
}

/// `checked` run on threads by `model`'s affine stages.
fn run_affine(
    checked: &CheckedPrograms,
    model: &AffineModel,
) -> Result<Vec<AffineStage>, BackendError> {
    run_threads(checked, |_| model.stage(no_delay), ThreadOptions::default())
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
                let stages = run_affine(&programs(&plan, recv, false), &model)
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
fn all_to_all_instructions_pass_by_a_compute_without_experts() {
    let config = costed(4, 8, StageCostsSpec::builder().a2a(0.5).build(), 0.05);
    for expr in ["f1b(gpipe)", "zero_bubble(dual(f1b(gpipe)))"] {
        let plan = build_plan(expr, &config).unwrap();
        let model = AffineModel::new(plan.problem());
        let reference = model.sequential_gradients(plan.problem());
        let checked = programs(&plan, RecvPolicy::Early, false);
        assert!(checked.programs().programs[0]
            .instrs
            .iter()
            .any(|i| matches!(i, Instr::IssueAllToAll(_))));
        let stages = run_affine(&checked, &model).unwrap();
        let error = AffineModel::max_relative_error(&total_gradients(&stages), &reference);
        assert!(error <= 1e-12, "{expr}: relative error {error}");
    }
}

#[test]
fn forward_only_runs_compute_losses_and_no_gradients() {
    let plan = plan("zero_bubble(dual(f1b(gpipe)))", 4, 8);
    let model = AffineModel::new(plan.problem());
    let stages = run_affine(&programs(&plan, RecvPolicy::Early, true), &model).unwrap();
    assert!(total_gradients(&stages)
        .iter()
        .all(|&(a, b)| a == 0.0 && b == 0.0));
}

/// What a [`Faulty`] stage does wrong.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Nothing: the affine stage as it is.
    None,
    /// Its forward of this work item fails.
    FailAt(Work),
    /// Its forward of this work item panics.
    PanicAt(Work),
    /// Its `free_output` hook panics.
    PanicInFree,
}

/// The affine stage with one [`Fault`]; it declares no capability (the default).
struct Faulty {
    inner: AffineStage,
    fault: Fault,
}

impl StageCompute for Faulty {
    type Tensor = f64;
    fn forward(&mut self, work: Work, input: Option<f64>) -> Result<f64, StageError> {
        match self.fault {
            Fault::PanicAt(at) if at == work => panic!("injected panic in stage {}", work.stage),
            Fault::FailAt(at) if at == work => Err(StageError::failed(format!(
                "injected failure in stage {}",
                work.stage
            ))),
            _ => self.inner.forward(work, input),
        }
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
        if self.fault == Fault::PanicInFree {
            panic!("free_output of stage {} broke", work.stage);
        }
    }
}

#[test]
fn a_panic_in_the_free_output_hook_is_a_run_error_naming_rank_and_instruction() {
    let plan = plan("f1b(gpipe)", 4, 4);
    let model = AffineModel::new(plan.problem());
    let err = run_threads(
        &programs(&plan, RecvPolicy::Early, false),
        |rank| Faulty {
            inner: model.stage(no_delay),
            fault: if rank.get() == 1 {
                Fault::PanicInFree
            } else {
                Fault::None
            },
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

/// Runs interleaved 1F1B with the fault `at(6F3)` on rank 2 (which holds stage 6) and returns its
/// error; the run must stop within 5 s.
fn run_with_fault(at: fn(Work) -> Fault) -> BackendError {
    let plan = plan("vpp(f1b(gpipe), chunks=2)", 4, 8);
    let model = AffineModel::new(plan.problem());
    let fault = at(Work::new(6, 3));
    let start = Instant::now();
    let err = run_threads(
        &programs(&plan, RecvPolicy::Early, false),
        |rank| Faulty {
            inner: model.stage(no_delay),
            fault: if rank.get() == 2 { fault } else { Fault::None },
        },
        ThreadOptions {
            receive_timeout: Duration::from_secs(30),
        },
    )
    .err()
    .expect("the run fails");
    let took = start.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    err
}

#[test]
fn a_failing_rank_stops_the_run_with_its_error() {
    let err = run_with_fault(Fault::FailAt);
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
    match run_with_fault(Fault::PanicAt) {
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
    let plan = plan("f1b(gpipe)", 2, 2);
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
    let checked = programs(&plan, RecvPolicy::Early, false);
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
    let stages = run_affine(&checked, &model).unwrap();
    let reference = model.sequential_gradients(plan.problem());
    assert!(AffineModel::max_relative_error(&total_gradients(&stages), &reference) <= 1e-12);
}

#[test]
fn a_compute_without_recompute_is_refused_a_recompute_plan() {
    let plan = plan("recompute(f1b(gpipe), memory=2)", 4, 8);
    assert!(plan.facts().residency.recomputed);
    let model = AffineModel::new(plan.problem());
    let checked = programs(&plan, RecvPolicy::Early, false);
    // `Faulty` declares no capability (the default).
    let err = run_threads(
        &checked,
        |_| Faulty {
            inner: model.stage(no_delay),
            fault: Fault::None,
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
