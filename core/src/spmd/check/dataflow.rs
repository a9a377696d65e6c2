//! Checks 1 and 2 of the checker, what travels: every input received before its compute, every
//! send after its data is computed, every message on a route edge and travelling once, every
//! wait after its send ([`check_dataflow`]); and per ordered pair of ranks, the k-th send is the
//! k-th receive ([`CommReplay::check_matching`]).

use super::error::CommError;
use super::pairs::{count, message_index, Index, PairCounts};
use super::replay::CommReplay;
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::Task;
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::messages::{edge_message, remote_inputs};
use crate::spmd::program::{CommOp, Instr, Message, ProgramSet};

/// What the pass of check 1 counted on the way: the sends and receives of every ordered pair
/// (or check 2's error for the first peer out of range) and the communication groups.
pub(super) struct Traffic {
    pub(super) counts: Result<PairCounts, CommError>,
    pub(super) groups: usize,
}

/// What check 1 has seen so far, in tables indexed by message ([`message_index`]) and op. An
/// entry naming a rank ([`Index::rank`]) means "on this rank": the tables are not cleared
/// between ranks.
struct Dataflow<'a> {
    links: &'a Links,
    slots: OpSlots,
    /// Per message, the rank that received it last.
    received: Vec<Option<Index>>,
    /// Per op, the rank that computed it last.
    computed: Vec<Option<Index>>,
    /// Per message, the rank that sent it and to whom (every message is sent once).
    sent: Vec<Option<(Index, RankId)>>,
    /// Per message, whether it was received (every message is received once).
    receives: Vec<bool>,
}

impl Dataflow<'_> {
    /// A send or receive of `rank`'s instruction `instr`.
    fn comm(&mut self, rank: RankId, instr: usize, op: &CommOp) -> Result<(), CommError> {
        let here = Some(Index::rank(rank));
        let message = op.message();
        let k = match message_index(self.slots, &message) {
            Some(k) if is_edge(self.links, &message) => k,
            _ => {
                return Err(CommError::NotAnEdge {
                    rank,
                    instr,
                    op: *op,
                })
            }
        };
        let repeated = || CommError::Repeated {
            rank,
            instr,
            op: *op,
        };
        match *op {
            CommOp::Recv { .. } => {
                self.received[k] = here;
                if std::mem::replace(&mut self.receives[k], true) {
                    return Err(repeated());
                }
            }
            CommOp::Send { to, .. } => {
                if self.sent[k].is_some() {
                    return Err(repeated());
                }
                self.sent[k] = Some((Index::rank(rank), to));
                let done = self
                    .slots
                    .op(message.producer())
                    .is_some_and(|p| self.computed[p] == here);
                if !done || self.links.owner(message.from_stage) != Some(rank) {
                    return Err(CommError::BadSend {
                        rank,
                        instr,
                        op: *op,
                    });
                }
            }
        }
        Ok(())
    }

    /// A wait on an earlier send of `rank`: every send checked so far is a route edge, sent
    /// once, so the message's entry says whether this rank sent it to `to`.
    fn wait(
        &self,
        rank: RankId,
        instr: usize,
        to: RankId,
        message: Message,
    ) -> Result<(), CommError> {
        let sent = is_edge(self.links, &message)
            && message_index(self.slots, &message)
                .is_some_and(|k| self.sent[k] == Some((Index::rank(rank), to)));
        if sent {
            return Ok(());
        }
        Err(CommError::BadSend {
            rank,
            instr,
            op: CommOp::Send { to, message },
        })
    }

    /// A compute: its inputs from other ranks were received before it.
    fn compute(&mut self, rank: RankId, instr: usize, task: &Task) -> Result<(), CommError> {
        let here = Some(Index::rank(rank));
        for input in remote_inputs(self.links, rank, task) {
            let received =
                message_index(self.slots, &input.message).is_some_and(|k| self.received[k] == here);
            if !received {
                return Err(CommError::NotReceived {
                    rank,
                    instr,
                    task: task.to_string(),
                    message: input.message,
                    from: input.from,
                });
            }
        }
        let (ops, count) = task.op_array();
        for &op in &ops[..count] {
            if let Some(k) = self.slots.op(op) {
                self.computed[k] = here;
            }
        }
        Ok(())
    }
}

/// Check 1: every cross-rank input is received before the compute using it, and every send
/// carries data computed earlier on its rank. On the way, counts what check 2 needs.
pub(super) fn check_dataflow(problem: &Problem, set: &ProgramSet) -> Result<Traffic, CommError> {
    let links = Links::of(problem);
    let slots = links.slots();
    let messages = slots.pairs() * 2;
    let mut flow = Dataflow {
        links: &links,
        slots,
        received: vec![None; messages],
        computed: vec![None; slots.len()],
        sent: vec![None; messages],
        receives: vec![false; messages],
    };
    let ranks = set.programs.len();
    let mut traffic = Traffic {
        counts: Ok(vec![[0; 2]; ranks * ranks]),
        groups: 0,
    };
    for program in &set.programs {
        let rank = program.rank;
        for (i, instr) in program.instrs.iter().enumerate() {
            match instr {
                Instr::Comm(group) => {
                    traffic.groups += 1;
                    for op in &group.ops {
                        flow.comm(rank, i, op)?;
                        if let Ok(counts) = &mut traffic.counts {
                            if let Err(stray) = count(counts, ranks, rank, op) {
                                traffic.counts = Err(stray);
                            }
                        }
                    }
                }
                Instr::WaitSend { to, message } => flow.wait(rank, i, *to, *message)?,
                Instr::Compute(task) => flow.compute(rank, i, task)?,
                _ => {}
            }
        }
    }
    Ok(traffic)
}

/// Whether `message` crosses a real boundary of its microbatch's route: an activation from a stage
/// to the next, a gradient from a stage to the previous, with that boundary's shape slot.
fn is_edge(links: &Links, message: &Message) -> bool {
    edge_message(
        links,
        message.from_stage,
        message.microbatch,
        message.direction,
    ) == Some(*message)
}

impl CommReplay<'_> {
    /// Check 2: per ordered pair, the k-th send is the k-th receive (the replay numbered the
    /// messages). Returns the message count.
    pub(super) fn check_matching(&self) -> Result<usize, CommError> {
        let ranks = self.set.programs.len();
        let mut total = 0;
        for (pair, [(r_start, r_count), (s_start, s_count)]) in self.pairs.iter().enumerate() {
            let (from, to) = (
                RankId::new((pair / ranks) as u32),
                RankId::new((pair % ranks) as u32),
            );
            let s = &self.messages[*s_start..s_start + s_count];
            let r = &self.messages[*r_start..r_start + r_count];
            let nth = |is_send, k| self.nth_message(from, to, is_send, k);
            if let Some(index) = s
                .iter()
                .zip(r)
                .position(|(sent, expected)| sent != expected)
            {
                return Err(CommError::Mismatch {
                    from,
                    to,
                    index,
                    sent: nth(true, index),
                    expected: nth(false, index),
                });
            }
            if s.len() != r.len() {
                let first = if s.len() > r.len() {
                    nth(true, r.len())
                } else {
                    nth(false, s.len())
                };
                return Err(CommError::CountMismatch {
                    from,
                    to,
                    sends: s.len(),
                    recvs: r.len(),
                    first,
                });
            }
            total += s.len();
        }
        Ok(total)
    }

    /// The message of the k-th send from `from` to `to` (or of the k-th receive there), read
    /// back from the programs to name a mismatch.
    fn nth_message(&self, from: RankId, to: RankId, is_send: bool, k: usize) -> Message {
        let (rank, peer) = if is_send { (from, to) } else { (to, from) };
        self.set.programs[rank.index()]
            .comm_ops()
            .map(|(_, op)| op)
            .filter(|op| matches!(op, CommOp::Send { .. }) == is_send && op.peer() == peer)
            .nth(k)
            .map(CommOp::message)
            .expect("the replay counted the operation")
    }
}
