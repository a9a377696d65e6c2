//! Unit tests of [`super`]: every order it builds verified and simulated.
use super::*;
use crate::compile_expression;
use pipeweave_core::testing::unscheduled_with_latency;
use pipeweave_core::{max_peak, simulate, verify, Backwards, Facts, StageCosts};

/// `expr` on `ranks` x `microbatches` at unit costs (a rank's share) and latency `comm`,
/// with its backwards split as `zero_bubble` sees them.
fn plan(expr: &str, ranks: u32, microbatches: u32, comm: f64) -> Plan {
    let unscheduled = unscheduled_with_latency(ranks, microbatches, StageCosts::default(), comm);
    let plan = compile_expression(expr).unwrap().run(unscheduled).unwrap();
    let split = Facts {
        backwards: Backwards::Split,
        ..plan.facts()
    };
    plan.with_facts(split).unwrap()
}

fn v_plan(ranks: u32, microbatches: u32, comm: f64) -> Plan {
    plan(
        "vpp(f1b(gpipe), chunks=2, layout=v)",
        ranks,
        microbatches,
        comm,
    )
}

/// Every run's (longest span, makespan), after checking that it is a valid schedule within
/// `limit`.
fn runs_of(plan: &Plan, limit: f64) -> Vec<(f64, f64)> {
    zbv_auto_orders(plan, limit)
        .into_iter()
        .map(|orders| {
            let candidate = plan.clone().with_orders(orders).unwrap();
            verify(&candidate).unwrap();
            assert!(max_peak(&candidate) <= limit + TOLERANCE);
            let sim = simulate(&candidate).unwrap();
            (sim.max_span(), sim.makespan())
        })
        .collect()
}

#[test]
fn every_run_is_a_valid_schedule_within_the_limit() {
    for (ranks, microbatches, comm) in [
        (1, 1, 0.0),
        (1, 3, 0.0),
        (2, 1, 0.5),
        (2, 5, 0.0),
        (4, 3, 0.1),
        (4, 8, 0.0),
        (5, 11, 1.0),
        (8, 8, 0.1),
    ] {
        let plan = v_plan(ranks, microbatches, comm);
        let limit = max_peak(&plan);
        assert!(
            !runs_of(&plan, limit).is_empty(),
            "{ranks} x {microbatches}: no run"
        );
    }
}

#[test]
fn unit_costs_give_no_bubble_at_one_f_one_b_memory() {
    let plan = v_plan(4, 8, 0.0);
    let best = runs_of(&plan, 4.0)
        .into_iter()
        .map(|(span, _)| span)
        .fold(f64::INFINITY, f64::min);
    assert!((best - 24.0).abs() < TOLERANCE, "span {best}");
}

#[test]
fn few_microbatches_with_latency_match_sailsg() {
    // sail-sg's scheduler: makespan 31.4, longest span 29.1 (tests/fixtures/zbv_sailsg.json).
    let plan = v_plan(8, 8, 0.1);
    let runs = runs_of(&plan, 8.0);
    assert!(runs
        .iter()
        .any(|&(span, makespan)| span <= 29.1 + TOLERANCE && makespan <= 31.4 + TOLERANCE));
}

#[test]
fn a_limit_below_the_budgets_leaves_no_run() {
    assert!(runs_of(&v_plan(4, 8, 0.0), 1.0).is_empty());
}

#[test]
fn other_placements_get_no_runs() {
    for expr in ["f1b(gpipe)", "vpp(f1b(gpipe), chunks=2)"] {
        assert!(
            zbv_auto_orders(&plan(expr, 4, 8, 0.0), 100.0).is_empty(),
            "{expr}"
        );
    }
}
