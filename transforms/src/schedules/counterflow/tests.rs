//! Unit tests of [`super`]: every order it builds verified and simulated.
use super::*;
use pipeweave_core::testing::{costs, problem, unscheduled_on};
use pipeweave_core::{simulate, verify, DualKind, Layout, Pacing, ProblemSpec};

fn dual_plan(ranks: u32, microbatches: u32, f: f64, b: f64) -> Plan {
    let problem = ProblemSpec::dualpipe(ranks, microbatches)
        .validate()
        .unwrap();
    let plan = unscheduled_on(problem, costs(f, b / 2.0, b / 2.0));
    let facts = Facts {
        layout: Layout::Dual(DualKind::DualPipe),
        pacing: Pacing::OneForwardOneBackward,
        backwards: Backwards::Whole,
        residency: pipeweave_core::Residency::KEPT,
    };
    plan.with_facts(facts).unwrap()
}

#[test]
fn strict_lanes_run_1f1b_per_position() {
    let problem = problem(4, 3);
    let route = &problem.routes()[0];
    // A strict lane run alone: always its one next step.
    let run = |position: usize, warmup: Warmup| {
        let variant = Variant {
            warmup,
            free: false,
            prefer: Prefer::Backward,
            overlap: false,
            weights: Weights::Fused,
        };
        let mut lane = Lane::new(route, 0, position, variant);
        let mut text = Vec::new();
        while let Some(step) = lane.heads().next() {
            text.push(match step {
                Step::Forward(m) => format!("F{m}"),
                Step::Backward(m) => format!("B{m}"),
            });
            lane.advance(step);
        }
        assert!(lane.done());
        text.join(" ")
    };
    let one = Warmup::OneForwardOneBackward;
    assert_eq!(run(0, one), "F0 F1 F2 B0 B1 B2");
    assert_eq!(run(2, one), "F0 F1 B0 F2 B1 B2");
    assert_eq!(run(3, one), "F0 B0 F1 B1 F2 B2");
    assert_eq!(run(3, Warmup::Double), "F0 B0 F1 B1 F2 B2");
    assert_eq!(run(2, Warmup::Double), "F0 F1 F2 B0 B1 B2");
    assert_eq!(run(3, Warmup::Full), "F0 F1 F2 B0 B1 B2");
}

#[test]
fn two_microbatches_in_counter_flow_never_collide() {
    // One microbatch per route at P = 4, F = 1, B = 2: each route's critical path, 4 x 3.
    let plan = dual_plan(4, 2, 1.0, 2.0);
    let orders = best(&plan, false, None, None).unwrap();
    let plan = plan.with_orders(orders).unwrap();
    assert!(verify(&plan).is_ok());
    assert_eq!(simulate(&plan).unwrap().makespan(), 12.0);
}

#[test]
fn every_variant_schedules_every_op() {
    for (p, m) in [(2, 2), (2, 3), (4, 5), (6, 7), (8, 9)] {
        let plan = dual_plan(p, m, 1.0, 2.0);
        let split = plan
            .clone()
            .with_facts(Facts {
                backwards: Backwards::Split,
                ..plan.facts()
            })
            .unwrap();
        for variant in variants(true) {
            let orders = schedule(&split, variant, f64::INFINITY).unwrap();
            let done = split.clone().with_orders(orders).unwrap();
            assert!(verify(&done).is_ok(), "P={p} M={m} {variant:?}");
        }
    }
}

#[test]
fn a_bound_no_variant_meets_gives_none() {
    let plan = dual_plan(4, 3, 1.0, 2.0);
    assert!(best(&plan, false, Some(1.0), None).is_none());
    assert!(best(&plan, false, None, Some(0.5)).is_none());
}
