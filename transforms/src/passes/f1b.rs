//! `f1b`: one-forward-one-backward (PipeDream-Flush; Megatron-Core's
//! `forward_backward_pipelining_without_interleaving`).
//!
//! Rewrites each rank's GPipe order: rank `r` of `P` keeps `min(P - r - 1, M)` forwards as warm-up,
//! then alternates its next forward with its next backward, and ends with the remaining backwards.
//! Activations held on rank `r` peak at `min(P - r, M)` microbatches instead of GPipe's `M`.
//!
//! Requires: fill-drain pacing (the `gpipe` plan) on the linear layout (one stage per rank, stage
//! `s` on rank `s`, one route through all stages).
//! May change: the orders (each rank's forwards and backwards keep their own order) and the pacing
//! (to one-forward-one-backward).
//!
//! Before (`gpipe`) and after, 2 ranks and 3 microbatches at unit costs:
//! ```text
//! rank 0 | F0 F1 F2 .  .  .  B0 ~  B1 ~  B2 ~        rank 0 | F0 F1 .  .  B0 ~  F2 B1 ~  .  B2 ~
//! rank 1 | .  F0 F1 F2 B0 ~  B1 ~  B2 ~  .  .        rank 1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  .
//! ```

use super::repaced;
use crate::error::TransformError;
use crate::order::warmup_merge;
use crate::pass::{Changes, Contract, Pass, Requires};
use pipeweave_core::{LayoutKind, Pacing, Plan, Task};

/// The 1F1B pass, `f1b`.
#[derive(Clone, Copy, Debug, Default)]
pub struct F1b;

impl F1b {
    /// The pass's name: in expressions, the registry and errors.
    pub const NAME: &'static str = "f1b";
}

/// The warm-up of rank `rank` of `ranks` over sequences in `chunks` chunks (1: whole):
/// `P - r - 1` forwards, plus Seq1F1B's `k - 1` so that a microbatch's last chunk has run its
/// forward before its first backward (sail-sg's `P - r - 2 + k`).
pub(crate) fn warmup(ranks: usize, rank: usize, chunks: usize) -> usize {
    (ranks - rank - 1) + (chunks.max(1) - 1)
}

/// Every rank's order of `plan` rewritten to 1F1B: rank `r` of `P` keeps `P - r - 1` forwards as
/// warm-up (plus `k - 1` with `k` sequence chunks, Seq1F1B's, so that a microbatch's last chunk
/// has run its forward before its first backward), then alternates (see the module doc).
fn one_f_one_b(plan: &Plan) -> Vec<Vec<Task>> {
    let ranks = plan.problem().ranks() as usize;
    let chunks = plan.problem().seq_chunks() as usize;
    plan.orders()
        .iter()
        .enumerate()
        .map(|(r, order)| {
            let (forwards, backwards): (Vec<Task>, Vec<Task>) =
                order.iter().partition(|t| t.is_forward());
            warmup_merge(&forwards, &backwards, warmup(ranks, r, chunks))
        })
        .collect()
}

impl Pass for F1b {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        let requires = Requires::paced(&[Pacing::FillDrain])
            .on_layouts(&[LayoutKind::Linear])
            .with_whole_backwards();
        Contract::new(requires, Changes::PACING)
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let orders = one_f_one_b(&plan);
        repaced(Self::NAME, plan, orders, Pacing::OneForwardOneBackward)
    }
}
