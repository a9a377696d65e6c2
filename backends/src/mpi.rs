//! The MPI backend (cargo feature `mpi`): one process per rank, started by `mpirun -np P`; every
//! process runs its own rank's program with the one interpreter ([`crate::interpreter::run_rank`])
//! over an [`MpiTransport`]. Threads and MPI differ only in the transport.
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
//! programs' rank count, and programs that fail the checker.
//!
//! # Failures and timeouts
//! A rank whose own run fails (its stage returns an error or panics, a message is wrong, a receive
//! times out) prints the error with the instruction it stopped at on stderr and calls `MPI_Abort`
//! on its communicator (Open MPI ends the whole job), so no other rank waits forever; `mpirun`
//! exits with status [`FAILURE_STATUS`]. Receives never
//! block in MPI: the transport polls (`MPI_Improbe`, `MPI_Test`), yielding and then sleeping
//! briefly between polls; when none of a group's receives has progressed for longer than
//! [`MpiOptions::receive_timeout`], the group fails with [`TransportFailure::Timeout`] for its
//! first receive still missing, reported as the rank, the instruction and the message it waits
//! for. `finish` gives the sends the same limit. Operations still in flight when a run is abandoned
//! keep their buffers (leaked rather than freed under MPI's feet). MPI's own errors go to its
//! default handler, which ends the job.
//!
//! Not handled here: a process killed from outside (SIGKILL, a lost node) is left to `mpirun`,
//! which ends the job; data parallelism (a communicator per pipeline, gradient all-reduce) is the
//! caller's, who may pass any communicator, e.g. one split from the world.

mod inflight;
pub mod wire;

pub use ::mpi as rsmpi;
pub use wire::{WireDType, WirePayload};

use crate::compute::StageCompute;
use crate::error::BackendError;
use crate::interpreter::run_rank;
use crate::transport::{Incoming, Outgoing, Transport, TransportFailure};
use ::mpi::collective::CommunicatorCollectives;
use ::mpi::datatype::Equivalence;
use ::mpi::point_to_point::Source;
use ::mpi::topology::{Communicator, SimpleCommunicator};
use ::mpi::Tag;
use inflight::InFlight;
use pipeweave_core::{check_programs, Message, Problem, ProgramSet, RankId, RankProgram};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The tag of every message of the transport (on its private communicator).
const TAG: Tag = 17;

/// The exit status of a process whose rank failed (`MPI_Abort`'s error code).
pub const FAILURE_STATUS: i32 = 1;

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

/// A send posted and not yet known to be complete.
struct PendingSend {
    to: RankId,
    message: Message,
    op: InFlight,
}

/// One rank's links to its peers over MPI (see the module doc for the protocol).
pub struct MpiTransport {
    /// A private duplicate of the caller's communicator.
    comm: SimpleCommunicator,
    rank: RankId,
    size: usize,
    timeout: Duration,
    sends: Vec<PendingSend>,
}

/// Polling pace: yield the processor for a while, then sleep briefly, so that ranks sharing cores
/// (`mpirun --oversubscribe`) leave them to the rank that computes.
struct Backoff {
    idle: u32,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff { idle: 0 }
    }

    fn reset(&mut self) {
        self.idle = 0;
    }

    fn pause(&mut self) {
        self.idle = self.idle.saturating_add(1);
        if self.idle < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// A receive of a group whose message has been matched and is arriving.
struct Arriving {
    index: usize,
    op: InFlight,
}

impl MpiTransport {
    /// The transport of this process's rank in `comm` (collective: every rank of `comm` calls it).
    pub fn new(comm: &SimpleCommunicator, receive_timeout: Duration) -> MpiTransport {
        let comm = comm.duplicate();
        // MPI ranks and sizes are non-negative `int`s.
        let rank = RankId::new(u32::try_from(comm.rank()).unwrap_or(0));
        let size = usize::try_from(comm.size()).unwrap_or(0);
        MpiTransport {
            comm,
            rank,
            size,
            timeout: receive_timeout,
            sends: Vec::new(),
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> RankId {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The transport's communicator (a duplicate of the one it was made from).
    pub fn communicator(&self) -> &SimpleCommunicator {
        &self.comm
    }

    /// Ends every process of the communicator with `status` (`MPI_Abort`).
    pub fn abort_world(&self, status: i32) -> ! {
        self.comm.abort(status)
    }

    fn peer(&self, rank: RankId) -> Result<i32, TransportFailure> {
        i32::try_from(rank.get())
            .ok()
            .filter(|_| rank.index() < self.size)
            .ok_or_else(|| {
                TransportFailure::Broken(format!(
                    "rank {rank} is not in the MPI world of {} processes",
                    self.size
                ))
            })
    }

    /// Frees the buffers of the sends that have completed.
    fn reap_sends(&mut self) {
        self.sends.retain_mut(|send| !send.op.test());
    }

    /// Posts one immediate send per outgoing message.
    fn post_sends<T: WirePayload>(
        &mut self,
        sends: Vec<Outgoing<T>>,
    ) -> Result<(), TransportFailure> {
        for outgoing in sends {
            let peer = self.peer(outgoing.to)?;
            let bytes = wire::encode(outgoing.message, &outgoing.payload)?;
            let op = InFlight::send(&self.comm.process_at_rank(peer), TAG, bytes);
            self.sends.push(PendingSend {
                to: outgoing.to,
                message: outgoing.message,
                op,
            });
        }
        Ok(())
    }

    /// Matches and completes every receive of a group, in each peer's program order.
    fn receive_all<T: WirePayload>(
        &mut self,
        receives: &[Incoming],
    ) -> Result<Vec<T>, TransportFailure> {
        // Per peer, the indices of its receives in group order: only the first unmatched one
        // may match the peer's next message.
        let mut waiting: BTreeMap<i32, VecDeque<usize>> = BTreeMap::new();
        for (index, incoming) in receives.iter().enumerate() {
            let peer = self.peer(incoming.from)?;
            waiting.entry(peer).or_default().push_back(index);
        }
        let mut arriving: Vec<Arriving> = Vec::new();
        let mut results: Vec<Option<T>> = receives.iter().map(|_| None).collect();
        let mut left = receives.len();
        let mut last_progress = Instant::now();
        let mut backoff = Backoff::new();
        while left > 0 {
            let mut progress = false;
            for (&peer, queue) in waiting.iter_mut() {
                while let Some(&index) = queue.front() {
                    let process = self.comm.process_at_rank(peer);
                    let Some((matched, status)) = process.immediate_matched_probe_with_tag(TAG)
                    else {
                        break;
                    };
                    queue.pop_front();
                    // A byte count is never negative (nor MPI_UNDEFINED); were it, the
                    // zero-byte receive would fail with MPI's truncation error, not read garbage.
                    let len = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
                    arriving.push(Arriving {
                        index,
                        op: InFlight::receive(matched, len),
                    });
                    progress = true;
                }
            }
            let mut i = 0;
            while i < arriving.len() {
                if !arriving[i].op.test() {
                    i += 1;
                    continue;
                }
                let Arriving { index, op } = arriving.swap_remove(i);
                let bytes = match op.into_bytes() {
                    Ok(bytes) => bytes,
                    Err(op) => {
                        // Tested complete above; keep it in the loop all the same.
                        arriving.push(Arriving { index, op });
                        continue;
                    }
                };
                let incoming = receives[index];
                results[index] = Some(wire::decode(incoming.from, incoming.message, &bytes)?);
                left -= 1;
                progress = true;
            }
            if left == 0 {
                break;
            }
            if progress {
                last_progress = Instant::now();
                backoff.reset();
                continue;
            }
            if last_progress.elapsed() > self.timeout {
                let Some(first) = receives
                    .iter()
                    .zip(&results)
                    .find_map(|(incoming, result)| result.is_none().then_some(*incoming))
                else {
                    break;
                };
                return Err(TransportFailure::Timeout {
                    from: first.from,
                    message: first.message,
                    seconds: self.timeout.as_secs_f64(),
                });
            }
            backoff.pause();
        }
        results
            .into_iter()
            .zip(receives)
            .map(|(result, incoming)| {
                result.ok_or_else(|| {
                    TransportFailure::Broken(format!(
                        "{} from rank {} never completed",
                        incoming.message, incoming.from
                    ))
                })
            })
            .collect()
    }
}

impl<T: WirePayload> Transport<T> for MpiTransport {
    /// One `MPI_Isend` per send (completed by `finish` at the latest), one matched `MPI_Imrecv`
    /// per receive, then every receive completed.
    fn exchange(
        &mut self,
        sends: Vec<Outgoing<T>>,
        receives: &[Incoming],
    ) -> Result<Vec<T>, TransportFailure> {
        self.reap_sends();
        self.post_sends(sends)?;
        self.receive_all(receives)
    }

    /// Waits (polling, within the timeout) until every send has been received.
    fn finish(&mut self) -> Result<(), TransportFailure> {
        let start = Instant::now();
        let mut backoff = Backoff::new();
        loop {
            self.reap_sends();
            let Some(first) = self.sends.first() else {
                return Ok(());
            };
            if start.elapsed() > self.timeout {
                return Err(TransportFailure::Broken(format!(
                    "rank {} did not receive {} within {} s of the end of the program",
                    first.to,
                    first.message,
                    self.timeout.as_secs_f64()
                )));
            }
            backoff.pause();
        }
    }

    /// Aborts every process of the world (`MPI_Abort`).
    fn abort(&mut self) {
        self.abort_world(FAILURE_STATUS)
    }
}

/// 64-bit FNV-1a, written out so that fingerprints do not depend on the build.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn u32s(&mut self, values: impl IntoIterator<Item = u32>) {
        let values: Vec<u32> = values.into_iter().collect();
        self.bytes(&(values.len() as u64).to_le_bytes());
        for v in values {
            self.bytes(&v.to_le_bytes());
        }
    }
}

/// The fingerprint of what a rank is about to run: the problem (sizes, placement, routes, tied
/// stages) and the programs (their JSON).
pub fn fingerprint(problem: &Problem, programs: &ProgramSet) -> u64 {
    let mut h = Fnv::new();
    h.u32s([problem.ranks(), problem.microbatches()]);
    h.u32s(problem.stage_to_rank().iter().map(|r| r.get()));
    for route in problem.route_specs() {
        h.u32s([route.first, route.end]);
        h.u32s(route.stages);
    }
    for group in problem.tied_stages() {
        h.u32s(group.iter().map(|s| s.get()));
    }
    match serde_json::to_vec(programs) {
        Ok(json) => h.bytes(&json),
        // Plain data always serialises; the debug form is as deterministic, should it not.
        Err(_) => h.bytes(format!("{programs:?}").as_bytes()),
    }
    h.0
}

/// Compares every rank's fingerprint with rank 0's; `Err` names the ranks that differ.
fn compare_fingerprints(fingerprints: &[u64]) -> Result<(), String> {
    let Some(&first) = fingerprints.first() else {
        return Ok(());
    };
    let differ: Vec<String> = fingerprints
        .iter()
        .enumerate()
        .filter(|(_, f)| **f != first)
        .map(|(r, f)| format!("rank {r} ({f:016x})"))
        .collect();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the ranks were given different programs: ranks whose fingerprint differs from rank \
             0's ({first:016x}): {}",
            differ.join(", ")
        ))
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

/// Runs this process's rank of `programs` over `comm` (collective: every rank of `comm` calls it
/// with its own `compute`, the same `problem` and the same `programs`).
///
/// First, on every rank alike: the fingerprints of `problem` and `programs` are all-gathered and
/// compared, the world's size is compared with the programs' rank count, and the programs are
/// checked; any of these failing returns the same error on every rank, and nothing runs. Then the
/// rank's program runs to its end and `Ok(())` returns (the computed gradients are in `compute`).
/// If this rank's run fails, the error is printed on stderr and the whole job is aborted
/// (`MPI_Abort` with [`FAILURE_STATUS`]): this function does not return then.
pub fn run_mpi<C>(
    comm: &SimpleCommunicator,
    problem: &Problem,
    programs: &ProgramSet,
    compute: &mut C,
    options: MpiOptions,
) -> Result<(), BackendError>
where
    C: StageCompute,
    C::Tensor: WirePayload,
{
    let mut transport = MpiTransport::new(comm, options.receive_timeout);
    let rank = transport.rank();
    let before = |reason: String| BackendError::Program {
        rank,
        instr: 0,
        what: "before the program".to_string(),
        reason,
    };
    let own = fingerprint(problem, programs);
    let mut all = vec![0u64; transport.size()];
    transport.communicator().all_gather_into(&own, &mut all[..]);
    compare_fingerprints(&all).map_err(before)?;
    if programs.programs.len() != transport.size() {
        return Err(before(format!(
            "the programs are for {} ranks, but the MPI job has {} processes (mpirun -np {})",
            programs.programs.len(),
            transport.size(),
            programs.programs.len()
        )));
    }
    check_programs(problem, programs)?;
    let program = programs
        .programs
        .iter()
        .find(|p| p.rank == rank)
        .ok_or_else(|| before(format!("the programs have none for rank {rank}")))?;
    match run_rank(program, problem, compute, &mut transport) {
        Ok(()) => Ok(()),
        Err(error) => {
            eprintln!("{}", failure_report(&error, program));
            transport.abort_world(FAILURE_STATUS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_name_the_ranks_that_differ() {
        assert!(compare_fingerprints(&[7, 7, 7]).is_ok());
        let err = compare_fingerprints(&[7, 7, 9, 8]).unwrap_err();
        assert!(
            err.contains("(0000000000000007): rank 2 (0000000000000009), rank 3"),
            "{err}"
        );
        assert!(!err.contains("rank 1 "), "{err}");
    }

    #[test]
    fn fnv_is_the_published_one() {
        let mut h = Fnv::new();
        h.bytes(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
    }
}
