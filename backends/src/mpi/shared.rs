//! [`SharedMailbox`]: a [`Mailbox`] that the threads of one process share, for tagged byte
//! messages that two threads send and wait for at once (the trainer's expert exchange: the two
//! halves of an overlapped pair call its two phases from two threads, each on its own tag).
//!
//! MPI lets several threads call it only at the thread level `MPI_THREAD_MULTIPLE`, so a shared
//! mailbox is made only where MPI provides that level ([`SharedMailbox::new`] refuses otherwise).
//! The mailbox's own state (its request lists and their buffers) sits behind one lock, taken for
//! each poll and never across a wait: a thread waiting for one tag polls with the transport's
//! backoff, and between its polls another thread posts or receives on another tag. Messages of
//! one (peer, tag) pair arrive in the order they were sent, as in a [`Mailbox`].

use super::mailbox::Mailbox;
use super::transport::Backoff;
use crate::transport::TransportFailure;
use ::mpi::environment::{threading_support, Threading};
use ::mpi::topology::SimpleCommunicator;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long [`SharedMailbox::receive_napping`] sleeps between polls: a message waits about this
/// long at most to be noticed.
const NAP: Duration = Duration::from_micros(50);

/// A [`Mailbox`] made where MPI runs at `MPI_THREAD_MULTIPLE`.
struct Threaded(Mailbox);

// SAFETY: a `Mailbox` is not `Send` because it holds MPI handles (its communicator, the requests
// in flight) and heap buffers lent to those requests (`InFlight`). The buffers are owned by the
// mailbox alone (the invariant of `InFlight` does not depend on the thread), and MPI's handles may
// be used from any thread once MPI runs at `MPI_THREAD_MULTIPLE`: `Threaded` is only made after
// `SharedMailbox::new` checked that level, and it is only reached through the `Mutex` of a
// `SharedMailbox`, so one thread at a time uses the mailbox's state.
unsafe impl Send for Threaded {}

/// Tagged, non-blocking byte messages on a private communicator, for every thread of a process.
pub struct SharedMailbox {
    inner: Mutex<Threaded>,
    rank: usize,
    size: usize,
}

impl std::fmt::Debug for SharedMailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedMailbox(rank {} of {})", self.rank, self.size)
    }
}

impl SharedMailbox {
    /// A shared mailbox over a duplicate of `comm` (collective: every rank of `comm` calls it); an
    /// error, on every rank alike, where MPI does not run at `MPI_THREAD_MULTIPLE`.
    pub fn new(comm: &SimpleCommunicator) -> Result<SharedMailbox, TransportFailure> {
        let level = threading_support();
        if level != Threading::Multiple {
            return Err(TransportFailure::Broken(format!(
                "MPI runs at thread level {level:?}: messages that several threads of a process \
                 send and wait for need MPI_THREAD_MULTIPLE (MPI_Init_thread)"
            )));
        }
        let mailbox = Mailbox::new(comm);
        Ok(SharedMailbox {
            rank: mailbox.rank(),
            size: mailbox.size(),
            inner: Mutex::new(Threaded(mailbox)),
        })
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    fn lock(&self) -> Result<MutexGuard<'_, Threaded>, TransportFailure> {
        self.inner.lock().map_err(|_| {
            TransportFailure::Broken(
                "a thread panicked while it used the shared mailbox (its requests may be lost)"
                    .into(),
            )
        })
    }

    /// Sends `bytes` to `to` with `tag` (immediately; completed by later calls).
    pub fn post(&self, to: usize, tag: u16, bytes: Vec<u8>) -> Result<(), TransportFailure> {
        self.lock()?.0.post(to, tag, bytes)
    }

    /// The next message from `from` with `tag`, waiting for it at most `timeout` (polling; the
    /// lock is free between polls): `None` when it has not arrived by then.
    pub fn receive_within(
        &self,
        from: usize,
        tag: u16,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, TransportFailure> {
        let mut backoff = Backoff::new();
        self.poll_within(from, tag, timeout, || backoff.pause())
    }

    /// [`SharedMailbox::receive_within`] napping between polls from the first, never spinning
    /// or yielding: for a thread that waits while another thread of its process computes (the
    /// waiting half of an overlapped pair), whose polls would take that thread's processor.
    pub fn receive_napping(
        &self,
        from: usize,
        tag: u16,
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, TransportFailure> {
        crate::timing::precise_timers();
        self.poll_within(from, tag, timeout, || std::thread::sleep(NAP))
    }

    /// Polls for `from`'s next message with `tag` until `timeout`, `pause` between polls.
    fn poll_within(
        &self,
        from: usize,
        tag: u16,
        timeout: Duration,
        mut pause: impl FnMut(),
    ) -> Result<Option<Vec<u8>>, TransportFailure> {
        let start = Instant::now();
        loop {
            if let Some(bytes) = self.lock()?.0.try_receive(from, tag)? {
                return Ok(Some(bytes));
            }
            if start.elapsed() > timeout {
                return Ok(None);
            }
            pause();
        }
    }

    /// Waits at most `timeout` until every send has been delivered; whether they all were.
    pub fn finish_within(&self, timeout: Duration) -> Result<bool, TransportFailure> {
        let start = Instant::now();
        let mut backoff = Backoff::new();
        loop {
            if self.lock()?.0.sends_done() {
                return Ok(true);
            }
            if start.elapsed() > timeout {
                return Ok(false);
            }
            backoff.pause();
        }
    }
}
