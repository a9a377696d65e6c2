//! The built-in passes, one per file, each type named as its file and its expression name: the
//! schedules `gpipe` ([`Gpipe`]), `f1b` ([`F1b`]), `vpp` ([`Vpp`]), `dual` ([`Dual`]) and
//! `zero_bubble` ([`ZeroBubble`]), and `recompute` and `offload`, which decide where activations
//! live: one pass, [`Relief`], generic over its strategy ([`Recompute`], [`Offload`]), in
//! `relief.rs`; `offload(schedule, chunks=K)` is [`ChunkOffload`], PipeOffload's rule of whole
//! chunks in slots of the host link; `seq_split` ([`SeqSplit`]) cuts every microbatch's
//! sequence into chunks (Seq1F1B) and reschedules the plan over them. Each file's doc names its source schedule, its contract (the facts it requires,
//! what it may change), its preconditions, and shows a before/after grid. [`crate::builtins`]
//! registers them under their names.

pub mod chunk_offload;
pub mod dual;
pub mod f1b;
pub mod gpipe;
pub mod offload;
pub mod recompute;
pub mod relief;
pub mod seq_split;
pub mod vpp;
pub mod zero_bubble;

pub use chunk_offload::ChunkOffload;
pub use dual::Dual;
pub use f1b::F1b;
pub use gpipe::Gpipe;
pub use offload::Offload;
pub use recompute::{Recompute, WeightGrads};
pub use relief::{Relief, ReliefStrategy};
pub use seq_split::SeqSplit;
pub use vpp::{Vpp, VppOrder};
pub use zero_bubble::{Policy, ZeroBubble};

use crate::error::TransformError;
use pipeweave_core::{CostModel, Facts, Layout, MemoryModel, Pacing, Plan, Problem, Task};

/// Refuses a plan whose sequences `seq_split` cut into chunks already: `pass` rebuilds the
/// problem (placement, routes) or cuts again, so it comes before `seq_split`.
fn whole_sequences(pass: &str, plan: &Plan) -> Result<(), TransformError> {
    let chunks = plan.problem().seq_chunks();
    if chunks > 1 {
        return Err(TransformError::precondition(
            pass,
            "whole sequences (seq_split comes after it)",
            format!("the plan's sequences are split into {chunks} chunks already"),
        ));
    }
    Ok(())
}

/// `plan` with `orders`, which follow `pacing` (problem, models and the other facts kept): the
/// result of a pass that only reorders; errors blame `pass`.
fn repaced(
    pass: &str,
    plan: Plan,
    orders: Vec<Vec<Task>>,
    pacing: Pacing,
) -> Result<Plan, TransformError> {
    let facts = Facts {
        pacing,
        ..plan.facts()
    };
    plan.reshaped(None, orders, facts)
        .map_err(|e| TransformError::core(pass, e))
}

/// `plan` moved onto `shape` (a new problem with its models) and `layout`, with `orders` (the
/// other facts kept): the result of a pass that changes the placement; errors blame `context`.
fn relaid(
    context: &str,
    plan: Plan,
    shape: (Problem, CostModel, MemoryModel),
    layout: Layout,
    orders: Vec<Vec<Task>>,
) -> Result<Plan, TransformError> {
    let facts = Facts {
        layout,
        ..plan.facts()
    };
    plan.reshaped(Some(shape), orders, facts)
        .map_err(|e| TransformError::core(context, e))
}
