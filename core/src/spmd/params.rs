//! PyTorch's per-stage parameter actions ([`ParamAction`]): where its lowering puts them, and the
//! rules their order in a rank program must follow.
//!
//! **Placement** ([`place`]), by the rules of `torch.distributed.pipelining`'s own lowering
//! (`_add_unshard_reshard` and `_add_reduce_grad` in its `schedules.py`, PyTorch 2.15 defaults),
//! on one rank's compute order:
//! - residency: before each compute, the stages "resident" from there on are the distinct stages
//!   of the next computes, whole computes at a time, until [`MAX_ACTIVE_STAGES`] are found (an
//!   overlapped compute brings both its stages). Stages resident before but not now are
//!   resharded, then resident stages not yet unsharded are unsharded, in order of their next use;
//!   after the last compute every stage still unsharded is resharded. So a rank holding at most
//!   three stages unshards them all up front and reshards each after its last compute;
//! - reductions: right after the compute holding a stage's last weight gradient on the rank (a
//!   W, a B or an overlapped F&B), `REDUCE_GRAD` then at once its `WAIT_REDUCE_GRAD`.
//!
//! Given PyTorch's compute-only form of the same order, its lowering puts these actions at the
//! same places among the computes (the real-PyTorch test compares the two).
//!
//! **Order** ([`check_params`], part of the communication checker), per rank program:
//! - an unshard finds the stage resharded and a reshard finds it unsharded; where any program of
//!   the set unshards, every compute needs its stages unsharded, and every stage is resharded by
//!   the end;
//! - a reduction follows the stage's last weight gradient on the rank: nothing computes on the
//!   stage after it, it happens once per stage, only one is pending at a time (PyTorch's runtime
//!   refuses a second), and each is waited for, by a wait naming its stage;
//! - where any program of the set reduces, every stage with weight gradients is reduced.
//!
//! A set without any of these actions is valid (PyTorch then neither scales nor reduces the
//! gradients): [`ParamUse`] says which kinds a set holds.

use crate::ir::ids::{RankId, StageId};
use crate::ir::op::{OpKind, Task};
use crate::ir::problem::Problem;
use crate::spmd::program::{Instr, ParamAction, ProgramSet, RankProgram};
use smallvec::SmallVec;
use std::fmt;

/// PyTorch's default `max_active_stages`: how many stages' parameters may be unsharded at once.
pub const MAX_ACTIVE_STAGES: usize = 3;

/// Where a placed action goes relative to its compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slot {
    /// Right before the compute (unshard, reshard).
    Before,
    /// Right after the compute and its sends (reductions).
    After,
}

/// One placed action: (index of the compute in the rank's order, slot, action, stage). Index
/// `tasks.len()` with [`Slot::Before`] is the end of the program.
pub type Placed = (usize, Slot, ParamAction, StageId);

/// The distinct stages of a task, in PyTorch's sub-action order (an overlap's forward first).
fn task_stages(task: &Task) -> SmallVec<[StageId; 2]> {
    let mut stages: SmallVec<[StageId; 2]> = SmallVec::new();
    for op in task.ops() {
        if !stages.contains(&op.stage) {
            stages.push(op.stage);
        }
    }
    stages
}

/// Per compute, the stages resident from it on: the distinct stages of the computes from it,
/// whole computes at a time, until `count` are found. Walked backwards with the stages ordered by
/// their next use (each compute moves its stages to the front).
fn resident_stages(tasks: &[Task], count: usize) -> Vec<SmallVec<[StageId; 4]>> {
    let mut by_next_use: Vec<(StageId, usize)> = Vec::new();
    let mut resident = vec![SmallVec::new(); tasks.len()];
    for (i, task) in tasks.iter().enumerate().rev() {
        let stages = task_stages(task);
        by_next_use.retain(|(s, _)| !stages.contains(s));
        for (k, &s) in stages.iter().enumerate() {
            by_next_use.insert(k, (s, i));
        }
        let here = &mut resident[i];
        let mut group = usize::MAX;
        for &(s, first) in &by_next_use {
            if here.len() >= count && first != group {
                break;
            }
            group = first;
            here.push(s);
        }
    }
    resident
}

/// The parameter actions of one rank's compute order (see the module doc), sorted by (compute,
/// slot). Forward-only orders get residency alone.
pub fn place(tasks: &[Task], forward_only: bool) -> Vec<Placed> {
    let mut placed = Vec::new();
    let resident = resident_stages(tasks, MAX_ACTIVE_STAGES);
    let last_weight = last_weight_tasks(tasks);
    let mut active: SmallVec<[StageId; 4]> = SmallVec::new();
    for (i, task) in tasks.iter().enumerate() {
        let now = &resident[i];
        for &s in active.iter().filter(|s| !now.contains(s)) {
            placed.push((i, Slot::Before, ParamAction::Reshard, s));
        }
        active.retain(|s| now.contains(s));
        for &s in now {
            if !active.contains(&s) {
                active.push(s);
                placed.push((i, Slot::Before, ParamAction::Unshard, s));
            }
        }
        if forward_only {
            continue;
        }
        let _ = task.try_for_each_op(|op| {
            let last = last_weight.iter().any(|&(s, at)| s == op.stage && at == i);
            if op.kind == OpKind::WeightGrad && last {
                placed.push((i, Slot::After, ParamAction::ReduceGrad, op.stage));
                placed.push((i, Slot::After, ParamAction::WaitReduceGrad, op.stage));
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
    }
    for &s in &active {
        placed.push((tasks.len(), Slot::Before, ParamAction::Reshard, s));
    }
    placed
}

/// Per stage with weight gradients on the rank, the index of its last compute holding one.
fn last_weight_tasks(tasks: &[Task]) -> SmallVec<[(StageId, usize); 4]> {
    let mut last: SmallVec<[(StageId, usize); 4]> = SmallVec::new();
    for (i, task) in tasks.iter().enumerate() {
        for op in task.ops().iter().filter(|o| o.kind == OpKind::WeightGrad) {
            match last.iter_mut().find(|(s, _)| *s == op.stage) {
                Some(entry) => entry.1 = i,
                None => last.push((op.stage, i)),
            }
        }
    }
    last
}

/// What is wrong with the order of a program's parameter actions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParamFault {
    /// The action names a stage another rank holds.
    NotOnRank {
        /// The action.
        action: ParamAction,
        /// The stage.
        stage: StageId,
    },
    /// An unshard of a stage already unsharded.
    UnshardedTwice {
        /// The stage.
        stage: StageId,
    },
    /// A reshard of a stage that is not unsharded.
    ReshardWithoutUnshard {
        /// The stage.
        stage: StageId,
    },
    /// A compute on a stage whose parameters are sharded.
    ComputeOnSharded {
        /// The compute.
        task: Task,
        /// The sharded stage.
        stage: StageId,
    },
    /// A compute on a stage whose gradients were already reduced.
    ComputeAfterReduction {
        /// The compute.
        task: Task,
        /// The stage.
        stage: StageId,
        /// The instruction of the reduction.
        reduced_at: usize,
    },
    /// A reduction of a stage without weight gradients on the rank before it.
    ReductionWithoutGradients {
        /// The stage.
        stage: StageId,
    },
    /// A second reduction of one stage.
    ReducedTwice {
        /// The stage.
        stage: StageId,
    },
    /// A reduction started while another is pending.
    ReductionPending {
        /// The stage whose reduction starts.
        stage: StageId,
        /// The stage whose reduction is pending.
        pending: StageId,
    },
    /// A wait on a reduction that is not the pending one.
    WaitWithoutReduction {
        /// The stage waited for.
        stage: StageId,
        /// The pending reduction, if any.
        pending: Option<StageId>,
    },
    /// A reduction never waited for.
    NeverWaited {
        /// The stage.
        stage: StageId,
    },
    /// A stage still unsharded at the end.
    NeverResharded {
        /// The stage.
        stage: StageId,
    },
    /// A stage with weight gradients that is never reduced, where the set reduces others.
    NeverReduced {
        /// The stage.
        stage: StageId,
    },
}

impl fmt::Display for ParamFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParamFault::NotOnRank { action, stage } => write!(
                f,
                "{stage}{} names stage {stage}, which this rank does not hold",
                action.pytorch_name()
            ),
            ParamFault::UnshardedTwice { stage } => {
                write!(f, "unshards stage {stage}, which is unsharded already")
            }
            ParamFault::ReshardWithoutUnshard { stage } => {
                write!(f, "reshards stage {stage}, which is not unsharded")
            }
            ParamFault::ComputeOnSharded { task, stage } => write!(
                f,
                "{task} computes on stage {stage}, whose parameters are sharded (no UNSHARD \
                 before it; PyTorch's runtime refuses to compute on a sharded stage)"
            ),
            ParamFault::ComputeAfterReduction {
                task,
                stage,
                reduced_at,
            } => write!(
                f,
                "{task} computes on stage {stage} after its gradients were reduced at \
                 instruction {reduced_at} (a reduction follows the stage's last weight gradient)"
            ),
            ParamFault::ReductionWithoutGradients { stage } => write!(
                f,
                "reduces stage {stage}'s gradients before any weight gradient of it on this rank"
            ),
            ParamFault::ReducedTwice { stage } => {
                write!(f, "reduces stage {stage}'s gradients a second time")
            }
            ParamFault::ReductionPending { stage, pending } => write!(
                f,
                "starts reducing stage {stage} while stage {pending}'s reduction is pending \
                 (PyTorch's runtime allows one at a time: WAIT_REDUCE_GRAD first)"
            ),
            ParamFault::WaitWithoutReduction { stage, pending } => match pending {
                Some(p) => write!(
                    f,
                    "waits for stage {stage}'s reduction, but stage {p}'s is the pending one"
                ),
                None => write!(
                    f,
                    "waits for stage {stage}'s reduction, which is not pending"
                ),
            },
            ParamFault::NeverWaited { stage } => write!(
                f,
                "stage {stage}'s reduction is never waited for (no WAIT_REDUCE_GRAD)"
            ),
            ParamFault::NeverResharded { stage } => {
                write!(
                    f,
                    "stage {stage} is still unsharded at the end (no RESHARD)"
                )
            }
            ParamFault::NeverReduced { stage } => write!(
                f,
                "stage {stage}'s gradients are never reduced (no REDUCE_GRAD), though other \
                 stages' are: PyTorch would leave them unscaled"
            ),
        }
    }
}

/// Which kinds of parameter action a checked set holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ParamUse {
    /// Unshards and reshards (FSDP residency).
    pub residency: bool,
    /// Gradient reductions.
    pub reductions: bool,
}

/// A fault with where it is: (rank, instruction index or None for the end of the program).
pub type Located = (RankId, Option<usize>, ParamFault);

/// Checks the order of every program's parameter actions (see the module doc).
pub fn check_params(problem: &Problem, set: &ProgramSet) -> Result<ParamUse, Located> {
    let holds = |action: ParamAction| {
        set.programs.iter().flat_map(|p| &p.instrs).any(
            |i| matches!(i, Instr::Params { action: a, .. } if ParamAction::same_kind(*a, action)),
        )
    };
    let uses = ParamUse {
        residency: holds(ParamAction::Unshard),
        reductions: holds(ParamAction::ReduceGrad),
    };
    for program in &set.programs {
        check_program(problem, program, uses)?;
    }
    Ok(uses)
}

impl ParamAction {
    /// Whether two actions are of one kind: residency (unshard, reshard) or reduction.
    fn same_kind(a: ParamAction, b: ParamAction) -> bool {
        let residency = |x| matches!(x, ParamAction::Unshard | ParamAction::Reshard);
        residency(a) == residency(b)
    }
}

/// One program's parameter state while it is walked.
#[derive(Default)]
struct Walk {
    unsharded: SmallVec<[StageId; 4]>,
    /// Stages with a weight gradient so far.
    weighted: SmallVec<[StageId; 4]>,
    /// Stages reduced, with the instruction.
    reduced: SmallVec<[(StageId, usize); 4]>,
    pending: Option<StageId>,
}

fn check_program(problem: &Problem, program: &RankProgram, uses: ParamUse) -> Result<(), Located> {
    let rank = program.rank;
    let mut walk = Walk::default();
    for (i, instr) in program.instrs.iter().enumerate() {
        let fault = |fault| (rank, Some(i), fault);
        match *instr {
            Instr::Params { action, stage } => {
                if problem.rank_of(stage) != Some(rank) {
                    return Err(fault(ParamFault::NotOnRank { action, stage }));
                }
                walk.param(action, stage, i).map_err(fault)?;
            }
            Instr::Compute(task) => walk.compute(task, uses).map_err(fault)?,
            _ => {}
        }
    }
    let end = |fault| (rank, None, fault);
    if let Some(stage) = walk.pending {
        return Err(end(ParamFault::NeverWaited { stage }));
    }
    if let Some(&stage) = walk.unsharded.first() {
        return Err(end(ParamFault::NeverResharded { stage }));
    }
    if uses.reductions {
        let unreduced = walk
            .weighted
            .iter()
            .find(|s| !walk.reduced.iter().any(|(r, _)| r == *s));
        if let Some(&stage) = unreduced {
            return Err(end(ParamFault::NeverReduced { stage }));
        }
    }
    Ok(())
}

impl Walk {
    fn param(&mut self, action: ParamAction, stage: StageId, at: usize) -> Result<(), ParamFault> {
        match action {
            ParamAction::Unshard => {
                if self.unsharded.contains(&stage) {
                    return Err(ParamFault::UnshardedTwice { stage });
                }
                self.unsharded.push(stage);
            }
            ParamAction::Reshard => {
                let Some(k) = self.unsharded.iter().position(|&s| s == stage) else {
                    return Err(ParamFault::ReshardWithoutUnshard { stage });
                };
                self.unsharded.remove(k);
            }
            ParamAction::ReduceGrad => {
                if let Some(pending) = self.pending {
                    return Err(ParamFault::ReductionPending { stage, pending });
                }
                if self.reduced.iter().any(|(s, _)| *s == stage) {
                    return Err(ParamFault::ReducedTwice { stage });
                }
                if !self.weighted.contains(&stage) {
                    return Err(ParamFault::ReductionWithoutGradients { stage });
                }
                self.reduced.push((stage, at));
                self.pending = Some(stage);
            }
            ParamAction::WaitReduceGrad => {
                if self.pending != Some(stage) {
                    return Err(ParamFault::WaitWithoutReduction {
                        stage,
                        pending: self.pending,
                    });
                }
                self.pending = None;
            }
        }
        Ok(())
    }

    fn compute(&mut self, task: Task, uses: ParamUse) -> Result<(), ParamFault> {
        for op in task.ops() {
            let stage = op.stage;
            if uses.residency && !self.unsharded.contains(&stage) {
                return Err(ParamFault::ComputeOnSharded { task, stage });
            }
            if let Some(&(_, reduced_at)) = self.reduced.iter().find(|(s, _)| *s == stage) {
                return Err(ParamFault::ComputeAfterReduction {
                    task,
                    stage,
                    reduced_at,
                });
            }
            if op.kind == OpKind::WeightGrad && !self.weighted.contains(&stage) {
                self.weighted.push(stage);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spmd::check::{check_programs, CommError};
    use crate::spmd::project::{project, ProjectionOptions};
    use crate::testing::{plan, tasks};

    fn show(placed: &[Placed]) -> Vec<String> {
        placed
            .iter()
            .map(|&(i, slot, action, stage)| {
                format!("{i}{slot:?}:{stage}{}", action.pytorch_name())
            })
            .collect()
    }

    #[test]
    fn a_rank_with_two_stages_unshards_both_first_and_reshards_each_after_its_last_compute() {
        // DualPipeV's rank 0 at P=2, M=2: stage 3's last compute comes before stage 0's.
        let order = tasks("0F0 0F1 3F0 3B0 3F1 3B1 0B0 0B1");
        assert_eq!(
            show(&place(&order, false)),
            [
                "0Before:0UNSHARD",
                "0Before:3UNSHARD",
                "5After:3REDUCE_GRAD",
                "5After:3WAIT_REDUCE_GRAD",
                "6Before:3RESHARD",
                "7After:0REDUCE_GRAD",
                "7After:0WAIT_REDUCE_GRAD",
                "8Before:0RESHARD",
            ]
        );
    }

    #[test]
    fn more_than_three_stages_are_unsharded_three_at_a_time() {
        // Four chunks per rank (PyTorch's `_add_unshard_reshard` gives the same).
        let order = tasks("0F0 4F0 8F0 12F0 12B0 8B0 4B0 0B0");
        assert_eq!(
            show(&place(&order, true)),
            [
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
            ]
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
        let err = checked_after(|instrs| {
            instrs.remove(position(instrs, ParamAction::Unshard));
        })
        .unwrap_err();
        assert!(
            err.starts_with(
                "rank 1, instruction 1: 1F0 computes on stage 1, whose parameters are sharded"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_reduction_before_the_last_weight_gradient_is_named() {
        let err = checked_after(|instrs| {
            let at = position(instrs, ParamAction::ReduceGrad);
            let reduce = instrs.remove(at);
            let wait = instrs.remove(at);
            let first_b = instrs.iter().position(|i| i.to_string() == "1B0").unwrap();
            instrs.insert(first_b + 1, wait);
            instrs.insert(first_b + 1, reduce);
        })
        .unwrap_err();
        assert!(
            err.contains(
                "1F1 computes on stage 1 after its gradients were reduced at instruction 6"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_reduction_never_waited_for_or_waited_twice_is_named() {
        let err = checked_after(|instrs| {
            instrs.remove(position(instrs, ParamAction::WaitReduceGrad));
        })
        .unwrap_err();
        assert_eq!(
            err,
            "rank 1, end of program: stage 1's reduction is never waited for (no WAIT_REDUCE_GRAD)"
        );
        let err = checked_after(|instrs| {
            let at = position(instrs, ParamAction::WaitReduceGrad);
            let wait = instrs[at].clone();
            instrs.insert(at, wait);
        })
        .unwrap_err();
        assert!(
            err.contains("waits for stage 1's reduction, which is not pending"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_reduction_is_named_where_others_reduce_and_accepted_where_none_do() {
        let err = checked_after(|instrs| {
            let at = position(instrs, ParamAction::ReduceGrad);
            instrs.drain(at..at + 2);
        })
        .unwrap_err();
        assert!(
            err.contains("stage 1's gradients are never reduced (no REDUCE_GRAD)"),
            "{err}"
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
        let err = checked_after(|instrs| {
            instrs.insert(
                0,
                Instr::Params {
                    action: ParamAction::Unshard,
                    stage: StageId::new(0),
                },
            );
        })
        .unwrap_err();
        assert!(
            err.contains("0UNSHARD names stage 0, which this rank does not hold"),
            "{err}"
        );
    }
}
