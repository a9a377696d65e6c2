//! The communication checker: an independent check of projected (or imported) rank programs.
//!
//! A set must first hold one program per rank of the problem, in rank order. Then the
//! invariants, checked in this order (the first one broken is the one reported):
//! 1. **Inputs received** (`dataflow`): every compute's inputs from other ranks were received
//!    earlier in its rank's program, every output another rank needs is sent after it is computed,
//!    every message crosses a real stage boundary of its microbatch's route and is sent once and
//!    received once, and every `WaitSend` follows its send.
//! 2. **Matching** (`dataflow`): for every ordered pair of ranks, the k-th send from one to the
//!    other carries the same message (direction, stages, microbatch, shape slot) as the k-th
//!    receive there, and every send and receive names a rank of the problem.
//! 3. **Blocking rendezvous** (`replay`, for program sets that claim it, see
//!    [`ProgramSet::semantics`]): executing every send and receive one at a time, each send
//!    completing only together with its receive, every rank runs to its end.
//! 4. **Batched** (`replay`): posting each group's sends and receives together and waiting for
//!    its receives (sends complete when received, by the end of the program at the latest), every
//!    rank runs to its end.
//! 5. **Rendezvous** (`replay`, for program sets that claim it: imported lowered files): with
//!    sends posting without blocking, receives blocking until their send is posted and every
//!    `WaitSend` blocking until its send's receive is posted (as a large NCCL send does), every
//!    rank runs to its end.
//! 6. **Parameter actions** (PyTorch's `UNSHARD`, `RESHARD`, `REDUCE_GRAD`, `WAIT_REDUCE_GRAD`):
//!    their order in each program follows the rules of [`crate::spmd::params`].
//! 7. **Activation residency** (`Drop`, `R`, `Offload`, `Reload`): their order in each program
//!    follows the rules of [`crate::spmd::residency`].
//! 8. **All-to-alls** (a mixture of experts' `IssueAllToAll`, `WaitAllToAll`): each issued one
//!    waited for exactly once, after its issue and before what needs its result, a task's
//!    in-span ones (an overlapped pair's four) inside its span: the rules of
//!    [`crate::spmd::all_to_all`].
//!
//! A set that completes under blocking semantics completes batched too: batching posts every
//! operation no later and waits on no more (the first operation a batched run never posted would
//! sit behind a receive whose send the blocking run posted before it). So for the sets that claim
//! blocking semantics, check 3 passing is check 4 passing; check 4 runs for the others.
//!
//! A program set that cannot finish is reported with the cycle of waiting ranks, e.g.
//! `rank 2 waits for recv-grad(stage 5, mb 3) from rank 3; rank 3 waits for ...`.
//!
//! The rooms: this file holds the entry points ([`check_programs`], [`simulate_comm`]);
//! `error` the reports ([`CommError`], [`Waiting`], [`CheckReport`]); `pairs` the numbering
//! of ordered rank pairs and messages both passes share; `dataflow` checks 1 and 2; `replay`
//! checks 3 to 5 and the cycle of waiting ranks.

mod dataflow;
mod error;
mod pairs;
mod replay;
#[cfg(test)]
mod tests;

pub use error::{CheckReport, CommError, Waiting};

use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::all_to_all::check_all_to_alls;
use crate::spmd::params::check_params;
use crate::spmd::program::{ProgramSet, Semantics};
use crate::spmd::residency::check_residency;
use dataflow::check_dataflow;
use pairs::pair_counts;
use replay::CommReplay;

/// Runs every check of the module doc.
///
/// The programs are read twice: once for check 1, which also counts each ordered pair's sends
/// and receives, and once to number those in a [`CommReplay`], which checks 2 to 5 then use
/// without going back to the programs.
pub fn check_programs(problem: &Problem, set: &ProgramSet) -> Result<CheckReport, CommError> {
    let ranks = problem.ranks() as usize;
    if set.programs.len() != ranks {
        return Err(CommError::RankCount {
            got: set.programs.len(),
            expected: ranks,
        });
    }
    check_numbering(set)?;
    let traffic = check_dataflow(problem, set)?;
    let counts = traffic.counts?;
    let replay = CommReplay::new(set, &counts, Some(OpSlots::of(problem)));
    let messages = replay.check_matching()?;
    if set.semantics != Semantics::Batched {
        replay.run(set.semantics)?;
    }
    if set.semantics != Semantics::Blocking {
        replay.run(Semantics::Batched)?;
    }
    let params = check_params(problem, set).map_err(|(rank, instr, fault)| CommError::Params {
        rank,
        instr,
        fault,
    })?;
    check_residency(problem, set).map_err(|(rank, instr, fault)| CommError::Residency {
        rank,
        instr,
        fault,
    })?;
    check_all_to_alls(problem, set).map_err(|(rank, instr, fault)| CommError::AllToAll {
        rank,
        instr,
        fault,
    })?;
    Ok(CheckReport {
        messages,
        groups: traffic.groups,
        params,
    })
}

/// Checks 3 to 5 alone: runs the programs' communication under `semantics`. Peers out of range
/// are ignored here (check 2 reports them).
pub fn simulate_comm(set: &ProgramSet, semantics: Semantics) -> Result<(), CommError> {
    check_numbering(set)?;
    let (counts, _) = pair_counts(set);
    CommReplay::new(set, &counts, None).run(semantics)
}

/// Program `i` must be rank `i`'s.
fn check_numbering(set: &ProgramSet) -> Result<(), CommError> {
    match set
        .programs
        .iter()
        .enumerate()
        .find(|(i, p)| p.rank.index() != *i)
    {
        Some((index, p)) => Err(CommError::Misnumbered {
            index,
            rank: p.rank,
        }),
        None => Ok(()),
    }
}
