//! [`Mailbox`]: tagged byte messages between the processes of a communicator, beside a pipeline's
//! own traffic: what a caller needs for its collectives over MPI (a data-parallel gradient
//! reduction, a gathered report), without blocking and without MPI's scoped buffers.
//!
//! Sends are immediate and own their buffers until MPI completes them; receives are matched with
//! `MPI_Improbe` on a (peer, tag) pair and completed by polling, one at a time per pair, so that
//! messages of one pair arrive in the order they were sent. A mailbox works on a private duplicate
//! of the communicator it is made from.

use super::inflight::InFlight;
use crate::transport::TransportFailure;
use ::mpi::datatype::Equivalence;
use ::mpi::point_to_point::Source;
use ::mpi::topology::{Communicator, SimpleCommunicator};
use ::mpi::Tag;
use std::collections::BTreeMap;

/// Tagged, non-blocking byte messages on a private communicator.
pub struct Mailbox {
    comm: SimpleCommunicator,
    rank: usize,
    size: usize,
    sends: Vec<InFlight>,
    /// Per (peer, tag), the receive that has been matched and is arriving.
    arriving: BTreeMap<(i32, Tag), InFlight>,
}

impl Mailbox {
    /// A mailbox over a duplicate of `comm` (collective: every rank of `comm` calls it).
    pub fn new(comm: &SimpleCommunicator) -> Mailbox {
        let comm = comm.duplicate();
        // MPI ranks and sizes are non-negative `int`s.
        let rank = usize::try_from(comm.rank()).unwrap_or(0);
        let size = usize::try_from(comm.size()).unwrap_or(0);
        Mailbox {
            comm,
            rank,
            size,
            sends: Vec::new(),
            arriving: BTreeMap::new(),
        }
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    fn peer(&self, rank: usize) -> Result<i32, TransportFailure> {
        i32::try_from(rank)
            .ok()
            .filter(|_| rank < self.size)
            .ok_or_else(|| {
                TransportFailure::Broken(format!(
                    "process {rank} is not in the communicator of {} processes",
                    self.size
                ))
            })
    }

    /// Sends `bytes` to `to` with `tag` (immediately; completed by later calls).
    pub fn post(&mut self, to: usize, tag: u16, bytes: Vec<u8>) -> Result<(), TransportFailure> {
        let peer = self.peer(to)?;
        self.reap();
        let op = InFlight::send(&self.comm.process_at_rank(peer), Tag::from(tag), bytes);
        self.sends.push(op);
        Ok(())
    }

    /// The next message from `from` with `tag`, if it has arrived (never blocks).
    pub fn try_receive(
        &mut self,
        from: usize,
        tag: u16,
    ) -> Result<Option<Vec<u8>>, TransportFailure> {
        let peer = self.peer(from)?;
        let key = (peer, Tag::from(tag));
        if !self.arriving.contains_key(&key) {
            let process = self.comm.process_at_rank(peer);
            let Some((matched, status)) = process.immediate_matched_probe_with_tag(key.1) else {
                return Ok(None);
            };
            // A byte count is never negative; were it, the empty receive would fail in MPI.
            let len = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
            self.arriving.insert(key, InFlight::receive(matched, len));
        }
        let Some(op) = self.arriving.remove(&key) else {
            return Ok(None);
        };
        match op.into_bytes() {
            Ok(bytes) => Ok(Some(bytes)),
            Err(op) => {
                self.arriving.insert(key, op);
                Ok(None)
            }
        }
    }

    /// Frees the buffers of the sends that have completed.
    fn reap(&mut self) {
        self.sends.retain_mut(|send| !send.test());
    }

    /// Whether every send has been delivered (tests the ones still in flight).
    pub fn sends_done(&mut self) -> bool {
        self.reap();
        self.sends.is_empty()
    }
}
