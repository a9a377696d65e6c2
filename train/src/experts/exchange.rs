//! The threads backend's expert exchange: a step's groups of expert-parallel ranks
//! ([`ExpertGroups`]), each rank's endpoint ([`ChannelExchange`], the kernels'
//! [`ExpertExchange`] over channels) and the flag a failing rank raises so that its group does
//! not wait for it.
//!
//! A group is the `X` expert ranks of one pipeline rank of one data-parallel replica; they run
//! the same program, so they call the exchange of each phase for the same layers in the same
//! order. The two phases are two lanes (a channel per ordered pair and phase, and a call count
//! per phase): an overlapped pair calls the forward's combine and the backward's dispatch
//! backward from its two threads at once ([`super::slot`]). Each call sends this rank's rows to
//! every other rank of the group (a send never waits) and receives theirs, one message per peer,
//! checked against the call's number and phase, the rank's compute slot given up while it waits.
//! A receive gives up when the peer is gone (its stage was dropped), when any rank of the step
//! raised the failure flag ([`super::Watched`]), or after the run's receive timeout.

use pipeweave_core::RankId;
use pipeweave_kernels::{ExchangePhase, ExpertExchange, ExpertRows, KernelError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::settle;
use super::slot::while_waiting;
use super::ExpertRank;

/// The lane of `phase` (the MPI exchange's tag too).
pub(super) fn lane(phase: ExchangePhase) -> usize {
    match phase {
        ExchangePhase::Combine => 0,
        ExchangePhase::DispatchBackward => 1,
    }
}

/// How often a waiting receive looks at the step's failure flag.
const POLL: Duration = Duration::from_millis(10);

/// One call's rows from one rank of the group.
#[derive(Debug)]
pub(super) struct Message {
    /// The sender's call number within its phase (1 first).
    pub(super) call: u64,
    pub(super) phase: ExchangePhase,
    pub(super) rows: Vec<ExpertRows>,
}

impl Message {
    /// The rows of `peer`'s message, which must be of call `call` of `phase` (else what is
    /// wrong: the group's ranks ran different programs).
    pub(super) fn rows_of(
        self,
        peer: ExpertRank,
        call: u64,
        phase: ExchangePhase,
    ) -> Result<Vec<ExpertRows>, String> {
        if (self.call, self.phase) != (call, phase) {
            return Err(format!(
                "expert rank {} sent its rows of call {} ({}) for call {call} ({phase}): \
                 the group's ranks ran different programs",
                peer.get(),
                self.call,
                self.phase
            ));
        }
        Ok(self.rows)
    }
}

/// What a rank says when `peer` of its group is gone.
pub(super) fn gone(peer: ExpertRank) -> String {
    format!("expert rank {} of its group is gone", peer.get())
}

/// What a rank says when it waited more than `timeout` for `peer`'s rows.
pub(super) fn waited(timeout: Duration, peer: ExpertRank) -> String {
    format!(
        "waited more than {} s for expert rank {}'s rows",
        timeout.as_secs_f64(),
        peer.get()
    )
}

/// Where an endpoint sits: its replica, its pipeline rank and its expert rank.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) replica: u32,
    pub(super) rank: RankId,
    pub(super) expert: ExpertRank,
}

impl Member {
    /// The error of `phase` at this endpoint, saying `what`.
    pub(super) fn error(&self, phase: ExchangePhase, what: String) -> KernelError {
        KernelError::ExpertExchange {
            phase: phase.name(),
            reason: format!("{self}: {what}"),
        }
    }
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "expert rank {} of rank {} (replica {})",
            self.expert.get(),
            self.rank,
            self.replica
        )
    }
}

/// Every rank's rows of call `call` of `phase`, the transports' common receiving half: this
/// rank's `rows`, then each of `peers`' message, taken at once where it has already arrived
/// (`arrived`: the slot kept) or else waited for with the rank's compute slot given up (`wait`),
/// checked against the call (`error` names where); the call then ends no sooner than `latency`
/// after `issued` ([`settle`]).
pub(super) fn gather_rows<P>(
    (phase, call): (ExchangePhase, u64),
    rows: Vec<ExpertRows>,
    peers: impl IntoIterator<Item = (ExpertRank, P)>,
    mut arrived: impl FnMut(ExpertRank, &P) -> Result<Option<Message>, KernelError>,
    mut wait: impl FnMut(ExpertRank, &P) -> Result<Message, KernelError>,
    error: impl Fn(String) -> KernelError,
    (issued, latency): (Instant, Duration),
) -> Result<Vec<ExpertRows>, KernelError> {
    let mut all = rows;
    for (peer, from) in peers {
        let message = match arrived(peer, &from)? {
            Some(message) => message,
            None => while_waiting(|| wait(peer, &from))?,
        };
        all.extend(message.rows_of(peer, call, phase).map_err(&error)?);
    }
    settle(issued, latency);
    Ok(all)
}

/// What an endpoint receives from in one phase: one channel per peer, and its calls so far.
#[derive(Debug)]
struct Inbox {
    calls: u64,
    from: Vec<(ExpertRank, Receiver<Message>)>,
}

/// One expert rank's endpoint of its group's exchange.
#[derive(Debug)]
pub(crate) struct ChannelExchange {
    at: Member,
    /// Per peer, a sender per phase's lane.
    to: Vec<(ExpertRank, [Sender<Message>; 2])>,
    /// Per phase's lane.
    inboxes: [Mutex<Inbox>; 2],
    timeout: Duration,
    /// The emulated all-to-all's least duration ([`super::settle`]).
    latency: Duration,
    failed: Arc<AtomicBool>,
}

/// A step's expert-parallel groups: for every replica and pipeline rank, `X` endpoints wired to
/// one another, handed out once each.
pub(crate) struct ExpertGroups {
    /// Indexed `(replica · P + rank) · X + expert`.
    endpoints: Vec<Option<ChannelExchange>>,
    ranks: u32,
    experts: u32,
    failed: Arc<AtomicBool>,
}

impl ExpertGroups {
    /// The groups of `replicas` pipelines of `ranks` ranks, each rank `experts` expert ranks;
    /// a receive waits at most `timeout`, and an exchange ends no sooner than `latency` after it
    /// was issued.
    pub(crate) fn new(
        replicas: u32,
        ranks: u32,
        experts: u32,
        (timeout, latency): (Duration, Duration),
    ) -> Self {
        let failed = Arc::new(AtomicBool::new(false));
        let mut endpoints = Vec::new();
        for replica in 0..replicas {
            for rank in 0..ranks {
                let members = (0..experts).map(|x| Member {
                    replica,
                    rank: RankId::new(rank),
                    expert: ExpertRank::new(x),
                });
                endpoints.extend(
                    group(members.collect(), (timeout, latency), &failed)
                        .into_iter()
                        .map(Some),
                );
            }
        }
        ExpertGroups {
            endpoints,
            ranks,
            experts,
            failed,
        }
    }

    /// The endpoint of expert rank `expert` of `rank` of `replica`, once.
    pub(crate) fn take(
        &mut self,
        replica: u32,
        rank: RankId,
        expert: ExpertRank,
    ) -> Option<ChannelExchange> {
        let index = (replica * self.ranks + rank.get()) * self.experts + expert.get();
        self.endpoints.get_mut(index as usize)?.take()
    }

    /// The flag a failing rank of the step raises.
    pub(crate) fn failure_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.failed)
    }
}

/// The endpoints of one group, by expert rank: a channel for every ordered pair.
fn group(
    members: Vec<Member>,
    (timeout, latency): (Duration, Duration),
    failed: &Arc<AtomicBool>,
) -> Vec<ChannelExchange> {
    type Lanes<T> = [Vec<(ExpertRank, T)>; 2];
    let mut to: Vec<Vec<(ExpertRank, [Sender<Message>; 2])>> =
        members.iter().map(|_| Vec::new()).collect();
    let mut from: Vec<Lanes<Receiver<Message>>> =
        members.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    for (s, sender) in members.iter().enumerate() {
        for (r, receiver) in members.iter().enumerate().filter(|&(r, _)| r != s) {
            let [(tx0, rx0), (tx1, rx1)] = [channel(), channel()];
            to[s].push((receiver.expert, [tx0, tx1]));
            from[r][0].push((sender.expert, rx0));
            from[r][1].push((sender.expert, rx1));
        }
    }
    members
        .into_iter()
        .zip(to.into_iter().zip(from))
        .map(|(at, (to, [combine, backward]))| ChannelExchange {
            at,
            to,
            inboxes: [combine, backward].map(|from| Mutex::new(Inbox { calls: 0, from })),
            timeout,
            latency,
            failed: Arc::clone(failed),
        })
        .collect()
}

impl ChannelExchange {
    /// The error of `phase` at this endpoint, saying `what`.
    fn error(&self, phase: ExchangePhase, what: String) -> KernelError {
        self.at.error(phase, what)
    }

    /// The next message from `peer`: an error when it is gone, when the step failed elsewhere,
    /// or after the timeout.
    fn receive(
        &self,
        phase: ExchangePhase,
        peer: ExpertRank,
        from: &Receiver<Message>,
    ) -> Result<Message, KernelError> {
        let start = Instant::now();
        loop {
            match from.recv_timeout(POLL) {
                Ok(message) => return Ok(message),
                Err(RecvTimeoutError::Disconnected) => return Err(self.error(phase, gone(peer))),
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.failed.load(Ordering::Acquire) {
                let what = format!(
                    "stopped waiting for expert rank {}: another rank of the step failed",
                    peer.get()
                );
                return Err(self.error(phase, what));
            }
            if start.elapsed() >= self.timeout {
                return Err(self.error(phase, waited(self.timeout, peer)));
            }
        }
    }
}

impl ExpertExchange for ChannelExchange {
    fn exchange(
        &self,
        phase: ExchangePhase,
        rows: Vec<ExpertRows>,
    ) -> Result<Vec<ExpertRows>, KernelError> {
        let mut inbox = self.inboxes[lane(phase)]
            .lock()
            .map_err(|_| self.error(phase, "its inbox was poisoned".into()))?;
        inbox.calls += 1;
        let call = inbox.calls;
        for (peer, lanes) in &self.to {
            let to = &lanes[lane(phase)];
            let message = Message {
                call,
                phase,
                rows: rows.clone(),
            };
            if to.send(message).is_err() {
                return Err(self.error(phase, gone(*peer)));
            }
        }
        let issued = Instant::now();
        gather_rows(
            (phase, call),
            rows,
            inbox.from.iter().map(|(peer, from)| (*peer, from)),
            // Disconnected too: the wait says the peer is gone.
            |_, from| Ok(from.try_recv().ok()),
            |peer, from| self.receive(phase, peer, from),
            |what| self.error(phase, what),
            (issued, self.latency),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

    fn rows(expert: usize) -> Vec<ExpertRows> {
        let t = Tensor::full(expert as f32, (1, 2), &Device::Cpu).unwrap();
        vec![ExpertRows::new(expert, t.to_dtype(DType::F32).unwrap())]
    }

    #[test]
    fn each_rank_gets_every_ranks_rows() {
        let mut groups = ExpertGroups::new(1, 2, 3, (Duration::from_secs(5), Duration::ZERO));
        let endpoints: Vec<ChannelExchange> = (0..3)
            .map(|x| groups.take(0, RankId::new(1), ExpertRank::new(x)).unwrap())
            .collect();
        assert!(groups.take(0, RankId::new(1), ExpertRank::new(0)).is_none());
        let got: Vec<Vec<usize>> = std::thread::scope(|scope| {
            let handles: Vec<_> = endpoints
                .iter()
                .enumerate()
                .map(|(x, e)| {
                    scope.spawn(move || {
                        let all = e.exchange(ExchangePhase::Combine, rows(x)).unwrap();
                        let mut experts: Vec<usize> = all.iter().map(|r| r.expert()).collect();
                        experts.sort_unstable();
                        experts
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(got, vec![vec![0, 1, 2]; 3]);
    }

    #[test]
    fn the_two_phases_are_matched_apart_when_a_pair_calls_them_at_once() {
        let mut groups = ExpertGroups::new(1, 1, 2, (Duration::from_secs(5), Duration::ZERO));
        let ours = groups.take(0, RankId::new(0), ExpertRank::new(0)).unwrap();
        let theirs = groups.take(0, RankId::new(0), ExpertRank::new(1)).unwrap();
        let experts = |all: Vec<ExpertRows>| {
            let mut e: Vec<usize> = all.iter().map(|r| r.expert()).collect();
            e.sort_unstable();
            e
        };
        std::thread::scope(|scope| {
            // Ours calls the dispatch backward first, then the combine; theirs calls the two
            // from two threads, the combine first.
            let a = scope.spawn(|| {
                let b = ours.exchange(ExchangePhase::DispatchBackward, rows(0));
                let c = ours.exchange(ExchangePhase::Combine, rows(0));
                (experts(b.unwrap()), experts(c.unwrap()))
            });
            let c = scope.spawn(|| theirs.exchange(ExchangePhase::Combine, rows(1)));
            std::thread::sleep(Duration::from_millis(30));
            let b = theirs.exchange(ExchangePhase::DispatchBackward, rows(1));
            assert_eq!(experts(b.unwrap()), vec![0, 1]);
            assert_eq!(experts(c.join().unwrap().unwrap()), vec![0, 1]);
            assert_eq!(a.join().unwrap(), (vec![0, 1], vec![0, 1]));
        });
    }

    #[test]
    fn a_rank_stops_waiting_when_a_peer_is_gone_or_the_step_failed() {
        let mut groups = ExpertGroups::new(1, 1, 2, (Duration::from_secs(30), Duration::ZERO));
        let ours = groups.take(0, RankId::new(0), ExpertRank::new(0)).unwrap();
        let theirs = groups.take(0, RankId::new(0), ExpertRank::new(1)).unwrap();
        groups.failure_flag().store(true, Ordering::Release);
        let err = ours.exchange(ExchangePhase::Combine, rows(0)).unwrap_err();
        assert!(
            err.to_string().contains("another rank of the step failed"),
            "{err}"
        );
        drop(theirs);
        let err = ours
            .exchange(ExchangePhase::DispatchBackward, rows(0))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "expert exchange (dispatch_backward): expert rank 0 of rank 0 (replica 0): \
             expert rank 1 of its group is gone"
        );
    }

    #[test]
    fn an_exchange_ends_no_sooner_than_its_latency() {
        let latency = Duration::from_millis(80);
        let mut groups = ExpertGroups::new(1, 1, 2, (Duration::from_secs(5), latency));
        let ours = groups.take(0, RankId::new(0), ExpertRank::new(0)).unwrap();
        let theirs = groups.take(0, RankId::new(0), ExpertRank::new(1)).unwrap();
        let start = Instant::now();
        std::thread::scope(|scope| {
            let other = scope.spawn(|| theirs.exchange(ExchangePhase::Combine, rows(1)));
            ours.exchange(ExchangePhase::Combine, rows(0)).unwrap();
            other.join().unwrap().unwrap();
        });
        assert!(start.elapsed() >= latency, "{:?}", start.elapsed());
    }

    #[test]
    fn a_rank_waits_no_longer_than_the_timeout() {
        let mut groups = ExpertGroups::new(1, 1, 2, (Duration::from_millis(50), Duration::ZERO));
        let ours = groups.take(0, RankId::new(0), ExpertRank::new(0)).unwrap();
        let _theirs = groups.take(0, RankId::new(0), ExpertRank::new(1)).unwrap();
        let err = ours.exchange(ExchangePhase::Combine, rows(0)).unwrap_err();
        assert!(err.to_string().contains("waited more than 0.05 s"), "{err}");
        assert!(err.is_exchange_failure());
    }
}
