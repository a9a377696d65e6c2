//! The MPI backend (cargo feature `mpi`): one process per rank, started by `mpirun -np P`; every
//! process runs its own rank's checked program ([`crate::CheckedRank`]) with the one interpreter
//! ([`crate::interpreter::run_rank`]) over an [`MpiTransport`]. Threads and MPI differ only in the
//! transport.
//!
//! # A communication group on MPI
//! [`Transport::exchange`] gets one group of the program (batched semantics, certified by the
//! checker):
//! - every send becomes one `MPI_Isend` of one buffer (header and payload, see [`wire`]) that the
//!   transport owns; the send is *not* waited for at the end of the group: its buffer stays alive
//!   until the request completes, which [`Transport::finish`] waits for at the end of the program
//!   (completed sends are reaped, and their buffers freed, at every later group);
//! - every receive is matched with `MPI_Improbe` on its peer and then received with one
//!   `MPI_Imrecv` into a buffer of the size the probe reports: no size message travels, and the
//!   payload's size is whatever its sender sent; the group returns when every receive has completed
//!   (tested in a polling loop, see *Failures and timeouts*).
//!
//! All messages use one tag on a private duplicate of the caller's communicator, so they match
//! nothing else of the application. MPI does not let messages from one sender on one communicator
//! and tag overtake each other, and the transport matches the receives from one peer in program
//! order (within a group, in the group's order), so the k-th send from rank a to rank b meets the
//! k-th receive of rank b from rank a, which is what the checker certifies.
//!
//! # The header
//! Each message starts with a header (magic, direction, producing and consuming stage,
//! microbatch, shape slot, element type, shape; [`wire`] has the layout). A receive compares it
//! with the message its program expects: another message is [`TransportFailure::Unexpected`]
//! naming both; another element type or shape than the payload type expects, or a length that
//! does not fit the shape, is [`TransportFailure::Broken`] naming both shapes. Bytes are never
//! reinterpreted. Payloads implement [`WirePayload`] (here `f64`; a tensor type the same way).
//!
//! # The fingerprint
//! Before anything runs, [`run_mpi`] hashes the problem (sizes, placement, routes, tied stages)
//! and the serialised programs (64-bit FNV-1a of their JSON, so it does not depend on the build)
//! and all-gathers the hashes: if any rank's differs from rank 0's, every rank returns the same
//! error naming the ranks that differ, and nothing runs. So does a world whose size is not the
//! programs' rank count; programs that fail the checker never get here (only a
//! [`CheckedPrograms`] is accepted). A rank whose compute lacks a residency capability its program
//! needs refuses before its first instruction ([`BackendError::Unsupported`]) and, like any
//! failing rank, aborts the job.
//!
//! # Failures and timeouts
//! A rank whose own run fails (its stage returns an error or panics, a message is wrong, a receive
//! times out) prints the error with the instruction it stopped at on stderr and calls `MPI_Abort`
//! on its communicator (Open MPI ends the whole job), so no other rank waits forever; `mpirun`
//! exits with status [`FAILURE_STATUS`]. Receives never
//! block in MPI: the transport polls (`MPI_Improbe`, `MPI_Test`), back to back at first, then
//! yielding the processor, and after 10 ms of waiting sleeping briefly between polls; when none of a group's receives has progressed for longer than
//! [`MpiOptions::receive_timeout`], the group fails with [`TransportFailure::Timeout`] for its
//! first receive still missing: before it fails, the rank asks every other rank where it stands
//! ([`report`]: each waiting rank answers with its instruction and the message it waits for; a
//! rank that computes, stalls or is gone does not answer) and the failure is
//! [`TransportFailure::Stalled`] with who waits on whom. `finish` gives the sends the same limit. Operations still in flight when a run is abandoned
//! keep their buffers (leaked rather than freed under MPI's feet). MPI's own errors go to its
//! default handler, which ends the job.
//!
//! A process killed from outside (SIGKILL, a lost node) is left to `mpirun`, which ends the job.
//! Data parallelism (a communicator per pipeline, the gradient reduction) is the caller's: it
//! passes any communicator (e.g. one split from the world), sets up the programs once with
//! [`agree_on_programs`] (which returns this rank's [`crate::CheckedRank`]), runs it with
//! [`crate::interpreter::run_rank`] over an
//! [`MpiTransport`] (or its own transport around one) and exchanges its own messages through a
//! [`Mailbox`] (a [`SharedMailbox`] where several threads of a process send and wait at once). [`run_mpi`] does all of it for one run of one program set.
//!
//! [`Transport::exchange`]: crate::Transport::exchange
//! [`Transport::finish`]: crate::Transport::finish
//! [`TransportFailure::Unexpected`]: crate::TransportFailure::Unexpected
//! [`TransportFailure::Broken`]: crate::TransportFailure::Broken
//! [`TransportFailure::Timeout`]: crate::TransportFailure::Timeout
//! [`TransportFailure::Stalled`]: crate::TransportFailure::Stalled

mod fingerprint;
mod inflight;
mod mailbox;
pub mod report;
mod shared;
mod transport;
pub mod wire;

pub use ::mpi as rsmpi;
pub use fingerprint::fingerprint;
pub use mailbox::Mailbox;
pub use shared::SharedMailbox;
pub use transport::{MpiTransport, FAILURE_STATUS};
pub use wire::{WireDType, WirePayload};

use crate::compute::StageCompute;
use crate::error::BackendError;
use crate::interpreter::{run_rank, CheckedRank};
use ::mpi::collective::CommunicatorCollectives;
use ::mpi::topology::{Communicator, SimpleCommunicator};
use fingerprint::compare_fingerprints;
use pipeweave_core::{CheckedPrograms, RankId, RankProgram};
use std::time::Duration;

/// Options of an MPI run.
#[derive(Clone, Copy, Debug)]
pub struct MpiOptions {
    /// How long a receive (and, at the end, a send) may wait before the run is declared stuck.
    pub receive_timeout: Duration,
}

impl Default for MpiOptions {
    fn default() -> Self {
        MpiOptions {
            receive_timeout: Duration::from_secs(60),
        }
    }
}

/// The instruction index an error names, when its message does not show the instruction.
fn failed_instruction(error: &BackendError) -> Option<usize> {
    match error {
        BackendError::Protocol { instr, .. }
        | BackendError::Transport { instr, .. }
        | BackendError::Aborted { instr, .. }
        | BackendError::Timeout { instr, .. } => Some(*instr),
        _ => None,
    }
}

/// The one-line report of a rank's failure, with the instruction it stopped at.
pub fn failure_report(error: &BackendError, program: &RankProgram) -> String {
    let at = failed_instruction(error).map(|i| match program.instrs.get(i) {
        Some(instr) => format!(" (instruction {i} is {instr})"),
        None => format!(" (instruction {i} is the end of the program)"),
    });
    format!(
        "error: {}{}; aborting the MPI job",
        error.to_string().replace('\n', " "),
        at.unwrap_or_default()
    )
}

/// Makes sure every rank of `comm` is about to run the same checked programs, and returns this
/// rank's checked program, borrowed from `checked` (collective: every rank calls it with the
/// programs it built and checked itself).
///
/// The fingerprints of the problem and the programs are all-gathered and compared, and the
/// communicator's size is compared with the programs' rank count; either failing returns the same
/// error on every rank.
pub fn agree_on_programs<'a>(
    comm: &SimpleCommunicator,
    checked: &'a CheckedPrograms,
) -> Result<CheckedRank<'a>, BackendError> {
    let (problem, programs) = (checked.problem(), checked.programs());
    // MPI ranks and sizes are non-negative `int`s.
    let rank = RankId::new(u32::try_from(comm.rank()).unwrap_or(0));
    let size = usize::try_from(comm.size()).unwrap_or(0);
    let before = |reason: String| BackendError::Program {
        rank,
        instr: 0,
        what: "before the program".to_string(),
        reason,
    };
    let own = fingerprint(problem, programs);
    let mut all = vec![0u64; size];
    comm.all_gather_into(&own, &mut all[..]);
    compare_fingerprints(&all).map_err(before)?;
    if programs.programs.len() != size {
        return Err(before(format!(
            "the programs are for {} ranks, but the MPI job has {size} processes (mpirun -np {})",
            programs.programs.len(),
            programs.programs.len()
        )));
    }
    checked
        .rank(rank)
        .ok_or_else(|| before(format!("the programs have none for rank {rank}")))
}

/// Runs this process's rank of the checked programs over `comm` (collective: every rank of
/// `comm` calls it with its own `compute` and the same programs).
///
/// First, on every rank alike: the fingerprints of the problem and the programs are all-gathered
/// and compared, and the world's size is compared with the programs' rank count; either failing
/// returns the same error on every rank, and nothing runs. Then the
/// rank's program runs to its end and `Ok(())` returns (the computed gradients are in `compute`).
/// If this rank's run fails (a refusal of its compute's capabilities included), the error is
/// printed on stderr and the whole job is aborted (`MPI_Abort` with [`FAILURE_STATUS`]): this
/// function does not return then.
pub fn run_mpi<C>(
    comm: &SimpleCommunicator,
    checked: &CheckedPrograms,
    compute: &mut C,
    options: MpiOptions,
) -> Result<(), BackendError>
where
    C: StageCompute,
    C::Tensor: WirePayload,
{
    let program = agree_on_programs(comm, checked)?;
    let mut transport = MpiTransport::new(comm, options.receive_timeout);
    match run_rank(program, compute, &mut transport) {
        Ok(()) => Ok(()),
        Err(error) => {
            eprintln!("{}", failure_report(&error, program.program()));
            transport.abort_world(FAILURE_STATUS)
        }
    }
}
