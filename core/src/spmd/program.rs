//! Per-rank SPMD programs: what one rank executes, projected from a global plan.
//!
//! A [`RankProgram`] is a list of [`Instr`]: compute tasks, the loss on the last stage of a
//! route, groups of sends and receives posted together ([`CommGroup`], like PyTorch's
//! `batch_isend_irecv`), and markers for the executor: free an output once it is sent, fire the
//! data-parallel gradient sync of a stage, flush the remaining weight gradients at the end.
//! [`Instr::Params`] are PyTorch's per-stage parameter actions, which its runtime acts on and
//! ours pass by: FSDP's unshard before a stage's computes and reshard after them, and the
//! reduction of a stage's gradients (scaled by 1/M, reduced over data parallelism) after its last
//! weight gradient, with the wait on it.
//! The activation-residency instructions carry out a plan's `recompute` and `offload` decisions:
//! [`Instr::Drop`] after a forward whose activations are recomputed later (keep the stage input
//! only; the recompute itself is a compute, `R`), [`Instr::Offload`] and [`Instr::Reload`] moving a
//! forward's saved activations to host memory and back.
//! A mixture of experts' all-to-alls ([`Instr::IssueAllToAll`], [`Instr::WaitAllToAll`]) are
//! collectives of the expert ranks that run one pipeline rank's program, placed as the plan places
//! them ([`crate::ir::all_to_all::TaskAllToAlls`]): a task's in-span all-to-alls (a forward's
//! dispatch, a backward's dispatch-backward, a recompute's, an overlapped pair's four slots)
//! directly after its `Compute`, each issued and waited for in the order its parts run them,
//! then a forward's combine issued; that combine waited for before what needs the forward's
//! output (the send of its activation, its loss, a compute on this rank that reads it); a
//! backward's combine-backward issued once its output gradient is there and waited for before
//! its compute. Programs of plans without all-to-all costs have none.
//! A [`Message`] names what travels: an activation or a gradient of one microbatch across one stage
//! boundary, with the tensor-shape slot of that boundary.

use crate::ir::all_to_all::AllToAll;
use crate::ir::ids::{MicrobatchId, RankId, StageId};
use crate::ir::op::{Op, OpKind, Task, Work};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How sends and receives complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Semantics {
    /// One at a time; a send completes only with its receive.
    Blocking,
    /// A group's operations are posted together; the rank goes on once the group's receives are
    /// matched, and its sends complete when the peers receive them (all by the end of the
    /// program), as with `batch_isend_irecv` and waiting on the receive requests.
    Batched,
    /// PyTorch's lowered programs: a send is posted without blocking, a receive blocks until its
    /// send is posted, and a [`Instr::WaitSend`] blocks until the send's receive is posted (a
    /// large NCCL send completes only then).
    Rendezvous,
}

impl fmt::Display for Semantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Semantics::Blocking => "blocking rendezvous",
            Semantics::Batched => "batched",
            Semantics::Rendezvous => "rendezvous (WAIT_SEND blocks)",
        })
    }
}

/// Which way a message goes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub enum Direction {
    /// A forward activation, to the next stage of the route.
    Activation,
    /// An input gradient, to the previous stage of the route.
    Gradient,
}

/// The shape slot of a stage boundary: activations leaving stage `s` and the gradients coming back
/// to it have one shape, named by slot `s`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ShapeSlot(u32);

impl ShapeSlot {
    /// The slot of the boundary after `stage`.
    pub fn after(stage: StageId) -> ShapeSlot {
        ShapeSlot(stage.get())
    }
    /// The raw value.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// One tensor crossing one stage boundary for one microbatch.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct Message {
    /// Activation or gradient.
    pub direction: Direction,
    /// The stage that produces it.
    pub from_stage: StageId,
    /// The stage that consumes it.
    pub to_stage: StageId,
    /// The microbatch.
    pub microbatch: MicrobatchId,
    /// The tensor-shape slot.
    pub slot: ShapeSlot,
}

impl Message {
    /// The activation `from -> to` of `microbatch`.
    pub fn activation(from: StageId, to: StageId, microbatch: MicrobatchId) -> Message {
        Message {
            direction: Direction::Activation,
            from_stage: from,
            to_stage: to,
            microbatch,
            slot: ShapeSlot::after(from),
        }
    }

    /// The gradient `from -> to` of `microbatch` (from the later stage back to the earlier).
    pub fn gradient(from: StageId, to: StageId, microbatch: MicrobatchId) -> Message {
        Message {
            direction: Direction::Gradient,
            from_stage: from,
            to_stage: to,
            microbatch,
            slot: ShapeSlot::after(to),
        }
    }

    /// What travels when `consumer` needs `dependency` from another stage: the activation of a
    /// forward, else the gradient of an input-gradient backward.
    pub fn carrying(dependency: Op, consumer: Op) -> Message {
        match dependency.kind {
            OpKind::Forward => {
                Message::activation(dependency.stage, consumer.stage, consumer.microbatch)
            }
            _ => Message::gradient(dependency.stage, consumer.stage, consumer.microbatch),
        }
    }

    /// The op whose result travels: F of the sending stage for an activation, I for a gradient.
    pub fn producer(&self) -> Op {
        let kind = match self.direction {
            Direction::Activation => OpKind::Forward,
            Direction::Gradient => OpKind::InputGrad,
        };
        Op::new(kind, self.from_stage, self.microbatch)
    }

    /// The work (stage, microbatch) on the sending side.
    pub fn source(&self) -> Work {
        Work {
            stage: self.from_stage,
            microbatch: self.microbatch,
        }
    }

    /// The work (stage, microbatch) on the receiving side.
    pub fn consumer(&self) -> Work {
        Work {
            stage: self.to_stage,
            microbatch: self.microbatch,
        }
    }
}

impl fmt::Display for Message {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.direction {
            Direction::Activation => "act",
            Direction::Gradient => "grad",
        };
        write!(
            f,
            "{what}(stage {} -> {}, mb {})",
            self.from_stage, self.to_stage, self.microbatch
        )
    }
}

/// One send or receive inside a group.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum CommOp {
    /// Send `message` to `to`.
    Send {
        /// The peer.
        to: RankId,
        /// What.
        message: Message,
    },
    /// Receive `message` from `from`.
    Recv {
        /// The peer.
        from: RankId,
        /// What.
        message: Message,
    },
}

impl CommOp {
    /// The peer rank.
    pub fn peer(&self) -> RankId {
        match *self {
            CommOp::Send { to, .. } => to,
            CommOp::Recv { from, .. } => from,
        }
    }
    /// The message.
    pub fn message(&self) -> Message {
        match *self {
            CommOp::Send { message, .. } | CommOp::Recv { message, .. } => message,
        }
    }
}

impl fmt::Display for CommOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // A send names the stage that sends, a receive the stage that receives.
        let (verb, stage, side, peer, message) = match *self {
            CommOp::Send { to, message } => ("send", message.from_stage, "to", to, message),
            CommOp::Recv { from, message } => ("recv", message.to_stage, "from", from, message),
        };
        let what = match message.direction {
            Direction::Activation => "act",
            Direction::Gradient => "grad",
        };
        write!(
            f,
            "{verb}-{what}(stage {stage}, mb {}) {side} rank {peer}",
            message.microbatch
        )
    }
}

/// Sends and receives posted together and waited for together.
#[derive(Clone, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub struct CommGroup {
    /// The operations, in posting order (a boxed slice: exactly sized, and an [`Instr`] of 24
    /// bytes instead of 32; build one from a `Vec` with `.into()`).
    pub ops: Box<[CommOp]>,
}

/// PyTorch's per-stage parameter and gradient actions (`UNSHARD`, `RESHARD`, `REDUCE_GRAD`,
/// `WAIT_REDUCE_GRAD` of its lowered schedules).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum ParamAction {
    /// Gather the stage's sharded parameters (FSDP): required before any compute on the stage.
    Unshard,
    /// Release the gathered parameters again: no compute on the stage until the next unshard.
    Reshard,
    /// Start the reduction of the stage's accumulated gradients: PyTorch's runtime scales them by
    /// 1/M here (and FSDP reduces them over data parallelism); after the stage's last weight
    /// gradient on the rank, once per step.
    ReduceGrad,
    /// Wait for the pending reduction of the stage (at most one is pending per rank).
    WaitReduceGrad,
}

impl ParamAction {
    /// Every action, in the order PyTorch lists them.
    pub const ALL: [ParamAction; 4] = [
        ParamAction::Unshard,
        ParamAction::Reshard,
        ParamAction::ReduceGrad,
        ParamAction::WaitReduceGrad,
    ];

    /// PyTorch's name of the action.
    pub fn pytorch_name(self) -> &'static str {
        match self {
            ParamAction::Unshard => "UNSHARD",
            ParamAction::Reshard => "RESHARD",
            ParamAction::ReduceGrad => "REDUCE_GRAD",
            ParamAction::WaitReduceGrad => "WAIT_REDUCE_GRAD",
        }
    }
}

/// One instruction of a rank program.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum Instr {
    /// Run a compute task.
    Compute(Task),
    /// Compute the loss of a microbatch on the last stage of its route (after its forward); its
    /// gradient starts that microbatch's backward.
    Loss(Work),
    /// Post a group of sends and receives and wait for all of them.
    Comm(CommGroup),
    /// The forward output of this work has been sent: its data may be freed (the autograd graph
    /// stays until the backward).
    FreeOutput(Work),
    /// The next compute is the last one producing weight gradients of this stage on this rank:
    /// enable the data-parallel gradient sync for it.
    GradSync(StageId),
    /// End of the step: flush weight gradients still pending.
    FlushWeightGrads,
    /// Wait until the earlier send of `message` to `to` has completed (its receive is posted);
    /// written by lowered schedule files (`WAIT_SEND_F`, `WAIT_SEND_B`).
    WaitSend {
        /// The peer.
        to: RankId,
        /// The message sent.
        message: Message,
    },
    /// A parameter action of PyTorch's runtime on one stage of the rank (see the module doc).
    Params {
        /// What.
        action: ParamAction,
        /// The stage.
        stage: StageId,
    },
    /// The forward of this work just ran and its activations are recomputed before its
    /// backward: keep only what the recompute needs (the stage input).
    Drop(Work),
    /// Move the saved activations of this work's forward to host memory (the rank's link).
    Offload(Work),
    /// Move the saved activations of this work's forward back from host memory.
    Reload(Work),
    /// Start an all-to-all of a mixture of experts on this rank's expert group (see the module
    /// doc for where it stands).
    IssueAllToAll(AllToAll),
    /// Wait until the all-to-all issued last with these fields has completed.
    WaitAllToAll(AllToAll),
}

impl fmt::Display for Instr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Instr::Compute(t) => write!(f, "{t}"),
            Instr::Loss(w) => write!(f, "loss(stage {}, mb {})", w.stage, w.microbatch),
            Instr::Comm(g) => {
                write!(f, "[")?;
                for (i, op) in g.ops.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{op}")?;
                }
                write!(f, "]")
            }
            Instr::FreeOutput(w) => {
                write!(f, "free-output(stage {}, mb {})", w.stage, w.microbatch)
            }
            Instr::GradSync(s) => write!(f, "grad-sync(stage {s})"),
            Instr::FlushWeightGrads => write!(f, "flush-weight-grads"),
            Instr::WaitSend { to, message } => write!(f, "wait-send({message} to rank {to})"),
            Instr::Params { action, stage } => {
                let name = match action {
                    ParamAction::Unshard => "unshard",
                    ParamAction::Reshard => "reshard",
                    ParamAction::ReduceGrad => "reduce-grad",
                    ParamAction::WaitReduceGrad => "wait-reduce-grad",
                };
                write!(f, "{name}(stage {stage})")
            }
            Instr::Drop(w) => write!(f, "drop(stage {}, mb {})", w.stage, w.microbatch),
            Instr::Offload(w) => write!(f, "offload(stage {}, mb {})", w.stage, w.microbatch),
            Instr::Reload(w) => write!(f, "reload(stage {}, mb {})", w.stage, w.microbatch),
            Instr::IssueAllToAll(a) => write!(f, "issue-{a}"),
            Instr::WaitAllToAll(a) => write!(f, "wait-{a}"),
        }
    }
}

/// The program of one rank.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct RankProgram {
    /// The rank.
    pub rank: RankId,
    /// Its instructions, in order.
    pub instrs: Vec<Instr>,
}

impl RankProgram {
    /// Number of compute instructions.
    pub fn compute_count(&self) -> usize {
        self.instrs
            .iter()
            .filter(|i| matches!(i, Instr::Compute(_)))
            .count()
    }
    /// Every send and receive in program order.
    pub fn comm_ops(&self) -> impl Iterator<Item = (usize, &CommOp)> {
        self.instrs.iter().enumerate().flat_map(|(i, instr)| {
            let ops: &[CommOp] = match instr {
                Instr::Comm(g) => &g.ops,
                _ => &[],
            };
            ops.iter().map(move |op| (i, op))
        })
    }
}

/// The programs of every rank.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct ProgramSet {
    /// One program per rank, in rank order.
    pub programs: Vec<RankProgram>,
    /// Whether the programs run the forward only (evaluation).
    pub forward_only: bool,
    /// The weakest communication semantics the programs must complete under: `Blocking` (each
    /// send and receive on its own, which implies batched groups work too) or `Batched` only.
    pub semantics: Semantics,
}

impl ProgramSet {
    /// Per rank, the most received tensors held at once before their computes consume them: the
    /// receive buffers the placement policy costs (early receives hold more than just-in-time).
    pub fn peak_receive_buffers(&self) -> Vec<usize> {
        self.programs
            .iter()
            .map(|program| {
                let mut held: Vec<Message> = Vec::new();
                let mut peak = 0;
                for instr in &program.instrs {
                    match instr {
                        Instr::Comm(group) => {
                            held.extend(group.ops.iter().filter_map(|op| match op {
                                CommOp::Recv { message, .. } => Some(*message),
                                CommOp::Send { .. } => None,
                            }));
                            peak = peak.max(held.len());
                        }
                        Instr::Compute(task) => {
                            let ops = task.ops();
                            held.retain(|m| {
                                !ops.iter().any(|op| {
                                    op.stage == m.to_stage && op.microbatch == m.microbatch
                                })
                            });
                        }
                        _ => {}
                    }
                }
                peak
            })
            .collect()
    }

    /// Total number of instructions, counting each send and receive of a group.
    pub fn instruction_count(&self) -> usize {
        self.programs
            .iter()
            .flat_map(|p| &p.instrs)
            .map(|i| match i {
                Instr::Comm(g) => g.ops.len(),
                _ => 1,
            })
            .sum()
    }
}
