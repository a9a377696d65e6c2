//! The verifier's tests: each invariant reported where it breaks, and the bounds on a report.

use super::*;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, OpKind};

fn plan(orders: [&str; 2]) -> Plan {
    crate::testing::plan(2, &orders)
}

fn check(orders: [&str; 2], expected: &[&str]) {
    let found: Vec<String> = violations(&plan(orders))
        .iter()
        .map(|v| v.to_string())
        .collect();
    assert_eq!(found, expected, "{orders:?}");
}

#[test]
fn each_invariant_is_reported_where_it_breaks() {
    check(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"], &[]);
    check(
        ["0F0 0F1 0B0 0B1 0F7", "1F0 1B0 1F1 1B1"],
        &["op 0F7 at position 4 on rank 0: microbatch 7 is out of range (the plan has 2 microbatches)"],
    );
    check(
        ["0F0 0F1 0B0 0B1 1F0", "1B0 1F1 1B1"],
        &["op 1F0 runs on rank 0, but stage 1 is placed on rank 1"],
    );
    check(
        ["0F0 0F1 0B0 0B1 0F1", "1F0 1B0 1F1 1B1"],
        &["op 0F1 (stage 0, microbatch 1) runs twice: on rank 0 and again on rank 0"],
    );
    check(
        ["0F0 0F1 0B0", "1F0 1B0 1F1 1B1"],
        &[
            "op 0I1 (stage 0, microbatch 1) is missing from rank 0",
            "op 0W1 (stage 0, microbatch 1) is missing from rank 0",
        ],
    );
    check(
        ["0F0 0F1 0W0 0I0 0B1", "1F0 1B0 1F1 1B1"],
        &["on rank 0, op 0W0 (stage 0) runs before 0I0, which it depends on"],
    );
    check(
        ["0F0 0B0 0F1 0B1", "1F1 1F0 1B0 1B1"],
        &["deadlock: rank 0 waits at task 1 (0B0) for 1I0 (stage 1, microbatch 0); rank 1 waits at task 0 (1F1) for 0F1 (stage 0, microbatch 1)"],
    );
}

#[test]
fn a_backward_overlapped_with_its_own_forward_is_rejected() {
    use crate::ir::op::{Task, Work};
    let plan = plan(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
    let mut orders = plan.orders().to_vec();
    let w = Work::new(1, 0);
    orders[1].splice(
        0..2,
        [Task::Overlapped {
            forward: w,
            backward: w,
        }],
    );
    let found = violations(&plan.with_orders(orders).unwrap());
    assert_eq!(
        found[0].to_string(),
        "task 0 on rank 1 overlaps the backward of stage 1 microbatch 0 with its own forward"
    );
}

#[test]
fn the_memory_bound_is_checked_by_verify_only() {
    let bounded = plan(["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"])
        .with_memory_limit(Some(1.5))
        .unwrap();
    assert!(verify_schedule(&bounded).is_ok());
    let err = verify(&bounded).unwrap_err();
    assert!(err.only_memory());
    assert_eq!(
        err.to_string(),
        "1 violation(s)\n  - rank 0 holds 2.0000 activations after 0F1 (stage 0), above the limit 1.5"
    );
}

#[test]
fn misplaced_recomputes_and_transfers_are_named() {
    let sound = ["0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1B0 1F1 1R1 1B1"];
    check(sound, &[]);
    check(
        ["0F0 0OFFLOAD0 0F1 0B0 0RELOAD0 0B1", "1F0 1B0 1F1 1B1"],
        &["task 0RELOAD0 at position 4 on rank 0: it comes after 0I0, the backward it must precede"],
    );
    check(
        ["0R0 0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"],
        &["task 0R0 at position 0 on rank 0: it comes before 0F0, the forward it follows"],
    );
    check(
        ["0F0 0OFFLOAD0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1 1R5 0R0"],
        &[
            "task 1R5 at position 4 on rank 1: microbatch 5 is out of range (the plan has 2 microbatches)",
            "task 0R0 at position 5 on rank 1: stage 0 is placed on rank 0",
            "task 0OFFLOAD0 at position 1 on rank 0: the pair is never reloaded",
        ],
    );
    check(
        [
            "0F0 0R0 0OFFLOAD0 0RELOAD0 0R0 0B0 0F1 0B1",
            "1F0 1B0 1F1 1B1",
        ],
        &[
            "task 0R0 at position 4 on rank 0: the pair is recomputed a second time",
            "task 0R0 at position 1 on rank 0: the pair is both recomputed and offloaded",
        ],
    );
    check(
        ["0F0 0RELOAD0 0OFFLOAD0 0B0 0F1 0B1", "1F0 1B0 1F1 1B1"],
        &["task 0RELOAD0 at position 1 on rank 0: it comes before the pair's offload"],
    );
}

#[test]
fn transfers_between_a_split_backward_s_halves_are_checked_like_the_others() {
    // Pair 0 moved out before its I and again between its I and W; pair 1 recomputed, then what
    // its W keeps moved out.
    let sound = [
        "0F0 0OFFLOAD0 0F1 0RELOAD0 0I0 0OFFLOAD0 0I1 0RELOAD0 0W0 0W1",
        "1F0 1I0 1F1 1R1 1I1 1OFFLOAD1 1W0 1RELOAD1 1W1",
    ];
    check(sound, &[]);
    check(
        ["0F0 0F1 0I0 0OFFLOAD0 0I1 0W0 0RELOAD0 0W1", "1F0 1B0 1F1 1B1"],
        &["task 0RELOAD0 at position 6 on rank 0: it comes after 0W0, the weight-gradient backward it must precede"],
    );
    check(
        [
            "0F0 0OFFLOAD0 0F1 0I0 0RELOAD0 0I1 0W0 0W1",
            "1F0 1B0 1F1 1B1",
        ],
        &[
            "task 0RELOAD0 at position 4 on rank 0: it comes after 0I0, the backward it must precede",
        ],
    );
    check(
        ["0F0 0F1 0B0 0OFFLOAD0 0RELOAD0 0B1", "1F0 1B0 1F1 1B1"],
        &[
            "task 0OFFLOAD0 at position 3 on rank 0: it comes after 0I0, the backward it must precede",
            "task 0RELOAD0 at position 4 on rank 0: it comes after 0I0, the backward it must precede",
        ],
    );
}

#[test]
fn recomputes_for_a_weight_gradient_sit_between_its_halves() {
    // Pair 0's W state recomputed (RW between 0I0 and 0W0), pair 1 recomputed before its I and
    // its W state again after it.
    check(
        [
            "0F0 0F1 0I0 0I1 0RW0 0W0 0W1",
            "1F0 1I0 1F1 1R1 1I1 1RW1 1W0 1W1",
        ],
        &[],
    );
    check(
        ["0F0 0F1 0RW0 0I0 0I1 0W0 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"],
        &["task 0RW0 at position 2 on rank 0: it comes before 0I0, the input-gradient backward it must follow"],
    );
    check(
        ["0F0 0F1 0B0 0RW0 0B1", "1F0 1B0 1F1 1B1"],
        &["task 0RW0 at position 3 on rank 0: 0I0 runs as one backward: there is no weight gradient to wait for"],
    );
    check(
        [
            "0F0 0F1 0I0 0OFFLOAD0 0RW0 0I1 0RELOAD0 0W0 0W1",
            "1F0 1I0 1F1 1I1 1W0 1W1",
        ],
        &["task 0RW0 at position 4 on rank 0: what the pair's W keeps is both recomputed and offloaded"],
    );
}

#[test]
fn a_plan_missing_almost_everything_lists_a_bounded_report() {
    let plan = crate::testing::plan(4000, &["0F0"]);
    let found = violations(&plan);
    assert_eq!(found.len(), MAX_LISTED + 1);
    assert_eq!(
        found[MAX_LISTED],
        Violation::Omitted {
            count: 4000 * 3 - 1 - MAX_LISTED
        }
    );
}

#[test]
fn long_reports_are_summarised() {
    let many = Violations(
        (0..20)
            .map(|m| Violation::Missing {
                op: Op::new(OpKind::Forward, 0.into(), m.into()),
                owner: RankId::new(0),
            })
            .collect(),
    );
    assert!(many.to_string().ends_with("... and 8 more"));
    assert!(!many.only_memory());
}
