//! `dual` at every size: DualPipe below DeepSeek's `M >= 2P` (and at odd `M` or `P`) builds,
//! verifies after every pass, projects to programs the checker accepts, is never slower than the
//! 1F1B plan it starts from (with `zero_bubble` too), and keeps its documented memory budget.

mod common;

use common::{costed, persisted};
use pipeweave::core_ir::{
    check_programs, project, DualKind, ProjectionOptions, RecvPolicy, TOLERANCE,
};
use pipeweave::{
    build_plan_observed, simulate, verify, Layout, PipelineConfig, Plan, StageCostsSpec,
};
use proptest::prelude::*;

/// Integer costs of a rank's share: F, I, W, optionally a fused B and an overlapped FB, and the
/// cross-rank latency.
#[derive(Clone, Copy, Debug)]
struct Costs {
    f: u32,
    i: u32,
    w: u32,
    b: Option<u32>,
    fb: Option<u32>,
    comm: u32,
}

fn config(p: u32, m: u32, c: Costs) -> PipelineConfig {
    let spec = StageCostsSpec::builder()
        .forward(c.f.into())
        .input_grad(c.i.into())
        .weight_grad(c.w.into())
        .full_backward_opt(c.b.map(f64::from))
        .overlapped_opt(c.fb.map(f64::from))
        .build();
    costed(p, m, spec, c.comm.into())
}

/// Builds `expr`, checking that every intermediate plan verifies and the final plan's programs
/// pass the checker under both receive policies.
fn checked_plan(expr: &str, config: &PipelineConfig) -> Result<Plan, String> {
    let mut prefixes = Vec::new();
    let plan = build_plan_observed(expr, config, &mut |_, plan| prefixes.push(plan.clone()))
        .map_err(|e| format!("{expr}: {e}"))?;
    for prefix in &prefixes {
        verify(prefix).map_err(|e| format!("{expr}, after {:?}: {e}", prefix.passes()))?;
    }
    for recv in [RecvPolicy::Early, RecvPolicy::JustInTime] {
        let options = ProjectionOptions {
            recv,
            forward_only: false,
        };
        let programs = project(&plan, options).map_err(|e| format!("{expr}: {e}"))?;
        check_programs(plan.problem(), &programs).map_err(|e| format!("{expr} {recv:?}: {e}"))?;
    }
    Ok(plan)
}

fn makespan(plan: &Plan) -> f64 {
    simulate(plan).unwrap().makespan()
}

fn peak(plan: &Plan) -> f64 {
    common::peak(&simulate(plan).unwrap())
}

/// Whether DeepSeek's own DualPipe order applies.
fn deepseek(p: u32, m: u32) -> bool {
    p % 2 == 0 && m % 2 == 0 && m >= 2 * p
}

/// The `dual_sizes` property at one size and cost model.
fn never_slower(p: u32, m: u32, costs: Costs) -> Result<(), TestCaseError> {
    let c = config(p, m, costs);
    let at = format!("P={p} M={m} {costs:?}");
    let f1b = checked_plan("f1b(gpipe)", &c).unwrap();
    let dual = checked_plan("dual(f1b(gpipe))", &c)
        .map_err(|e| TestCaseError::fail(format!("{at}: {e}")))?;
    let zero_bubble = checked_plan("zero_bubble(dual(f1b(gpipe)))", &c)
        .map_err(|e| TestCaseError::fail(format!("{at}: {e}")))?;
    let (f1b_time, dual_time, zb_time) = (makespan(&f1b), makespan(&dual), makespan(&zero_bubble));
    // At DeepSeek's sizes the order is DeepSeek's, op for op (the golden tests); it pairs F and B
    // into F&B and splits backwards whatever they cost, so it is compared with 1F1B only where
    // those are their parts' sums, as in DeepSeek's own figures.
    if !deepseek(p, m) || (costs.b.is_none() && costs.fb.is_none()) {
        prop_assert!(
            dual_time <= f1b_time + TOLERANCE,
            "{}: dual {} > f1b {}",
            at,
            dual_time,
            f1b_time
        );
        prop_assert!(
            zb_time <= f1b_time + TOLERANCE,
            "{}: zero_bubble(dual) {} > f1b {}",
            at,
            zb_time,
            f1b_time
        );
    }
    if !deepseek(p, m) {
        // Counter-flow: zero_bubble's search starts from dual's order; memory within P + 1.
        prop_assert!(
            zb_time <= dual_time + TOLERANCE,
            "{}: zero_bubble(dual) {} > dual {}",
            at,
            zb_time,
            dual_time
        );
        for plan in [&dual, &zero_bubble] {
            prop_assert!(
                peak(plan) <= f64::from(p + 1) + TOLERANCE,
                "{}: peak {} > P + 1",
                at,
                peak(plan)
            );
        }
    }
    if m >= 2 {
        prop_assert_eq!(
            dual.facts().layout,
            Layout::Dual(DualKind::DualPipe),
            "{}",
            at
        );
    } else {
        prop_assert_eq!(
            dual.orders(),
            f1b.orders(),
            "{}: one microbatch stays 1F1B",
            at
        );
    }
    Ok(())
}

fn costs() -> impl Strategy<Value = Costs> {
    (
        1u32..=4,
        1u32..=4,
        1u32..=4,
        prop::option::of(1u32..=8),
        prop::option::of(1u32..=10),
        prop_oneof![Just(0u32), 1u32..=3],
    )
        .prop_map(|(f, i, w, b, fb, comm)| Costs {
            f,
            i,
            w,
            b,
            fb,
            comm,
        })
}

/// An even rank count in 2..=8 and a microbatch count in 1..=4P.
fn even_sizes() -> impl Strategy<Value = (u32, u32)> {
    (1u32..=4).prop_flat_map(|half| (Just(2 * half), 1..=8 * half))
}

proptest! {
    #![proptest_config(persisted(128, "proptest-regressions/dual_sizes.txt"))]

    /// Even P, every M up to 4P, random integer costs with and without latency.
    #[test]
    fn dualpipe_at_every_microbatch_count_is_never_slower_than_1f1b(
        (p, m) in even_sizes(), costs in costs(),
    ) {
        never_slower(p, m, costs)?;
    }

    /// Odd P: the middle rank holds a stage and its own mirror; the same promises hold.
    #[test]
    fn dualpipe_with_an_odd_rank_count_is_never_slower_than_1f1b(
        half in 0u32..=3, m in 1u32..=16, costs in costs(),
    ) {
        never_slower(2 * half + 1, m, costs)?;
    }
}

/// Makespans at F = 1, B = 2 (I = W = 1), no latency, as the `dual` pass's doc quotes them.
#[test]
fn counter_flow_figures() {
    let unit = Costs {
        f: 1,
        i: 1,
        w: 1,
        b: None,
        fb: None,
        comm: 0,
    };
    let check = |p: u32, m: u32, expected: [f64; 3]| {
        let c = config(p, m, unit);
        let got = [
            "f1b(gpipe)",
            "dual(f1b(gpipe))",
            "zero_bubble(dual(f1b(gpipe)))",
        ]
        .map(|e| makespan(&checked_plan(e, &c).unwrap()));
        assert_eq!(got, expected, "P={p} M={m}: f1b, dual, zero_bubble(dual)");
    };
    check(4, 1, [12.0, 12.0, 9.0]);
    check(4, 2, [15.0, 12.0, 9.0]);
    check(4, 3, [18.0, 15.0, 11.0]);
    check(4, 4, [21.0, 17.0, 14.0]);
    check(4, 5, [24.0, 19.0, 17.0]);
    check(4, 6, [27.0, 21.0, 19.0]);
    check(4, 7, [30.0, 25.0, 22.0]);
    // DeepSeek's own order from M = 2P on.
    check(4, 8, [33.0, 28.0, 26.0]);
    check(3, 4, [18.0, 15.0, 13.0]);
}
