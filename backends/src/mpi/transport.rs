//! [`MpiTransport`]: one rank's links to its peers over MPI (the protocol is in the module doc of
//! [`crate::mpi`]), with a status side channel ([`super::report`]) that turns a receive timeout
//! into a report of who waits on whom.

use super::inflight::InFlight;
use super::report::Reporter;
use super::wire::{self, WirePayload};
use crate::transport::{Incoming, Outgoing, Transport, TransportFailure};
use ::mpi::datatype::Equivalence;
use ::mpi::point_to_point::Source;
use ::mpi::topology::{Communicator, SimpleCommunicator};
use ::mpi::Tag;
use pipeweave_core::{Message, RankId};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The tag of every message of the transport (on its private communicator).
const TAG: Tag = 17;

/// The exit status of a process whose rank failed (`MPI_Abort`'s error code).
pub const FAILURE_STATUS: i32 = 1;

/// The nap between polls once a wait has lasted a while.
const POLL_NAP: Duration = Duration::from_micros(20);

/// How long a rank whose wait timed out collects the other ranks' status lines.
const REPORT_WINDOW: Duration = Duration::from_secs(1);

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
    /// The instruction the rank's program is at (for status lines).
    instruction: usize,
    reporter: Reporter,
}

/// Polling pace of a wait. A few polls back to back (a message that has just landed is matched
/// within microseconds), then polls that yield the processor to the ranks that compute (`mpirun
/// --oversubscribe` puts several ranks on a core), and only once a wait has lasted
/// [`YIELD_SPAN`], short sleeps. Sleeping early costs dearly: a sleeping rank wakes up tens of
/// microseconds late on a loaded or virtual machine, and in a tight schedule every late notice
/// lengthens the critical path (measured on a 2-core VM at pp8 with 1 ms kernels: sleeping after
/// 64 polls made the run about 2% longer than yielding throughout).
pub(crate) struct Backoff {
    polls: u32,
    since: Option<Instant>,
}

/// Polls without giving up the processor at the start of a wait.
const HOT_POLLS: u32 = 16;

/// How long a wait yields the processor between polls before it sleeps between them instead.
const YIELD_SPAN: Duration = Duration::from_millis(10);

impl Backoff {
    pub(crate) fn new() -> Backoff {
        Backoff {
            polls: 0,
            since: None,
        }
    }

    /// Progress was made: the next wait starts afresh.
    pub(crate) fn reset(&mut self) {
        self.polls = 0;
        self.since = None;
    }

    /// Waits a little before the next poll.
    pub(crate) fn pause(&mut self) {
        self.polls = self.polls.saturating_add(1);
        let since = *self.since.get_or_insert_with(Instant::now);
        if self.polls < HOT_POLLS {
            std::hint::spin_loop();
        } else if since.elapsed() < YIELD_SPAN {
            std::thread::yield_now();
        } else {
            // Short, precise naps: a message waits at most about this long to be noticed.
            crate::timing::precise_timers();
            std::thread::sleep(POLL_NAP);
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
        let reporter = Reporter::new(&comm);
        MpiTransport {
            comm,
            rank,
            size,
            timeout: receive_timeout,
            sends: Vec::new(),
            instruction: 0,
            reporter,
        }
    }

    /// How long a wait may last before the run is declared stuck.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The instruction the rank's program is at.
    pub fn instruction(&self) -> usize {
        self.instruction
    }

    /// Answers the other ranks' status requests with `status` (call it while waiting for
    /// something else than the pipeline's messages, so that a stuck job's report names the wait).
    pub fn answer_requests(&mut self, status: &dyn Fn() -> String) {
        self.reporter.answer(status);
    }

    /// The failure of a wait that timed out: asks every rank where it stands (about a second)
    /// and returns who waits on whom, `own` being this rank's line.
    pub fn stalled(&mut self, own: &dyn Fn() -> String) -> TransportFailure {
        TransportFailure::Stalled {
            seconds: self.timeout.as_secs_f64(),
            report: self.reporter.gather(own, REPORT_WINDOW.min(self.timeout)),
        }
    }

    /// This rank's status line while it waits for `message` from `from`, formatted only when
    /// asked for (polls run many times a millisecond; status requests are rare).
    fn waiting_line(&self, from: RankId, message: Message) -> impl Fn() -> String {
        let (rank, instruction) = (self.rank, self.instruction);
        move || {
            format!("rank {rank} waits at instruction {instruction} for {message} from rank {from}")
        }
    }

    /// This rank's status line while, at the end of its program, it waits for `to` to receive
    /// `message` (formatted only when asked for, like [`Self::waiting_line`]).
    fn finishing_line(&self, to: RankId, message: Message) -> impl Fn() -> String {
        let (rank, instruction) = (self.rank, self.instruction);
        move || {
            format!(
                "rank {rank} is at the end of its program (instruction {instruction}), waiting \
                 for rank {to} to receive {message}"
            )
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
                    // Open MPI's probe looks for a match first and progresses the shared-memory
                    // queues after, so a message that had already landed is found by the second
                    // probe only: probing twice saves a whole poll (tens of microseconds on a
                    // loaded machine, where the poll in between yields the processor).
                    let probe = || process.immediate_matched_probe_with_tag(TAG);
                    let Some((matched, status)) = probe().or_else(probe) else {
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
            let Some(first) = receives
                .iter()
                .zip(&results)
                .find_map(|(incoming, result)| result.is_none().then_some(*incoming))
            else {
                break;
            };
            let line = self.waiting_line(first.from, first.message);
            if last_progress.elapsed() > self.timeout {
                return Err(self.stalled(&line));
            }
            self.reporter.answer(&line);
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
            let line = self.finishing_line(first.to, first.message);
            if start.elapsed() > self.timeout {
                return Err(self.stalled(&line));
            }
            self.reporter.answer(&line);
            backoff.pause();
        }
    }

    fn at_instruction(&mut self, index: usize) {
        self.instruction = index;
    }

    /// Aborts every process of the world (`MPI_Abort`).
    fn abort(&mut self) {
        self.abort_world(FAILURE_STATUS)
    }
}
