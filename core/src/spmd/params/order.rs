//! The order check of a program set's parameter actions ([`check_params`], part of the
//! communication checker), by the order rules of [`crate::spmd::params`].

use super::fault::ParamFault;
use crate::ir::ids::{RankId, StageId};
use crate::ir::op::{OpKind, Task};
use crate::ir::problem::Problem;
use crate::spmd::program::{Instr, ParamAction, ProgramSet, RankProgram};
use smallvec::SmallVec;

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

/// Checks the order of every program's parameter actions (see [`crate::spmd::params`]).
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
