//! Negative tests of the verifier: hand-broken plans are rejected with the right violation, named
//! by op, rank and stage.

use pipeweave::core_ir::{Backwards, Facts};
use pipeweave::{build_plan, verify, PipelineConfig, Plan, Task, Violation};

fn plan(expr: &str, ranks: u32, microbatches: u32) -> Plan {
    build_plan(expr, &PipelineConfig::new(ranks, microbatches).unwrap()).unwrap()
}

fn tasks(text: &str) -> Vec<Task> {
    text.split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect()
}

fn violations(plan: &Plan) -> Vec<Violation> {
    match verify(plan) {
        Err(v) => v.0,
        Ok(()) => panic!("expected violations, the plan verified"),
    }
}

/// The plan with hand-written orders; its facts allow split backwards, since some orders split them.
fn with_orders(base: &Plan, orders: &[&str]) -> Plan {
    let facts = Facts {
        backwards: Backwards::Split,
        ..base.facts()
    };
    base.clone()
        .with_facts(facts)
        .unwrap()
        .with_orders(orders.iter().map(|o| tasks(o)).collect())
        .unwrap()
}

/// The violations of 1F1B at 2 ranks and 2 microbatches with `orders` instead of its own.
fn violations_of(orders: &[&str]) -> Vec<Violation> {
    violations(&with_orders(&plan("f1b(gpipe)", 2, 2), orders))
}

/// [`violations_of`] `orders`, as text, are `expected`.
fn check(orders: &[&str], expected: &[&str]) {
    let text: Vec<String> = violations_of(orders)
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(text, expected, "{orders:?}");
}

#[test]
fn sound_plans_verify() {
    for expr in ["gpipe", "f1b(gpipe)", "vpp(f1b(gpipe), chunks=2)"] {
        verify(&plan(expr, 4, 8)).unwrap();
    }
}

#[test]
fn a_missing_op_is_named_with_its_owner() {
    check(
        &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1"],
        &[
            "op 1I1 (stage 1, microbatch 1) is missing from rank 1",
            "op 1W1 (stage 1, microbatch 1) is missing from rank 1",
        ],
    );
}

#[test]
fn a_duplicate_and_a_misplaced_op_are_named() {
    let duplicated = ["0F0 0F1 0B0 0B1 0F1", "1F0 1B0 1F1 1B1"];
    let v = violations_of(&duplicated);
    assert!(
        matches!(v.as_slice(), [Violation::Duplicate { .. }]),
        "{v:?}"
    );
    check(
        &duplicated,
        &["op 0F1 (stage 0, microbatch 1) runs twice: on rank 0 and again on rank 0"],
    );
    check(
        &["0F0 0F1 1F0 0B0 0B1", "1B0 1F1 1B1"],
        &["op 1F0 runs on rank 0, but stage 1 is placed on rank 1"],
    );
}

#[test]
fn out_of_range_ids_are_rejected() {
    check(
        &["0F0 0F1 0B0 0B1 0F9", "1F0 1B0 1F1 1B1 7F0"],
        &[
            "op 0F9 at position 4 on rank 0: microbatch 9 is out of range (the plan has 2 microbatches)",
            "op 7F0 at position 4 on rank 1: stage 7 is out of range (the plan has 2 stages)",
        ],
    );
}

#[test]
fn a_backward_before_its_forward_on_one_rank_breaks_dependency_order() {
    let v = violations_of(&["0F0 0F1 0B0 0B1", "1B0 1F0 1F1 1B1"]);
    assert_eq!(
        v[0].to_string(),
        "on rank 1, op 1I0 (stage 1) runs before 1F0, which it depends on"
    );
    let v = violations_of(&["0F0 0F1 0W0 0I0 0B1", "1F0 1B0 1F1 1B1"]);
    assert!(
        matches!(&v[..], [Violation::DependencyOrder { needs, .. }] if needs.to_string() == "0I0"),
        "{v:?}"
    );
}

#[test]
fn a_cross_rank_cycle_is_reported_with_every_waiting_rank() {
    let v = violations_of(&["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"]);
    let [Violation::Cycle(waits)] = v.as_slice() else {
        panic!("expected a cycle, got {v:?}")
    };
    assert_eq!(waits.len(), 2);
    assert_eq!(
        v[0].to_string(),
        "deadlock: rank 0 waits at task 1 (0B0) for 1I0 (stage 1, microbatch 0); \
         rank 1 waits at task 0 (1F1) for 0F1 (stage 0, microbatch 1)"
    );
}

#[test]
fn a_declared_memory_bound_is_enforced() {
    let gpipe = plan("gpipe", 2, 4).with_memory_limit(Some(2.0)).unwrap();
    let v = violations(&gpipe);
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!(
        v[0].to_string(),
        "rank 0 holds 4.0000 activations after 0F3 (stage 0), above the limit 2"
    );
    let f1b = plan("f1b(gpipe)", 2, 4)
        .with_memory_limit(Some(2.0))
        .unwrap();
    verify(&f1b).unwrap();
    assert!(plan("gpipe", 2, 4).with_memory_limit(Some(-1.0)).is_err());
}
