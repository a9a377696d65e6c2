//! `recompute` and `offload` over every built-in schedule, at random sizes, limits and costs: the
//! result fits its limit (or the error says it cannot), verifies, projects to programs the checker
//! accepts under both receive placements, and runs on threads to the single-device gradients.

use pipeweave::backends::numeric::{total_gradients, AffineModel};
use pipeweave::backends::{run_threads, ThreadOptions};
mod common;

use common::{costed, persisted};
use pipeweave::core_ir::{
    check_programs, max_peak, project, CheckedPrograms, ProjectionOptions, RecvPolicy, TOLERANCE,
};
use pipeweave::{
    build_plan, simulate, Error, PipelineConfig, StageCostsSpec, StageMemorySpec, Task,
    TransformError,
};
use proptest::prelude::*;
use std::time::Duration;

/// The schedules recompute and offload wrap: every built-in family.
const BASES: &[&str] = &[
    "gpipe",
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
    "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=v_min)",
    "dual(f1b(gpipe))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
];

/// How a base is wrapped at limit `m`.
fn wrapped(kind: u8, base: &str, m: f64) -> String {
    match kind {
        0 => format!("recompute({base}, memory={m})"),
        1 => format!("offload({base}, memory={m})"),
        2 => format!(
            "offload(recompute({base}, memory={}), memory={m})",
            m * 1.25
        ),
        _ => format!(
            "recompute(offload({base}, memory={}), memory={m})",
            m * 1.25
        ),
    }
}

fn config(p: u32, m: u32, transfer: f64, comm: f64, weight_grad: f64) -> PipelineConfig {
    let costs = StageCostsSpec::builder()
        .forward(1.0)
        .input_grad(1.2)
        .weight_grad(0.7)
        .offload(transfer)
        .build();
    let memory = StageMemorySpec::builder()
        .weight_grad(weight_grad)
        .build()
        .validate()
        .unwrap();
    costed(p, m, costs, comm).with_memory(memory)
}

proptest! {
    #![proptest_config(persisted(256, "proptest-regressions/residency.txt"))]

    #[test]
    fn recompute_and_offload_fit_verify_check_and_run(
        p in 1u32..=5,
        m in 1u32..=12,
        base in 0usize..BASES.len(),
        kind in 0u8..4,
        fraction in 0.2f64..=1.1,
        transfer in prop::sample::select(vec![0.25, 1.0, 3.0]),
        comm in prop::sample::select(vec![0.0, 0.1]),
        weight_grad in prop::sample::select(vec![1.0, 0.5]),
    ) {
        let c = config(p, m, transfer, comm, weight_grad);
        let base = BASES[base];
        let Ok(plain) = build_plan(base, &c) else {
            return Ok(()); // sizes the base refuses are its own tests' business
        };
        let peak = max_peak(&plain);
        let limit = ((peak * fraction * 4.0).round() / 4.0).max(0.25);
        let expression = wrapped(kind, base, limit);
        let plan = match build_plan(&expression, &c) {
            Ok(plan) => plan,
            Err(Error::Transform(TransformError::Precondition { pass, constraint, .. })) => {
                prop_assert!(pass == "recompute" || pass == "offload", "{}: {}", expression, pass);
                prop_assert!(constraint.contains("reachable with pairs"), "{}: {}", expression, constraint);
                prop_assert!(limit < peak, "{}: refused a limit the plan already fits", expression);
                return Ok(());
            }
            Err(other) => return Err(TestCaseError::fail(format!("{expression}: {other}"))),
        };
        prop_assert!(max_peak(&plan) <= limit + TOLERANCE, "{}: peak {} above {}", expression, max_peak(&plan), limit);
        if kind < 2 && limit >= peak {
            prop_assert_eq!(plan.orders(), plain.orders(), "{} changed a plan that fits", expression);
        }
        let residency = plan.facts().residency;
        let has = |f: fn(&Task) -> bool| plan.orders().iter().flatten().any(f);
        prop_assert_eq!(residency.recomputed, has(|t| matches!(t, Task::Recompute(_) | Task::RecomputeWeightGrad(_))));
        prop_assert_eq!(residency.offloaded, has(|t| matches!(t, Task::Offload(_))));
        simulate(&plan).unwrap();
        let model = AffineModel::new(plan.problem());
        let reference = model.sequential_gradients(plan.problem());
        for recv in [RecvPolicy::Early, RecvPolicy::JustInTime] {
            let programs = project(&plan, ProjectionOptions { recv, forward_only: false }).unwrap();
            check_programs(plan.problem(), &programs)
                .map_err(|e| TestCaseError::fail(format!("{expression} {recv:?}: {e}")))?;
            let stages = run_threads(
                &CheckedPrograms::check(plan.problem(), programs.clone()).unwrap(),
                |_| model.stage(|_: &Task| Duration::ZERO),
                ThreadOptions::default(),
            )
            .map_err(|e| TestCaseError::fail(format!("{expression} {recv:?}: {e}")))?;
            let error = AffineModel::max_relative_error(&total_gradients(&stages), &reference);
            prop_assert!(error <= 1e-12, "{} {:?}: relative error {}", expression, recv, error);
        }
    }
}

/// The memory a bare expression holds, for the fixed cases below.
fn peak_of(expression: &str, c: &PipelineConfig) -> f64 {
    max_peak(&build_plan(expression, c).unwrap())
}

#[test]
fn offload_hides_cheap_transfers_where_recompute_pays_for_its_forwards() {
    // 1F1B at 8 ranks, 32 microbatches, down to 2 activations: transfers of a quarter of a
    // forward hide behind the computes; recomputes run on rank 0, which has no bubble to fill.
    let c = config(8, 32, 0.25, 0.0, 1.0);
    let kept = simulate(&build_plan("f1b(gpipe)", &c).unwrap())
        .unwrap()
        .makespan();
    let offloaded = build_plan("offload(f1b(gpipe), memory=2)", &c).unwrap();
    let recomputed = build_plan("recompute(f1b(gpipe), memory=2)", &c).unwrap();
    let offload_makespan = simulate(&offloaded).unwrap().makespan();
    let recompute_makespan = simulate(&recomputed).unwrap().makespan();
    assert!(
        offload_makespan <= kept * 1.06,
        "{offload_makespan} against {kept}"
    );
    assert!(
        recompute_makespan > offload_makespan,
        "{recompute_makespan} vs {offload_makespan}"
    );
    assert!(peak_of("f1b(gpipe)", &c) == 8.0 && max_peak(&offloaded) <= 2.0);
}
