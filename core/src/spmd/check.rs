//! The communication checker: an independent check of projected (or imported) rank programs.
//!
//! Checks, in order:
//! 1. **Inputs received.** Every compute's inputs from other ranks were received earlier in its
//!    rank's program, every output another rank needs is sent after it is computed, every message
//!    crosses a real stage boundary of its microbatch's route and is sent once and received once,
//!    and every `WaitSend` follows its send.
//! 2. **Matching.** For every ordered pair of ranks, the k-th send from one to the other carries the
//!    same message (direction, stages, microbatch, shape slot) as the k-th receive there.
//! 3. **Blocking rendezvous** (for program sets that claim it, see [`ProgramSet::semantics`]).
//!    Executing every send and receive one at a time, each send completing only together with its
//!    receive, every rank runs to its end.
//! 4. **Batched.** Posting each group's sends and receives together and waiting for its receives
//!    (sends complete when received, by the end of the program at the latest), every rank runs to
//!    its end.
//! 5. **Rendezvous** (for program sets that claim it: imported lowered files). Sends post without
//!    blocking, receives block until their send is posted, and every `WaitSend` blocks until its
//!    send's receive is posted, as a large NCCL send does; every rank runs to its end.
//! 6. **Parameter actions** (PyTorch's `UNSHARD`, `RESHARD`, `REDUCE_GRAD`, `WAIT_REDUCE_GRAD`):
//!    their order in each program, by the rules of [`crate::spmd::params`].
//! 7. **Activation residency** (`Drop`, `R`, `Offload`, `Reload`): their order in each program, by
//!    the rules of [`crate::spmd::residency`].
//!
//! A set that completes under blocking semantics completes batched too: batching posts every
//! operation no later and waits on no more (the first operation a batched run never posted would
//! sit behind a receive whose send the blocking run posted before it). So for the sets that claim
//! blocking semantics, check 3 passing is check 4 passing; check 4 runs for the others.
//!
//! A program set that cannot finish is reported with the cycle of waiting ranks, e.g.
//! `rank 2 waits for recv-grad(stage 5, mb 3) from rank 3; rank 3 waits for ...`.

use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::Task;
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::messages::remote_inputs;
use crate::spmd::params::{check_params, ParamFault, ParamUse};
use crate::spmd::program::{CommOp, Direction, Instr, Message, ProgramSet, RankProgram, Semantics};
use crate::spmd::residency::{check_residency, ResidencyFault};
use std::collections::{HashMap, VecDeque};
use std::fmt;
use thiserror::Error;

/// One rank stuck at one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// The rank.
    pub rank: RankId,
    /// Index of the instruction it is at.
    pub instr: usize,
    /// The operation it waits on.
    pub op: CommOp,
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {} waits at instruction {} for {}",
            self.rank, self.instr, self.op
        )
    }
}

/// Why a program set is unsound.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum CommError {
    /// The programs do not match the problem's rank count.
    #[error("{got} programs for {expected} ranks")]
    RankCount {
        /// Programs given.
        got: usize,
        /// Ranks in the problem.
        expected: usize,
    },
    /// Program `index` says it belongs to another rank.
    #[error("program {index} is labelled rank {rank}; programs must be in rank order")]
    Misnumbered {
        /// Position in the set.
        index: usize,
        /// The rank it names.
        rank: RankId,
    },
    /// A send or receive names a peer that is not a rank of the problem.
    #[error("rank {rank}: {op} names rank {peer}, but there are only {ranks} ranks")]
    PeerOutOfRange {
        /// The rank whose program holds it.
        rank: RankId,
        /// The operation.
        op: CommOp,
        /// The peer it names.
        peer: RankId,
        /// Ranks in the problem.
        ranks: usize,
    },
    /// A compute needs a message that was never received before it.
    #[error("rank {rank}, instruction {instr} ({task}): needs {message} from rank {from}, which it never received before")]
    NotReceived {
        /// The rank.
        rank: RankId,
        /// The compute's index.
        instr: usize,
        /// The compute.
        task: String,
        /// The missing message.
        message: Message,
        /// Who should have sent it.
        from: RankId,
    },
    /// A rank sends something before computing it, or sends what another rank does not consume.
    #[error("rank {rank}, instruction {instr}: {op} is not a message of this plan or comes before its data is computed")]
    BadSend {
        /// The rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The send.
        op: CommOp,
    },
    /// A send or receive names a message that crosses no boundary of its microbatch's route.
    #[error("rank {rank}, instruction {instr}: {op} is not a message of this plan (no such stage boundary on the microbatch's route)")]
    NotAnEdge {
        /// The rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The send or receive.
        op: CommOp,
    },
    /// A message is sent, or received, a second time.
    #[error("rank {rank}, instruction {instr}: {op} repeats a message that already travelled")]
    Repeated {
        /// The rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The repeated send or receive.
        op: CommOp,
    },
    /// The k-th send from one rank to another is not the k-th receive there.
    #[error("rank {from} -> rank {to}: send #{index} carries {sent} but receive #{index} expects {expected}")]
    Mismatch {
        /// Sender.
        from: RankId,
        /// Receiver.
        to: RankId,
        /// Position in the pair's sequence.
        index: usize,
        /// What was sent.
        sent: Message,
        /// What was expected.
        expected: Message,
    },
    /// The counts of sends and receives between two ranks differ.
    #[error(
        "rank {from} -> rank {to}: {sends} sends but {recvs} receives (first unmatched: {first})"
    )]
    CountMismatch {
        /// Sender.
        from: RankId,
        /// Receiver.
        to: RankId,
        /// Sends.
        sends: usize,
        /// Receives.
        recvs: usize,
        /// The first operation without a partner.
        first: Message,
    },
    /// A parameter action is out of order (`instr` None: at the end of the program).
    #[error("rank {rank}, {}: {fault}", .instr.map_or_else(|| "end of program".to_string(), |i| format!("instruction {i}")))]
    Params {
        /// The rank.
        rank: RankId,
        /// The instruction, or None for the end of the program.
        instr: Option<usize>,
        /// What is wrong.
        fault: ParamFault,
    },
    /// A residency instruction (drop, recompute, offload, reload) is out of order.
    #[error("rank {rank}, instruction {instr}: {fault}")]
    Residency {
        /// The rank.
        rank: RankId,
        /// The instruction.
        instr: usize,
        /// What is wrong.
        fault: ResidencyFault,
    },
    /// The programs cannot finish under the given semantics.
    #[error("deadlock under {semantics} semantics: {}", describe(.cycle))]
    Deadlock {
        /// The semantics.
        semantics: Semantics,
        /// The cycle of waiting ranks.
        cycle: Vec<Waiting>,
    },
}

fn describe(cycle: &[Waiting]) -> String {
    cycle
        .iter()
        .map(Waiting::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a successful check measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckReport {
    /// Messages exchanged.
    pub messages: usize,
    /// Communication groups.
    pub groups: usize,
    /// The kinds of parameter action the programs hold (their order checked).
    pub params: ParamUse,
}

/// Runs every check of the module doc.
///
/// The programs are read twice: once for check 1, which also counts each ordered pair's sends
/// and receives, and once to number those in a [`CommReplay`], which checks 2 to 5 then use
/// without going back to the programs.
pub fn check_programs(problem: &Problem, set: &ProgramSet) -> Result<CheckReport, CommError> {
    let ranks = problem.ranks() as usize;
    if set.programs.len() != ranks {
        return Err(CommError::RankCount {
            got: set.programs.len(),
            expected: ranks,
        });
    }
    check_numbering(set)?;
    let traffic = check_dataflow(problem, set)?;
    let counts = traffic.counts?;
    let replay = CommReplay::new(set, &counts, Some(OpSlots::of(problem)));
    let messages = replay.check_matching()?;
    if set.semantics != Semantics::Batched {
        replay.run(set.semantics)?;
    }
    if set.semantics != Semantics::Blocking {
        replay.run(Semantics::Batched)?;
    }
    let params = check_params(problem, set).map_err(|(rank, instr, fault)| CommError::Params {
        rank,
        instr,
        fault,
    })?;
    check_residency(problem, set).map_err(|(rank, instr, fault)| CommError::Residency {
        rank,
        instr,
        fault,
    })?;
    Ok(CheckReport {
        messages,
        groups: traffic.groups,
        params,
    })
}

/// Program `i` must be rank `i`'s.
fn check_numbering(set: &ProgramSet) -> Result<(), CommError> {
    match set
        .programs
        .iter()
        .enumerate()
        .find(|(i, p)| p.rank.index() != *i)
    {
        Some((index, p)) => Err(CommError::Misnumbered {
            index,
            rank: p.rank,
        }),
        None => Ok(()),
    }
}

/// Dense index of a message: (receiving stage, microbatch) names its pair, the direction the
/// rest (the route gives the sending stage). None when out of range.
fn message_index(slots: OpSlots, m: &Message) -> Option<usize> {
    let direction = usize::from(m.direction == Direction::Gradient);
    slots
        .pair(m.to_stage, m.microbatch)
        .map(|pair| pair * 2 + direction)
}

/// The ordered pair of ranks a send or receive of `rank` belongs to (`from · ranks + to`), and
/// whether it is the send; None when the peer is out of range.
fn pair_of(rank: RankId, op: &CommOp, ranks: usize) -> Option<(usize, bool)> {
    match *op {
        CommOp::Send { to, .. } if to.index() < ranks => {
            Some((rank.index() * ranks + to.index(), true))
        }
        CommOp::Recv { from, .. } if from.index() < ranks => {
            Some((from.index() * ranks + rank.index(), false))
        }
        _ => None,
    }
}

/// Per ordered pair of ranks (`from · ranks + to`), its receives and its sends.
type PairCounts = Vec<[usize; 2]>;

/// Counts one send or receive of `rank` in `counts`; a peer out of range is left out and is
/// check 2's error.
fn count(
    counts: &mut PairCounts,
    ranks: usize,
    rank: RankId,
    op: &CommOp,
) -> Result<(), CommError> {
    let (pair, is_send) = pair_of(rank, op, ranks).ok_or(CommError::PeerOutOfRange {
        rank,
        op: *op,
        peer: op.peer(),
        ranks,
    })?;
    counts[pair][usize::from(is_send)] += 1;
    Ok(())
}

/// Counts every send and receive of `set` per ordered pair of ranks, with check 2's error for
/// the first peer out of range (left out of the counts).
fn pair_counts(set: &ProgramSet) -> (PairCounts, Option<CommError>) {
    let ranks = set.programs.len();
    let mut counts = vec![[0; 2]; ranks * ranks];
    let mut stray = None;
    for p in &set.programs {
        for (_, op) in p.comm_ops() {
            if let Err(e) = count(&mut counts, ranks, p.rank, op) {
                stray.get_or_insert(e);
            }
        }
    }
    (counts, stray)
}

/// What the pass of check 1 counted on the way: the sends and receives of every ordered pair
/// (or check 2's error for the first peer out of range) and the communication groups.
struct Traffic {
    counts: Result<PairCounts, CommError>,
    groups: usize,
}

/// What check 1 has seen so far, in tables indexed by message ([`message_index`]) and op.
/// Stamps instead of clearing: an entry equal to `rank + 1` means "on this rank".
struct Dataflow<'a> {
    links: &'a Links,
    slots: OpSlots,
    /// Per message, the rank that received it last.
    received: Vec<u32>,
    /// Per op, the rank that computed it last.
    computed: Vec<u32>,
    /// Per message, the rank that sent it and to whom (every message is sent once).
    sent: Vec<Option<(u32, RankId)>>,
    /// Per message, whether it was received (every message is received once).
    receives: Vec<bool>,
}

impl Dataflow<'_> {
    /// A send or receive of `rank`'s instruction `instr`.
    fn comm(&mut self, rank: RankId, instr: usize, op: &CommOp) -> Result<(), CommError> {
        let stamp = rank.get() + 1;
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
                self.received[k] = stamp;
                if std::mem::replace(&mut self.receives[k], true) {
                    return Err(repeated());
                }
            }
            CommOp::Send { to, .. } => {
                if self.sent[k].is_some() {
                    return Err(repeated());
                }
                self.sent[k] = Some((stamp, to));
                let done = self
                    .slots
                    .op(message.producer())
                    .is_some_and(|p| self.computed[p] == stamp);
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
                .is_some_and(|k| self.sent[k] == Some((rank.get() + 1, to)));
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
        let stamp = rank.get() + 1;
        for input in remote_inputs(self.links, rank, task) {
            let received = message_index(self.slots, &input.message)
                .is_some_and(|k| self.received[k] == stamp);
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
                self.computed[k] = stamp;
            }
        }
        Ok(())
    }
}

/// Check 1: every cross-rank input is received before the compute using it, and every send
/// carries data computed earlier on its rank. On the way, counts what check 2 needs.
fn check_dataflow(problem: &Problem, set: &ProgramSet) -> Result<Traffic, CommError> {
    let links = Links::of(problem);
    let slots = links.slots();
    let messages = slots.pairs() * 2;
    let mut flow = Dataflow {
        links: &links,
        slots,
        received: vec![0; messages],
        computed: vec![0; slots.len()],
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
    let (stage, microbatch) = (message.from_stage, message.microbatch);
    let expected = match message.direction {
        Direction::Activation => links
            .next(stage, microbatch)
            .map(|next| Message::activation(stage, next, microbatch)),
        Direction::Gradient => links
            .prev(stage, microbatch)
            .map(|prev| Message::gradient(stage, prev, microbatch)),
    };
    expected == Some(*message)
}

/// Check 2 on its own, for programs whose messages all cross route edges (check 1): per ordered
/// pair, the k-th send is the k-th receive. Returns the message count.
#[cfg(test)]
fn check_matching(problem: &Problem, set: &ProgramSet) -> Result<usize, CommError> {
    match pair_counts(set) {
        (_, Some(stray)) => Err(stray),
        (counts, None) => {
            CommReplay::new(set, &counts, Some(OpSlots::of(problem))).check_matching()
        }
    }
}

/// Marks a slot's partner that no program posts (fewer operations on the other side).
const NEVER: u32 = u32::MAX;
/// [`Slot::meta`]'s bits above the peer: a send, the first operation of a group, a wait.
const SEND: u32 = 1 << 16;
const OPENS: u32 = 1 << 17;
const WAIT: u32 = 1 << 18;

/// One send, receive or wait of the communication replay: its instruction, its flag and its
/// partner's in the table of posted operations, and its peer with what kind of operation it is
/// (ranks are fewer than [`crate::ir::problem::MAX_RANKS`], so a peer takes 16 bits).
#[derive(Clone, Copy)]
struct Slot {
    instr: u32,
    /// Its place in the posted table (for a wait, its send's).
    flag: u32,
    /// Its partner's place ([`NEVER`] when there is none).
    partner: u32,
    /// The peer, and [`SEND`], [`OPENS`] and [`WAIT`].
    meta: u32,
}

impl Slot {
    fn peer(&self) -> usize {
        (self.meta & 0xffff) as usize
    }

    fn is(&self, bit: u32) -> bool {
        self.meta & bit != 0
    }

    /// Whether the rank must wait for this operation's partner before going on: a wait always;
    /// a send only under blocking semantics; a receive always.
    fn blocks(&self, semantics: Semantics) -> bool {
        self.is(WAIT) || !self.is(SEND) || semantics == Semantics::Blocking
    }
}

/// The communication of a program set reduced to what completion depends on: per rank, its
/// sends, receives and waits in program order, each numbered within its ordered pair of ranks.
/// The posted table holds, pair after pair, the pair's receives then its sends, so the k-th
/// send of a pair has the flag its k-th receive waits on, and the messages' indices laid out in
/// the same order are what check 2 compares. Built once, run under each semantics: one operation
/// per unit under blocking and rendezvous semantics, one group per unit under batched.
struct CommReplay<'a> {
    set: &'a ProgramSet,
    /// Per rank, its slots.
    slots: Vec<Vec<Slot>>,
    /// Per pair and direction (receives, sends), where its flags start, and how many it has.
    pairs: Vec<[(usize, usize); 2]>,
    /// The index ([`message_index`]) of every send's and receive's message, at its flag: one
    /// message each once check 1 has found every message on a route edge.
    messages: Vec<u32>,
}

impl<'a> CommReplay<'a> {
    /// Numbers every send and receive within its ordered pair of ranks (`counts` per pair, from
    /// [`pair_counts`]), with its message's index when `slots` number the messages. Peers out of
    /// range are left out (check 2 reports them); a wait joins the latest earlier send of its
    /// message.
    fn new(set: &'a ProgramSet, counts: &PairCounts, slots: Option<OpSlots>) -> CommReplay<'a> {
        let ranks = set.programs.len();
        let mut total = 0;
        let pairs: Vec<[(usize, usize); 2]> = counts
            .iter()
            .map(|count| {
                [0, 1].map(|d| {
                    total += count[d];
                    (total - count[d], count[d])
                })
            })
            .collect();
        let mut messages = vec![NEVER; if slots.is_some() { total } else { 0 }];
        let mut next: Vec<[usize; 2]> = pairs.iter().map(|p| [p[0].0, p[1].0]).collect();
        let mut all: Vec<Vec<Slot>> = Vec::with_capacity(ranks);
        for p in &set.programs {
            let mut rank_slots = Vec::with_capacity(p.instrs.len());
            let mut sends = WaitedSends::default();
            for (i, instr) in p.instrs.iter().enumerate() {
                if let Instr::WaitSend { to, message } = *instr {
                    if let Some(k) = sends.latest(&rank_slots, p, ranks, to, message) {
                        let send: Slot = rank_slots[k];
                        rank_slots.push(Slot {
                            instr: i as u32,
                            meta: send.meta | OPENS | WAIT,
                            ..send
                        });
                    }
                    continue;
                }
                let Instr::Comm(g) = instr else { continue };
                let mut opens = OPENS;
                for op in &g.ops {
                    let Some((pair, is_send)) = pair_of(p.rank, op, ranks) else {
                        continue;
                    };
                    let (mine, theirs) = (usize::from(is_send), usize::from(!is_send));
                    let flag = next[pair][mine];
                    next[pair][mine] += 1;
                    let ordinal = flag - pairs[pair][mine].0;
                    let (start, count) = pairs[pair][theirs];
                    if let Some(slots) = slots {
                        let index = message_index(slots, &op.message());
                        messages[flag] = index.map_or(NEVER, |k| k as u32);
                    }
                    if is_send {
                        sends.record(op, rank_slots.len());
                    }
                    let send = if is_send { SEND } else { 0 };
                    rank_slots.push(Slot {
                        instr: i as u32,
                        flag: flag as u32,
                        partner: if ordinal < count {
                            (start + ordinal) as u32
                        } else {
                            NEVER
                        },
                        meta: op.peer().get() | send | opens,
                    });
                    opens = 0;
                }
            }
            all.push(rank_slots);
        }
        CommReplay {
            set,
            slots: all,
            pairs,
            messages,
        }
    }

    /// Check 2: per ordered pair, the k-th send is the k-th receive (the replay numbered the
    /// messages). Returns the message count.
    fn check_matching(&self) -> Result<usize, CommError> {
        let ranks = self.slots.len();
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

    /// Size of the posted table.
    fn flags(&self) -> usize {
        self.pairs
            .last()
            .map_or(0, |[_, (start, count)]| start + count)
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

/// The operation of slot `k` of `program`'s slots (in a set of `ranks` programs): the send a
/// wait waits on, or one operation of a group (a group's slots are its operations with a peer in
/// range, in order).
fn slot_op(program: &RankProgram, ranks: usize, slots: &[Slot], k: usize) -> CommOp {
    let slot = slots[k];
    match &program.instrs[slot.instr as usize] {
        Instr::WaitSend { to, message } => CommOp::Send {
            to: *to,
            message: *message,
        },
        Instr::Comm(g) => {
            let first = slots[..k]
                .iter()
                .rposition(|s| s.instr != slot.instr)
                .map_or(0, |p| p + 1);
            *g.ops
                .iter()
                .filter(|op| op.peer().index() < ranks)
                .nth(k - first)
                .expect("a slot of a group is one of its operations")
        }
        _ => unreachable!("slots are made of waits and communication groups"),
    }
}

/// The sends of one program a `WaitSend` may wait on, each message at its latest send: kept
/// from the program's first wait on (the projected programs have none, and pay nothing).
#[derive(Default)]
struct WaitedSends {
    latest: Option<HashMap<(RankId, Message), usize>>,
}

impl WaitedSends {
    /// Remembers that slot `k` sends `op`, once waits have been seen.
    fn record(&mut self, op: &CommOp, k: usize) {
        if let (Some(latest), CommOp::Send { to, message }) = (&mut self.latest, *op) {
            latest.insert((to, message), k);
        }
    }

    /// The slot of the latest earlier send of `message` to `to` among `slots` (program `p`'s so
    /// far, in a set of `ranks`); at the first wait, the sends so far are indexed.
    fn latest(
        &mut self,
        slots: &[Slot],
        p: &RankProgram,
        ranks: usize,
        to: RankId,
        message: Message,
    ) -> Option<usize> {
        let latest = self.latest.get_or_insert_with(|| {
            let mut sends = HashMap::new();
            for (k, s) in slots.iter().enumerate() {
                if s.is(SEND) && !s.is(WAIT) {
                    if let CommOp::Send { to, message } = slot_op(p, ranks, slots, k) {
                        sends.insert((to, message), k);
                    }
                }
            }
            sends
        });
        latest.get(&(to, message)).copied()
    }
}

/// One run of a [`CommReplay`] under one semantics: which flags are posted and where each rank is.
struct CommRun<'r, 'a> {
    replay: &'r CommReplay<'a>,
    semantics: Semantics,
    posted: Vec<bool>,
    /// Per rank, the slot its next unit starts at.
    position: Vec<usize>,
}

impl CommReplay<'_> {
    /// Checks 3 to 5 under `semantics`: every rank runs to its end, or the cycle of waiting
    /// ranks.
    fn run(&self, semantics: Semantics) -> Result<(), CommError> {
        let mut run = CommRun {
            replay: self,
            semantics,
            posted: vec![false; self.flags()],
            position: vec![0; self.slots.len()],
        };
        run.advance();
        if run.finished() {
            return Ok(());
        }
        Err(CommError::Deadlock {
            semantics,
            cycle: run.wait_cycle(),
        })
    }
}

impl CommRun<'_, '_> {
    /// The end of the unit starting at slot `start` of rank `r`.
    fn unit_end(&self, r: usize, start: usize) -> usize {
        let slots = &self.replay.slots[r];
        match self.semantics {
            Semantics::Batched => {
                let rest = slots[start + 1..].iter().position(|s| s.is(OPENS));
                rest.map_or(slots.len(), |k| start + 1 + k)
            }
            Semantics::Blocking | Semantics::Rendezvous => start + 1,
        }
    }

    fn partner_posted(&self, s: &Slot) -> bool {
        s.partner != NEVER && self.posted[s.partner as usize]
    }

    /// Advances every rank as far as it can: a rank posts its next unit, then completes it once
    /// every blocking operation's partner is posted. Posting wakes the peers.
    fn advance(&mut self) {
        let ranks = self.replay.slots.len();
        let mut posted_until = vec![0usize; ranks];
        let mut queue: VecDeque<usize> = (0..ranks).collect();
        let mut queued = vec![true; ranks];
        while let Some(r) = queue.pop_front() {
            queued[r] = false;
            let slots = &self.replay.slots[r];
            while self.position[r] < slots.len() {
                let start = self.position[r];
                let end = self.unit_end(r, start);
                if posted_until[r] <= start {
                    posted_until[r] = end;
                    for s in &slots[start..end] {
                        self.posted[s.flag as usize] = true;
                        let p = s.peer();
                        if p != r && !queued[p] {
                            queued[p] = true;
                            queue.push_back(p);
                        }
                    }
                }
                let unit = &slots[start..end];
                if !unit
                    .iter()
                    .all(|s| !s.blocks(self.semantics) || self.partner_posted(s))
                {
                    break;
                }
                self.position[r] = end;
            }
        }
    }

    fn finished(&self) -> bool {
        (self.replay.slots.iter().zip(&self.position)).all(|(slots, &at)| at == slots.len())
    }

    /// The operation rank `r` is stuck at, with its instruction index.
    fn waiting_op(&self, r: usize) -> Option<(usize, CommOp)> {
        let start = self.position[r];
        if start >= self.replay.slots[r].len() {
            return None;
        }
        let end = self.unit_end(r, start);
        let slots = &self.replay.slots[r];
        let k = start
            + slots[start..end]
                .iter()
                .position(|s| s.blocks(self.semantics) && !self.partner_posted(s))?;
        let program = &self.replay.set.programs[r];
        let op = slot_op(program, self.replay.slots.len(), slots, k);
        Some((slots[k].instr as usize, op))
    }

    /// The cycle: follow "rank waits for an op whose partner its peer has not posted" from the
    /// first unfinished rank until a rank repeats.
    fn wait_cycle(&self) -> Vec<Waiting> {
        let ranks = self.replay.slots.len();
        let Some(start) = (0..ranks).find(|&r| self.position[r] < self.replay.slots[r].len())
        else {
            return Vec::new();
        };
        let mut path: Vec<Waiting> = Vec::new();
        let mut seen = vec![usize::MAX; ranks];
        let mut r = start;
        while let Some((instr, op)) = self.waiting_op(r) {
            if seen[r] != usize::MAX {
                path.drain(..seen[r]);
                break;
            }
            seen[r] = path.len();
            path.push(Waiting {
                rank: RankId::new(r as u32),
                instr,
                op,
            });
            r = op.peer().index();
            if r >= ranks {
                break;
            }
        }
        path
    }
}

/// Checks 3 and 4: runs the programs' communication under `semantics`. Peers out of range are
/// ignored here (check 2 reports them).
pub fn simulate_comm(set: &ProgramSet, semantics: Semantics) -> Result<(), CommError> {
    check_numbering(set)?;
    let (counts, _) = pair_counts(set);
    CommReplay::new(set, &counts, None).run(semantics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spmd::program::CommGroup;
    use crate::spmd::project::{project, ProjectionOptions};

    fn one_f_one_b() -> (Problem, ProgramSet) {
        let plan = crate::testing::plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
        let set = project(&plan, ProjectionOptions::default()).unwrap();
        (plan.problem().clone(), set)
    }

    /// Removes the first communication group of `rank` that holds an op matching `pick`.
    fn drop_op(set: &mut ProgramSet, rank: usize, pick: impl Fn(&CommOp) -> bool) -> CommOp {
        for instr in &mut set.programs[rank].instrs {
            if let Instr::Comm(group) = instr {
                if let Some(i) = group.ops.iter().position(&pick) {
                    let mut ops = group.ops.to_vec();
                    let op = ops.remove(i);
                    group.ops = ops.into();
                    return op;
                }
            }
        }
        panic!("no such op on rank {rank}")
    }

    #[test]
    fn projected_programs_pass_and_are_counted() {
        let (problem, set) = one_f_one_b();
        let report = check_programs(&problem, &set).unwrap();
        assert_eq!(report.messages, 4);
        assert!(report.groups >= 4);
    }

    #[test]
    fn a_missing_receive_is_named_with_its_compute() {
        let (problem, mut set) = one_f_one_b();
        drop_op(&mut set, 1, |op| matches!(op, CommOp::Recv { .. }));
        let err = check_programs(&problem, &set).unwrap_err();
        assert!(matches!(err, CommError::NotReceived { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("needs act(stage 0 -> 1, mb 0) from rank 0"),
            "{err}"
        );
    }

    #[test]
    fn unmatched_and_mismatched_messages_are_reported() {
        let (problem, mut set) = one_f_one_b();
        drop_op(&mut set, 0, |op| matches!(op, CommOp::Send { .. }));
        let err = check_matching(&problem, &set).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rank 0 -> rank 1: send #0 carries act(stage 0 -> 1, mb 1) but receive #0 expects act(stage 0 -> 1, mb 0)"
        );
        let (problem, mut set) = one_f_one_b();
        drop_op(
            &mut set,
            1,
            |op| matches!(op, CommOp::Send { message, .. } if message.microbatch.get() == 1),
        );
        let err = check_matching(&problem, &set).unwrap_err();
        assert!(
            matches!(
                err,
                CommError::CountMismatch {
                    sends: 1,
                    recvs: 2,
                    ..
                }
            ),
            "{err}"
        );
        let (problem, mut set) = one_f_one_b();
        for instr in &mut set.programs[1].instrs {
            if let Instr::Comm(CommGroup { ops }) = instr {
                for op in ops {
                    if let CommOp::Recv { message, .. } = op {
                        message.microbatch =
                            crate::ir::ids::MicrobatchId::new(1 - message.microbatch.get());
                    }
                }
            }
        }
        assert!(matches!(
            check_matching(&problem, &set),
            Err(CommError::Mismatch { .. })
        ));
    }

    #[test]
    fn a_send_exchange_deadlocks_under_blocking_semantics_only() {
        // Two ranks each send first, then receive: fine when batched, a cycle when blocking.
        let message = |from: u32, to: u32| Message::activation(from.into(), to.into(), 0.into());
        let program = |rank: u32, peer: u32| crate::spmd::program::RankProgram {
            rank: RankId::new(rank),
            instrs: vec![
                Instr::Comm(CommGroup {
                    ops: vec![CommOp::Send {
                        to: RankId::new(peer),
                        message: message(rank, peer),
                    }]
                    .into(),
                }),
                Instr::Comm(CommGroup {
                    ops: vec![CommOp::Recv {
                        from: RankId::new(peer),
                        message: message(peer, rank),
                    }]
                    .into(),
                }),
            ],
        };
        let set = ProgramSet {
            programs: vec![program(0, 1), program(1, 0)],
            forward_only: false,
            semantics: Semantics::Blocking,
        };
        assert!(simulate_comm(&set, Semantics::Batched).is_ok());
        let err = simulate_comm(&set, Semantics::Blocking).unwrap_err();
        assert_eq!(
            err.to_string(),
            "deadlock under blocking rendezvous semantics: rank 0 waits at instruction 0 for send-act(stage 0, mb 0) to rank 1; rank 1 waits at instruction 0 for send-act(stage 1, mb 0) to rank 0"
        );
    }

    #[test]
    fn a_message_across_no_boundary_is_rejected() {
        // Found by the fuzzer: a send and its receive both retargeted to a stage two hops away.
        let (problem, mut set) = one_f_one_b();
        let bogus = |m: &mut Message| m.to_stage = crate::ir::ids::StageId::new(0);
        for program in &mut set.programs {
            for instr in &mut program.instrs {
                if let Instr::Comm(CommGroup { ops }) = instr {
                    for op in ops {
                        match op {
                            CommOp::Send { message, .. } | CommOp::Recv { message, .. } => {
                                if message.direction == Direction::Activation {
                                    bogus(message)
                                }
                            }
                        }
                    }
                }
            }
        }
        let err = check_programs(&problem, &set).unwrap_err();
        assert!(matches!(err, CommError::NotAnEdge { .. }), "{err}");
    }

    #[test]
    fn a_message_sent_twice_is_rejected() {
        // Found by the fuzzer: a duplicated send group and receive group matched pairwise.
        let (problem, mut set) = one_f_one_b();
        for rank in [0, 1] {
            let instrs = &mut set.programs[rank].instrs;
            let first = instrs
                .iter()
                .position(|i| matches!(i, Instr::Comm(_)))
                .unwrap();
            let copy = instrs[first].clone();
            instrs.insert(first + 1, copy);
        }
        let err = check_programs(&problem, &set).unwrap_err();
        assert!(matches!(err, CommError::Repeated { .. }), "{err}");
    }

    #[test]
    fn numbering_and_peers_are_checked_before_anything_else() {
        let (problem, mut set) = one_f_one_b();
        set.programs.swap(0, 1);
        assert!(matches!(
            check_programs(&problem, &set),
            Err(CommError::Misnumbered { index: 0, .. })
        ));
        let (problem, mut set) = one_f_one_b();
        set.programs.pop();
        assert!(matches!(
            check_programs(&problem, &set),
            Err(CommError::RankCount {
                got: 1,
                expected: 2
            })
        ));
    }
}
