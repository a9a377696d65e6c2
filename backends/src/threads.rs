//! The threaded backend: one OS thread per rank, one channel per ordered pair of ranks as links.
//!
//! Channels buffer, so a send never blocks; a receive waits on its peer's channel, waking every
//! few milliseconds to see whether another rank has failed, and gives up after the run's time
//! limit. When a rank fails (its stage returns an error or panics, or a message is wrong) it raises
//! the shared abort flag; every other rank stops at its next receive, so the run ends within one
//! poll interval of the last computation in flight, and the error of the first failing rank is
//! returned. A program needing a residency capability its rank's compute lacks is refused before
//! any thread starts ([`crate::interpreter::check_capabilities`]).

use crate::compute::StageCompute;
use crate::error::BackendError;
use crate::interpreter::{check_capabilities, run_rank};
use crate::transport::{Incoming, Outgoing, Transport, TransportFailure};
use pipeweave_core::{CheckedPrograms, Message, RankId};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NO_FAILURE: u32 = u32::MAX;

/// One end of a link: messages with their payloads.
type Link<T> = Receiver<(Message, T)>;
const POLL: Duration = Duration::from_millis(5);
/// How long a receive polls (yielding) before it blocks.
const SPIN: Duration = Duration::from_micros(100);

/// Options of a threaded run.
#[derive(Clone, Copy, Debug)]
pub struct ThreadOptions {
    /// How long a receive may wait before the run is declared stuck.
    pub receive_timeout: Duration,
}

impl Default for ThreadOptions {
    fn default() -> Self {
        ThreadOptions {
            receive_timeout: Duration::from_secs(60),
        }
    }
}

/// One rank's end of the channels.
pub struct ChannelTransport<T> {
    rank: RankId,
    senders: Vec<Sender<(Message, T)>>,
    receivers: Vec<Link<T>>,
    failed: Arc<AtomicU32>,
    timeout: Duration,
}

impl<T: Send> ChannelTransport<T> {
    fn failure(&self) -> Option<TransportFailure> {
        let failed = self.failed.load(Ordering::SeqCst);
        (failed != NO_FAILURE).then(|| TransportFailure::Aborted {
            failed: RankId::new(failed),
        })
    }

    fn send(&mut self, outgoing: Outgoing<T>) -> Result<(), TransportFailure> {
        if let Some(failure) = self.failure() {
            return Err(failure);
        }
        let to = outgoing.to;
        let link = self.senders.get(to.index()).ok_or_else(|| {
            TransportFailure::Broken(format!("no link from rank {} to rank {to}", self.rank))
        })?;
        link.send((outgoing.message, outgoing.payload))
            .map_err(|_| TransportFailure::Broken(format!("rank {to} has stopped")))
    }

    fn receive(&mut self, incoming: Incoming) -> Result<T, TransportFailure> {
        let Incoming { from, message } = incoming;
        let link = self.receivers.get(from.index()).ok_or_else(|| {
            TransportFailure::Broken(format!("no link from rank {from} to rank {}", self.rank))
        })?;
        let start = Instant::now();
        // A message about to arrive is taken without blocking: waking a blocked thread costs tens
        // of microseconds on a virtual machine, on every hop of the pipeline.
        let spin_until = start + SPIN;
        let mut spun = link.try_recv();
        while matches!(spun, Err(TryRecvError::Empty)) && Instant::now() < spin_until {
            std::thread::yield_now();
            spun = link.try_recv();
        }
        if let Ok((got, payload)) = spun {
            return if got == message {
                Ok(payload)
            } else {
                Err(TransportFailure::Unexpected {
                    from,
                    expected: message,
                    got,
                })
            };
        }
        loop {
            match link.recv_timeout(POLL) {
                Ok((got, payload)) if got == message => return Ok(payload),
                Ok((got, _)) => {
                    return Err(TransportFailure::Unexpected {
                        from,
                        expected: message,
                        got,
                    })
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Some(TransportFailure::Aborted { failed }) = self.failure() {
                        return Err(TransportFailure::AbortedWhileWaiting {
                            failed,
                            from,
                            message,
                        });
                    }
                    if start.elapsed() > self.timeout {
                        return Err(TransportFailure::Timeout {
                            from,
                            message,
                            seconds: self.timeout.as_secs_f64(),
                        });
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(match self.failure() {
                        Some(TransportFailure::Aborted { failed }) => {
                            TransportFailure::AbortedWhileWaiting {
                                failed,
                                from,
                                message,
                            }
                        }
                        _ => TransportFailure::Broken(format!(
                            "rank {from} ended without sending {message}"
                        )),
                    })
                }
            }
        }
    }
}

impl<T: Send> Transport<T> for ChannelTransport<T> {
    /// Channels buffer, so posting a send completes it; the receives are then awaited in order.
    fn exchange(
        &mut self,
        sends: Vec<Outgoing<T>>,
        receives: &[Incoming],
    ) -> Result<Vec<T>, TransportFailure> {
        for outgoing in sends {
            self.send(outgoing)?;
        }
        receives
            .iter()
            .map(|&incoming| self.receive(incoming))
            .collect()
    }

    fn abort(&mut self) {
        let _ = self.failed.compare_exchange(
            NO_FAILURE,
            self.rank.get(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }
}

/// Builds the transports of `ranks` ranks sharing one abort flag.
pub fn channel_transports<T>(ranks: usize, timeout: Duration) -> Vec<ChannelTransport<T>> {
    let failed = Arc::new(AtomicU32::new(NO_FAILURE));
    // links[from][to]
    let mut senders: Vec<Vec<Sender<(Message, T)>>> =
        (0..ranks).map(|_| Vec::with_capacity(ranks)).collect();
    let mut receivers: Vec<Vec<Option<Link<T>>>> = (0..ranks)
        .map(|_| (0..ranks).map(|_| None).collect())
        .collect();
    for (from, row) in senders.iter_mut().enumerate() {
        for to_receivers in receivers.iter_mut() {
            let (tx, rx) = channel();
            row.push(tx);
            to_receivers[from] = Some(rx);
        }
    }
    senders
        .into_iter()
        .zip(receivers)
        .enumerate()
        .map(|(r, (senders, receivers))| ChannelTransport {
            rank: RankId::new(r as u32),
            senders,
            receivers: receivers
                .into_iter()
                .map(|rx| rx.expect("every link was made"))
                .collect(),
            failed: Arc::clone(&failed),
            timeout,
        })
        .collect()
}

/// Runs checked programs on one thread per rank with the stage computes made by
/// `make_compute`. Returns the computes (holding, say, their gradients) in rank order, or the
/// error of the first rank that failed. Every rank's program is first checked against its
/// compute's capabilities: the first refusal ([`BackendError::Unsupported`]) returns before any
/// rank runs an instruction.
pub fn run_threads<C, F>(
    checked: &CheckedPrograms,
    make_compute: F,
    options: ThreadOptions,
) -> Result<Vec<C>, BackendError>
where
    C: StageCompute + Send,
    F: Fn(RankId) -> C,
{
    let ranks = checked.ranks().len();
    let computes: Vec<C> = (0..ranks)
        .map(|r| make_compute(RankId::new(r as u32)))
        .collect();
    for (program, compute) in checked.ranks().zip(&computes) {
        check_capabilities(program, compute)?;
    }
    let transports = channel_transports::<C::Tensor>(ranks, options.receive_timeout);
    let results: Vec<(C, Result<(), BackendError>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = checked
            .ranks()
            .zip(transports)
            .zip(computes)
            .map(|((program, mut transport), mut compute)| {
                scope.spawn(move || {
                    let result = run_rank(program, &mut compute, &mut transport);
                    if result.is_err() {
                        transport.abort();
                    }
                    (compute, result)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .expect("the interpreter catches every panic of the stage and the transport")
            })
            .collect()
    });
    let mut computes = Vec::with_capacity(ranks);
    let mut errors: Vec<(RankId, BackendError)> = Vec::new();
    for (r, (compute, result)) in results.into_iter().enumerate() {
        match result {
            Ok(()) => computes.push(compute),
            Err(e) => errors.push((RankId::new(r as u32), e)),
        }
    }
    if let Some(seconds) = errors.iter().find_map(|(_, e)| match e {
        BackendError::Timeout { seconds, .. } => Some(*seconds),
        _ => None,
    }) {
        return Err(stalled(seconds, &errors));
    }
    // The rank the others name as the first to fail, else the first rank with an error of its own.
    let named = errors.iter().find_map(|(_, e)| match e {
        BackendError::Aborted { failed, .. } => Some(*failed),
        _ => None,
    });
    let root = named
        .and_then(|f| {
            errors
                .iter()
                .position(|(r, e)| *r == f && !e.is_secondary())
        })
        .or_else(|| errors.iter().position(|(_, e)| !e.is_secondary()))
        .or(if errors.is_empty() { None } else { Some(0) });
    match root {
        Some(i) => Err(errors.swap_remove(i).1),
        None => Ok(computes),
    }
}

/// Who waits on whom when a receive timed out: every rank's instruction and, for a waiting rank,
/// the message it waits for; a rank that finished or was busy computing says so.
fn stalled(seconds: f64, errors: &[(RankId, BackendError)]) -> BackendError {
    let report = errors
        .iter()
        .map(|(rank, e)| match e {
            BackendError::Timeout {
                instr,
                from,
                message,
                ..
            } => format!("rank {rank} waits at instruction {instr} for {message} from rank {from}"),
            BackendError::Aborted {
                instr,
                waiting: Some((from, message)),
                ..
            } => format!("rank {rank} waits at instruction {instr} for {message} from rank {from}"),
            BackendError::Aborted { instr, .. } => {
                format!("rank {rank} was busy until instruction {instr} (not waiting)")
            }
            other => format!("rank {rank}: {other}"),
        })
        .collect();
    BackendError::Stalled { seconds, report }
}
