//! The transport trait: how a rank exchanges tensors with its peers. Threads, MPI and NCCL differ
//! only here.
//!
//! The unit of communication is a group, with the batched semantics the checker certifies
//! ([`pipeweave_core::Semantics::Batched`]): every send and receive of a group is posted
//! together, then the group's receives are completed; its sends complete when their peers receive
//! them, at the latest by [`Transport::finish`] at the end of the program. This maps directly onto
//! MPI (one `isend` per send and one `irecv` per receive, then `waitall` on the receives; the send
//! requests are kept and waited for by `finish`) and onto NCCL (`ncclGroupStart`, one `ncclSend` or
//! `ncclRecv` each, `ncclGroupEnd`, then a stream synchronisation). Buffered channels implement it
//! trivially.

use pipeweave_core::{Message, RankId};
use std::fmt;

/// One send of a group.
#[derive(Debug)]
pub struct Outgoing<T> {
    /// The peer.
    pub to: RankId,
    /// What the payload is.
    pub message: Message,
    /// The tensor.
    pub payload: T,
}

/// One receive of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Incoming {
    /// The peer.
    pub from: RankId,
    /// What must arrive.
    pub message: Message,
}

/// Why a transport operation did not complete.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportFailure {
    /// Another rank failed; the run is being stopped.
    Aborted {
        /// The rank that failed.
        failed: RankId,
    },
    /// A different message arrived than the one expected (the programs disagree).
    Unexpected {
        /// The peer.
        from: RankId,
        /// What the program expects.
        expected: Message,
        /// What arrived.
        got: Message,
    },
    /// Another rank failed while this one waited for `message` from `from`.
    AbortedWhileWaiting {
        /// The rank that failed.
        failed: RankId,
        /// The peer waited for.
        from: RankId,
        /// The awaited message.
        message: Message,
    },
    /// Nothing arrived within the run's limit.
    Timeout {
        /// The peer.
        from: RankId,
        /// The awaited message.
        message: Message,
        /// The limit in seconds.
        seconds: f64,
    },
    /// Nothing arrived within the run's limit, and the transport asked every peer what it was
    /// doing: who waits on whom (MPI; the threaded backend builds the same report itself).
    Stalled {
        /// The limit in seconds.
        seconds: f64,
        /// One line per rank: its instruction and the message it waits for, or that it did not
        /// answer.
        report: Vec<String>,
    },
    /// The link is broken.
    Broken(String),
}

impl fmt::Display for TransportFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TransportFailure::Aborted { failed } => write!(f, "rank {failed} failed"),
            TransportFailure::AbortedWhileWaiting {
                failed,
                from,
                message,
            } => write!(
                f,
                "rank {failed} failed while waiting for {message} from rank {from}"
            ),
            TransportFailure::Unexpected {
                from,
                expected,
                got,
            } => write!(f, "expected {expected} from rank {from}, got {got}"),
            TransportFailure::Timeout {
                from,
                message,
                seconds,
            } => write!(
                f,
                "waited more than {seconds} s for {message} from rank {from}"
            ),
            TransportFailure::Stalled { seconds, report } => {
                write!(f, "no progress within {seconds} s: {}", report.join("; "))
            }
            TransportFailure::Broken(reason) => f.write_str(reason),
        }
    }
}

/// Point-to-point messaging between ranks in groups, in the order of the programs: the k-th send
/// from one rank to another is the k-th receive there.
pub trait Transport<T> {
    /// Posts every send of `sends` and every receive of `receives`, then waits until every
    /// receive has arrived; returns the received payloads in the order of `receives`. The sends
    /// may complete later, by [`Transport::finish`] at the latest.
    fn exchange(
        &mut self,
        sends: Vec<Outgoing<T>>,
        receives: &[Incoming],
    ) -> Result<Vec<T>, TransportFailure>;

    /// The program is about to run its instruction `index` (the program's length: its end).
    /// A transport that reports where a stuck rank stands keeps it; the default ignores it.
    fn at_instruction(&mut self, _index: usize) {}

    /// Completes every send still in flight (called once, at the end of the program).
    fn finish(&mut self) -> Result<(), TransportFailure> {
        Ok(())
    }

    /// Tells every peer that this rank failed, so that they stop instead of waiting.
    fn abort(&mut self);
}
