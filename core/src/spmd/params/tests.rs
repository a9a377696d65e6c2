//! Unit tests of the parameter actions: PyTorch's placement on compute orders, and the order
//! faults the checker names in edited projected programs.

use super::place::resident_stages;
use super::{place, ParamUse};
use crate::ir::ids::StageId;
use crate::spmd::check::{check_programs, CommError};
use crate::spmd::program::{Instr, ParamAction};
use crate::spmd::project::{project, ProjectionOptions};
use crate::testing::{plan, tasks};

/// The actions [`place`] gives `order` (forward-only or not), each as
/// `<compute><slot>:<stage><action>`, are `expected`.
fn check(order: &str, forward_only: bool, expected: &[&str]) {
    let shown: Vec<String> = place(&tasks(order), forward_only)
        .iter()
        .map(|&(i, slot, action, stage)| format!("{i}{slot:?}:{stage}{}", action.pytorch_name()))
        .collect();
    assert_eq!(shown, expected, "{order}");
}

#[test]
fn a_rank_with_two_stages_unshards_both_first_and_reshards_each_after_its_last_compute() {
    // DualPipeV's rank 0 at P=2, M=2: stage 3's last compute comes before stage 0's.
    check(
        "0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1",
        false,
        &[
            "0Before:0UNSHARD",
            "0Before:3UNSHARD",
            "5After:3REDUCE_GRAD",
            "5After:3WAIT_REDUCE_GRAD",
            "6Before:3RESHARD",
            "7After:0REDUCE_GRAD",
            "7After:0WAIT_REDUCE_GRAD",
            "8Before:0RESHARD",
        ],
    );
}

#[test]
fn more_than_three_stages_are_unsharded_three_at_a_time() {
    // Four chunks per rank (PyTorch's `_add_unshard_reshard` gives the same).
    check(
        "0F0 4F0 8F0 12F0 12B0 8B0 4B0 0B0",
        true,
        &[
            "0Before:0UNSHARD",
            "0Before:4UNSHARD",
            "0Before:8UNSHARD",
            "1Before:0RESHARD",
            "1Before:12UNSHARD",
            "5Before:12RESHARD",
            "5Before:0UNSHARD",
            "6Before:8RESHARD",
            "7Before:4RESHARD",
            "8Before:0RESHARD",
        ],
    );
}

#[test]
fn an_overlapped_compute_brings_both_its_stages() {
    let order = tasks("(0F1;3B0)OVERLAP_F_B");
    let resident = resident_stages(&order, 1);
    assert_eq!(resident[0].as_slice(), [StageId::new(0), StageId::new(3)]);
}

#[test]
fn a_reduction_follows_the_last_weight_gradient_of_its_stage() {
    let order = tasks("1F0 1I0 1F1 1I1 1W0 1W1");
    let reduced: Vec<usize> = place(&order, false)
        .iter()
        .filter(|p| p.2 == ParamAction::ReduceGrad)
        .map(|p| p.0)
        .collect();
    assert_eq!(reduced, [5]);
}

/// 1F1B on two ranks and two microbatches, projected, with `edit` applied to rank 1's
/// program; the checker's finding on it.
fn checked_after(edit: impl FnOnce(&mut Vec<Instr>)) -> Result<ParamUse, String> {
    let plan = plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
    let mut set = project(&plan, ProjectionOptions::default()).unwrap();
    edit(&mut set.programs[1].instrs);
    check_programs(plan.problem(), &set)
        .map(|report| report.params)
        .map_err(|e| match e {
            CommError::Params { .. } => e.to_string(),
            other => panic!("not a parameter fault: {other}"),
        })
}

/// [`checked_after`] `edit` refuses the programs with a message containing `why`.
fn assert_refused_after(edit: impl FnOnce(&mut Vec<Instr>), why: &str) {
    let err = checked_after(edit).unwrap_err();
    assert!(err.contains(why), "{err}");
}

/// The edit that removes the first `action`.
fn removing(action: ParamAction) -> impl FnOnce(&mut Vec<Instr>) {
    move |instrs| {
        instrs.remove(position(instrs, action));
    }
}

fn position(instrs: &[Instr], action: ParamAction) -> usize {
    instrs
        .iter()
        .position(|i| matches!(i, Instr::Params { action: a, .. } if *a == action))
        .unwrap()
}

#[test]
fn projected_programs_hold_both_kinds_in_order() {
    let uses = checked_after(|_| {}).unwrap();
    assert!(uses.residency && uses.reductions);
}

#[test]
fn a_compute_on_a_sharded_stage_is_named() {
    let err = checked_after(removing(ParamAction::Unshard)).unwrap_err();
    assert!(
        err.starts_with(
            "rank 1, instruction 1: 1F0 computes on stage 1, whose parameters are sharded"
        ),
        "{err}"
    );
}

#[test]
fn a_reduction_before_the_last_weight_gradient_is_named() {
    assert_refused_after(
        |instrs| {
            let at = position(instrs, ParamAction::ReduceGrad);
            let reduce = instrs.remove(at);
            let wait = instrs.remove(at);
            let first_b = instrs.iter().position(|i| i.to_string() == "1B0").unwrap();
            instrs.insert(first_b + 1, wait);
            instrs.insert(first_b + 1, reduce);
        },
        "1F1 computes on stage 1 after its gradients were reduced at instruction 6",
    );
}

#[test]
fn a_reduction_never_waited_for_or_waited_twice_is_named() {
    let err = checked_after(removing(ParamAction::WaitReduceGrad)).unwrap_err();
    assert_eq!(
        err,
        "rank 1, end of program: stage 1's reduction is never waited for (no WAIT_REDUCE_GRAD)"
    );
    assert_refused_after(
        |instrs| {
            let at = position(instrs, ParamAction::WaitReduceGrad);
            let wait = instrs[at].clone();
            instrs.insert(at, wait);
        },
        "waits for stage 1's reduction, which is not pending",
    );
}

#[test]
fn a_missing_reduction_is_named_where_others_reduce_and_accepted_where_none_do() {
    assert_refused_after(
        |instrs| {
            let at = position(instrs, ParamAction::ReduceGrad);
            instrs.drain(at..at + 2);
        },
        "stage 1's gradients are never reduced (no REDUCE_GRAD)",
    );
    let plan = plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
    let mut set = project(&plan, ProjectionOptions::default()).unwrap();
    for program in &mut set.programs {
        program
            .instrs
            .retain(|i| !matches!(i, Instr::Params { .. }));
    }
    let report = check_programs(plan.problem(), &set).unwrap();
    assert_eq!(report.params, ParamUse::default());
}

#[test]
fn an_action_on_another_ranks_stage_is_named() {
    assert_refused_after(
        |instrs| {
            instrs.insert(
                0,
                Instr::Params {
                    action: ParamAction::Unshard,
                    stage: StageId::new(0),
                },
            );
        },
        "0UNSHARD names stage 0, which this rank does not hold",
    );
}
