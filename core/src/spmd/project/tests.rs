//! Unit tests of the projection: where receives sit under each policy, forward-only programs,
//! and the verifier's violations for a plan that cannot be projected.

use super::{project, ProjectionOptions, RecvPolicy};
use crate::ir::plan::Plan;
use crate::spmd::program::{Instr, ProgramSet, RankProgram, Semantics};

/// 1F1B on two ranks and two microbatches.
fn one_f_one_b() -> Plan {
    crate::testing::plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"])
}

/// `plan` projected with receives placed by `recv`, forward-only or not.
fn projected(plan: &Plan, recv: RecvPolicy, forward_only: bool) -> ProgramSet {
    project(plan, ProjectionOptions { recv, forward_only }).unwrap()
}

fn text(program: &RankProgram) -> Vec<String> {
    program.instrs.iter().map(Instr::to_string).collect()
}

#[test]
fn early_receives_sit_where_the_message_is_produced() {
    let set = project(&one_f_one_b(), ProjectionOptions::default()).unwrap();
    assert_eq!(set.semantics, Semantics::Blocking);
    assert_eq!(
        text(&set.programs[1]),
        [
            "[recv-act(stage 1, mb 0) from rank 0]",
            "unshard(stage 1)",
            "1F0",
            "loss(stage 1, mb 0)",
            "[recv-act(stage 1, mb 1) from rank 0]",
            "1B0",
            "[send-grad(stage 1, mb 0) to rank 0]",
            "1F1",
            "loss(stage 1, mb 1)",
            "grad-sync(stage 1)",
            "1B1",
            "[send-grad(stage 1, mb 1) to rank 0]",
            "reduce-grad(stage 1)",
            "wait-reduce-grad(stage 1)",
            "reshard(stage 1)",
            "flush-weight-grads",
        ]
    );
    assert!(text(&set.programs[0]).contains(&"free-output(stage 0, mb 0)".to_string()));
}

#[test]
fn just_in_time_receives_sit_before_their_consumer() {
    let set = projected(&one_f_one_b(), RecvPolicy::JustInTime, false);
    assert_eq!(set.semantics, Semantics::Batched);
    let rank1 = text(&set.programs[1]);
    let position = |s: &str| rank1.iter().position(|i| i.contains(s)).unwrap();
    assert_eq!(
        position("recv-act(stage 1, mb 1) from rank 0") + 1,
        position("1F1")
    );
}

#[test]
fn forward_only_programs_hold_forwards_and_losses() {
    let set = projected(&one_f_one_b(), RecvPolicy::Early, true);
    assert!(set.forward_only);
    let all: Vec<String> = set.programs.iter().flat_map(text).collect();
    assert!(
        all.iter().all(|i| !i.contains('B') && !i.contains("flush")),
        "{all:?}"
    );
    assert_eq!(all.iter().filter(|i| i.starts_with("loss")).count(), 2);
}

#[test]
fn forward_only_programs_of_a_residency_plan_run_no_residency() {
    let plan = crate::testing::plan(
        2,
        &["0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1R0 1B0 1F1 1B1"],
    );
    let set = projected(&plan, RecvPolicy::Early, true);
    let all: Vec<String> = set.programs.iter().flat_map(text).collect();
    assert!(
        all.iter()
            .all(|i| !i.contains("offload") && !i.contains("reload") && !i.contains('R')),
        "{all:?}"
    );
}

#[test]
fn an_incomplete_plan_is_rejected_with_the_verifiers_violations() {
    let plan = one_f_one_b();
    let mut orders = plan.orders().to_vec();
    orders[1].pop();
    let err = project(
        &plan.with_orders(orders).unwrap(),
        ProjectionOptions::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("1I1"), "{err}");
}

/// 1F1B on two ranks and three microbatches with an overlapped pair on rank 0, all-to-alls of
/// half a forward.
fn with_experts() -> Plan {
    use crate::ir::cost::StageCostsSpec;
    use crate::ir::memory::StageMemory;
    let costs = StageCostsSpec::builder()
        .a2a(0.5)
        .build()
        .validate()
        .unwrap();
    crate::testing::plan_on(
        crate::testing::problem(2, 3),
        costs,
        StageMemory::default(),
        &[
            "0F0 0F1 (0F2;0B0)OVERLAP_F_B 0B1 0B2",
            "1F0 1B0 1F1 1B1 1F2 1B2",
        ],
    )
}

#[test]
fn all_to_alls_sit_where_the_plan_runs_them() {
    let set = projected(&with_experts(), RecvPolicy::Early, false);
    // A forward's combine waited for under the next forward, before its send; the pair's four
    // slots; a backward's head issued when its gradient arrives.
    assert_eq!(
        text(&set.programs[0])[..34],
        [
            "unshard(stage 0)",
            "0F0",
            "issue-dispatch(stage 0, mb 0)",
            "wait-dispatch(stage 0, mb 0)",
            "issue-combine(stage 0, mb 0)",
            "0F1",
            "issue-dispatch(stage 0, mb 1)",
            "wait-dispatch(stage 0, mb 1)",
            "issue-combine(stage 0, mb 1)",
            "wait-combine(stage 0, mb 0)",
            "[send-act(stage 0, mb 0) to rank 1]",
            "free-output(stage 0, mb 0)",
            "wait-combine(stage 0, mb 1)",
            "[send-act(stage 0, mb 1) to rank 1, recv-grad(stage 0, mb 0) from rank 1]",
            "free-output(stage 0, mb 1)",
            "(0F2;0B0)OVERLAP_F_B",
            "issue-combine-backward(stage 0, mb 0)",
            "wait-combine-backward(stage 0, mb 0)",
            "issue-dispatch(stage 0, mb 2)",
            "wait-dispatch(stage 0, mb 2)",
            "issue-dispatch-backward(stage 0, mb 0)",
            "wait-dispatch-backward(stage 0, mb 0)",
            "issue-combine(stage 0, mb 2)",
            "wait-combine(stage 0, mb 2)",
            "[send-act(stage 0, mb 2) to rank 1, recv-grad(stage 0, mb 1) from rank 1]",
            "free-output(stage 0, mb 2)",
            "issue-combine-backward(stage 0, mb 1)",
            "wait-combine-backward(stage 0, mb 1)",
            "0B1",
            "issue-dispatch-backward(stage 0, mb 1)",
            "wait-dispatch-backward(stage 0, mb 1)",
            "[recv-grad(stage 0, mb 2) from rank 1]",
            "issue-combine-backward(stage 0, mb 2)",
            "wait-combine-backward(stage 0, mb 2)",
        ]
    );
    // On the last stage the loss needs the combine at once; the loss starts the head.
    assert_eq!(
        text(&set.programs[1])[2..10],
        [
            "1F0",
            "issue-dispatch(stage 1, mb 0)",
            "wait-dispatch(stage 1, mb 0)",
            "issue-combine(stage 1, mb 0)",
            "wait-combine(stage 1, mb 0)",
            "loss(stage 1, mb 0)",
            "issue-combine-backward(stage 1, mb 0)",
            "[recv-act(stage 1, mb 1) from rank 0]",
        ]
    );
    // A gradient received just in time starts its head right before the backward.
    let late = projected(&with_experts(), RecvPolicy::JustInTime, false);
    let rank0 = text(&late.programs[0]);
    let at = |s: &str| rank0.iter().position(|i| i == s).unwrap();
    assert_eq!(
        at("[recv-grad(stage 0, mb 2) from rank 1]") + 1,
        at("issue-combine-backward(stage 0, mb 2)")
    );
    assert_eq!(at("wait-combine-backward(stage 0, mb 2)") + 2, at("0B2"));
    for set in [set, late] {
        crate::spmd::check::check_programs(with_experts().problem(), &set).unwrap();
    }
}
