//! [`ParamFault`]: what is wrong with the order of a program's parameter actions, and its message.

use crate::ir::ids::StageId;
use crate::ir::op::Task;
use crate::spmd::program::ParamAction;
use std::fmt;

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
