//! Who waits on whom across the processes of an MPI job.
//!
//! Every rank that waits (for a message, or for its sends at the end of its program) answers
//! status requests while it polls: a line saying where it stands, such as `rank 2 waits at
//! instruction 14 for F3 of stage 3 from rank 3`. A rank whose wait times out asks every other rank
//! of its communicator for that line and collects the answers for a short window; a rank that is
//! computing, stalled or gone does not answer, and the report says so. The requests and answers
//! travel on a private duplicate of the communicator with their own tags, so they never meet the
//! pipeline's messages.

use super::inflight::InFlight;
use ::mpi::point_to_point::{MatchedReceiveVec, Source};
use ::mpi::topology::{Communicator, SimpleCommunicator};
use ::mpi::Tag;
use pipeweave_core::RankId;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A request for a rank's status line.
const REQUEST: Tag = 1;
/// A status line.
const ANSWER: Tag = 2;

/// How often a waiting rank looks for status requests (they are rare and may wait this long;
/// looking at every poll would add an MPI call, and a yield of the processor, to each).
const LOOK_INTERVAL: Duration = Duration::from_millis(1);

/// The status side channel of one rank.
pub(crate) struct Reporter {
    comm: SimpleCommunicator,
    rank: RankId,
    /// Requests and answers sent and not yet known to be delivered.
    sends: Vec<InFlight>,
    /// When requests were last looked for (None: never).
    last_look: Option<Instant>,
}

impl Reporter {
    /// The side channel of this process's rank in `comm` (collective: duplicates `comm`).
    pub(crate) fn new(comm: &SimpleCommunicator) -> Reporter {
        let comm = comm.duplicate();
        // MPI ranks are non-negative `int`s.
        let rank = RankId::new(u32::try_from(comm.rank()).unwrap_or(0));
        Reporter {
            comm,
            rank,
            sends: Vec::new(),
            last_look: None,
        }
    }

    /// Answers every request that has arrived with `status` (looking at most once per
    /// [`LOOK_INTERVAL`]).
    pub(crate) fn answer(&mut self, status: &dyn Fn() -> String) {
        if self
            .last_look
            .is_some_and(|last| last.elapsed() < LOOK_INTERVAL)
        {
            return;
        }
        self.last_look = Some(Instant::now());
        self.sends.retain_mut(|send| !send.test());
        while let Some((matched, probe)) = self
            .comm
            .any_process()
            .immediate_matched_probe_with_tag(REQUEST)
        {
            let to = probe.source_rank();
            // A request is one byte: already here when it is matched.
            let _request: (Vec<u8>, _) = (matched, probe).matched_receive_vec();
            let line = status().into_bytes();
            self.sends
                .push(InFlight::send(&self.comm.process_at_rank(to), ANSWER, line));
        }
    }

    /// Asks every other rank where it stands and collects the answers for at most `window`,
    /// answering other ranks' requests with `own` meanwhile. One line per rank, in rank order:
    /// `own` for this rank, the answer of every rank that gave one, and a line saying that a rank
    /// did not answer.
    pub(crate) fn gather(&mut self, own: &dyn Fn() -> String, window: Duration) -> Vec<String> {
        let size = usize::try_from(self.comm.size()).unwrap_or(0);
        for peer in 0..size {
            if peer == self.rank.index() {
                continue;
            }
            // Ranks of a communicator are `int`s; `peer` is below its size.
            let peer = i32::try_from(peer).unwrap_or(i32::MAX);
            self.sends.push(InFlight::send(
                &self.comm.process_at_rank(peer),
                REQUEST,
                vec![1],
            ));
        }
        let mut answers: BTreeMap<usize, String> = BTreeMap::new();
        answers.insert(self.rank.index(), own());
        let start = Instant::now();
        while answers.len() < size && start.elapsed() < window {
            self.answer(own);
            match self
                .comm
                .any_process()
                .immediate_matched_probe_with_tag(ANSWER)
            {
                Some((matched, probe)) => {
                    let from = usize::try_from(probe.source_rank()).unwrap_or(usize::MAX);
                    let (bytes, _): (Vec<u8>, _) = (matched, probe).matched_receive_vec();
                    answers.insert(from, String::from_utf8_lossy(&bytes).into_owned());
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        (0..size)
            .map(|rank| {
                answers.remove(&rank).unwrap_or_else(|| {
                    format!(
                        "rank {rank} did not answer within {:.1} s (computing, stalled or gone)",
                        window.as_secs_f64()
                    )
                })
            })
            .collect()
    }
}
