//! The transport trait: how a rank sends tensors to and receives tensors from its peers. Threads,
//! MPI and NCCL differ only here.

use pipeweave_core::{Message, RankId};

/// Why a transport operation did not complete.
#[derive(Debug, Clone, PartialEq)]
pub enum TransportFailure {
    /// Another rank failed; the run is being stopped.
    Aborted {
        /// The rank that failed.
        failed: RankId,
    },
    /// A different message arrived first (the programs disagree).
    Unexpected {
        /// What arrived.
        got: Message,
    },
    /// Nothing arrived within the run's limit.
    Timeout {
        /// The limit in seconds.
        seconds: f64,
    },
    /// The link is broken.
    Broken(String),
}

/// Point-to-point messaging between ranks, in the order of the programs: the k-th send from one
/// rank to another is the k-th receive there.
pub trait Transport<T> {
    /// Sends `payload` as `message` to `to`. May return before the peer receives it.
    fn send(&mut self, to: RankId, message: Message, payload: T) -> Result<(), TransportFailure>;

    /// Receives `message` from `from`, waiting until it arrives.
    fn recv(&mut self, from: RankId, message: Message) -> Result<T, TransportFailure>;

    /// Tells every peer that this rank failed, so that they stop instead of waiting.
    fn abort(&mut self);
}
