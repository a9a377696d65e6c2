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
//!
//! A program set that cannot finish is reported with the cycle of waiting ranks, e.g.
//! `rank 2 waits for recv-grad(stage 5, mb 3) from rank 3; rank 3 waits for ...`.

use crate::ir::ids::RankId;
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::messages::remote_inputs;
use crate::spmd::program::{CommOp, Direction, Instr, Message, ProgramSet, Semantics};
use std::collections::VecDeque;
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
}

/// Runs every check of the module doc.
pub fn check_programs(problem: &Problem, set: &ProgramSet) -> Result<CheckReport, CommError> {
    let ranks = problem.ranks() as usize;
    if set.programs.len() != ranks {
        return Err(CommError::RankCount {
            got: set.programs.len(),
            expected: ranks,
        });
    }
    check_numbering(set)?;
    check_dataflow(problem, set)?;
    let messages = check_matching(set)?;
    if set.semantics != Semantics::Batched {
        simulate_comm(set, set.semantics)?;
    }
    simulate_comm(set, Semantics::Batched)?;
    let groups = set
        .programs
        .iter()
        .flat_map(|p| &p.instrs)
        .filter(|i| matches!(i, Instr::Comm(_)))
        .count();
    Ok(CheckReport { messages, groups })
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

/// Check 1: every cross-rank input is received before the compute using it, and every send
/// carries data computed earlier on its rank.
fn check_dataflow(problem: &Problem, set: &ProgramSet) -> Result<(), CommError> {
    let slots = OpSlots::of(problem);
    // Stamps instead of clearing: entry == rank + 1 means "on this rank".
    let mut received = vec![0u32; slots.pairs() * 2];
    let mut computed = vec![0u32; slots.len()];
    // Every message travels once: its sends and receives over all ranks.
    let mut sends = vec![0u8; slots.pairs() * 2];
    let mut receives = vec![0u8; slots.pairs() * 2];
    for program in &set.programs {
        let rank = program.rank;
        let stamp = rank.get() + 1;
        for (i, instr) in program.instrs.iter().enumerate() {
            match instr {
                Instr::Comm(group) => {
                    for op in &group.ops {
                        match *op {
                            CommOp::Recv { message, .. } if !is_edge(problem, &message) => {
                                return Err(CommError::NotAnEdge {
                                    rank,
                                    instr: i,
                                    op: *op,
                                })
                            }
                            CommOp::Send { message, .. } if !is_edge(problem, &message) => {
                                return Err(CommError::NotAnEdge {
                                    rank,
                                    instr: i,
                                    op: *op,
                                })
                            }
                            CommOp::Recv { message, .. } => {
                                if let Some(k) = message_index(slots, &message) {
                                    received[k] = stamp;
                                    once(&mut receives[k], rank, i, op)?;
                                }
                            }
                            CommOp::Send { message, .. } => {
                                if let Some(k) = message_index(slots, &message) {
                                    once(&mut sends[k], rank, i, op)?;
                                }
                                let done = slots
                                    .op(message.producer())
                                    .is_some_and(|k| computed[k] == stamp);
                                if !done || problem.rank_of(message.from_stage) != Some(rank) {
                                    return Err(CommError::BadSend {
                                        rank,
                                        instr: i,
                                        op: *op,
                                    });
                                }
                            }
                        }
                    }
                }
                Instr::WaitSend { to, message } => {
                    let sent = program.instrs[..i].iter().any(|earlier| match earlier {
                        Instr::Comm(g) => g.ops.contains(&CommOp::Send {
                            to: *to,
                            message: *message,
                        }),
                        _ => false,
                    });
                    if !sent {
                        return Err(CommError::BadSend {
                            rank,
                            instr: i,
                            op: CommOp::Send {
                                to: *to,
                                message: *message,
                            },
                        });
                    }
                }
                Instr::Compute(task) => {
                    for input in remote_inputs(problem, rank, task) {
                        if message_index(slots, &input.message).is_none_or(|k| received[k] != stamp)
                        {
                            return Err(CommError::NotReceived {
                                rank,
                                instr: i,
                                task: task.to_string(),
                                message: input.message,
                                from: input.from,
                            });
                        }
                    }
                    for op in task.ops() {
                        if let Some(k) = slots.op(op) {
                            computed[k] = stamp;
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Whether `message` crosses a real boundary of its microbatch's route: an activation from a stage
/// to the next, a gradient from a stage to the previous, with that boundary's shape slot.
fn is_edge(problem: &Problem, message: &Message) -> bool {
    let Some(route) = problem.route_of(message.microbatch) else {
        return false;
    };
    let expected = match message.direction {
        Direction::Activation => route
            .next(message.from_stage)
            .map(|next| Message::activation(message.from_stage, next, message.microbatch)),
        Direction::Gradient => route
            .prev(message.from_stage)
            .map(|prev| Message::gradient(message.from_stage, prev, message.microbatch)),
    };
    expected == Some(*message)
}

/// Counts one send (or receive) of a message; a second one is an error.
fn once(count: &mut u8, rank: RankId, instr: usize, op: &CommOp) -> Result<(), CommError> {
    if *count > 0 {
        return Err(CommError::Repeated {
            rank,
            instr,
            op: *op,
        });
    }
    *count = 1;
    Ok(())
}

/// Check 2: per ordered pair, the k-th send is the k-th receive. Returns the message count.
fn check_matching(set: &ProgramSet) -> Result<usize, CommError> {
    let ranks = set.programs.len();
    let mut sends: Vec<Vec<Message>> = vec![Vec::new(); ranks * ranks];
    let mut recvs: Vec<Vec<Message>> = vec![Vec::new(); ranks * ranks];
    for program in &set.programs {
        for (_, op) in program.comm_ops() {
            match *op {
                CommOp::Send { to, message } if to.index() < ranks => {
                    sends[program.rank.index() * ranks + to.index()].push(message)
                }
                CommOp::Recv { from, message } if from.index() < ranks => {
                    recvs[from.index() * ranks + program.rank.index()].push(message)
                }
                _ => {
                    return Err(CommError::PeerOutOfRange {
                        rank: program.rank,
                        op: *op,
                        peer: op.peer(),
                        ranks,
                    });
                }
            }
        }
    }
    let mut total = 0;
    for pair in 0..ranks * ranks {
        let (from, to) = (
            RankId::new((pair / ranks) as u32),
            RankId::new((pair % ranks) as u32),
        );
        let (s, r) = (&sends[pair], &recvs[pair]);
        for (index, (sent, expected)) in s.iter().zip(r).enumerate() {
            if sent != expected {
                return Err(CommError::Mismatch {
                    from,
                    to,
                    index,
                    sent: *sent,
                    expected: *expected,
                });
            }
        }
        if s.len() != r.len() {
            let first = if s.len() > r.len() {
                s[r.len()]
            } else {
                r[s.len()]
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

/// One send or receive of the communication replay, with its place in its pair's sequence.
#[derive(Clone, Copy)]
struct Slot {
    op: CommOp,
    pair: usize,
    ordinal: usize,
    is_send: bool,
    /// A `WaitSend` on an earlier send (blocks until that send's receive is posted).
    wait: bool,
}

impl Slot {
    /// Whether the rank must wait for this operation's partner before going on: a wait always;
    /// a send only under blocking semantics; a receive always.
    fn blocks(&self, semantics: Semantics) -> bool {
        self.wait || !self.is_send || semantics == Semantics::Blocking
    }
}

/// The communication of a program set reduced to what completion depends on: per rank, its
/// sends and receives in program order, grouped into units (one op each under blocking
/// semantics, one group each under batched), and which of them have been posted.
struct CommReplay {
    semantics: Semantics,
    /// Per rank, every send and receive in program order.
    slots: Vec<Vec<Slot>>,
    /// Per rank, its units: (instruction index, range of its slots).
    units: Vec<Vec<(usize, std::ops::Range<usize>)>>,
    /// `posted[pair][is_send][ordinal]`.
    posted: Vec<[Vec<bool>; 2]>,
    /// Per rank, the next unit to complete.
    position: Vec<usize>,
}

impl CommReplay {
    /// Numbers every send and receive within its ordered pair of ranks. Peers out of range are
    /// left out (check 2 reports them).
    fn new(set: &ProgramSet, semantics: Semantics) -> CommReplay {
        let ranks = set.programs.len();
        let mut counters = vec![[0usize; 2]; ranks * ranks];
        let mut slots: Vec<Vec<Slot>> = Vec::with_capacity(ranks);
        let mut units: Vec<Vec<(usize, std::ops::Range<usize>)>> = Vec::with_capacity(ranks);
        for p in &set.programs {
            let mut rank_slots = Vec::new();
            let mut rank_units = Vec::new();
            for (i, instr) in p.instrs.iter().enumerate() {
                if let Instr::WaitSend { to, message } = *instr {
                    // Blocks on the latest earlier send of that message (check 1 ensures one).
                    let sent = rank_slots.iter().rev().find(|s: &&Slot| {
                        s.is_send && !s.wait && s.op == CommOp::Send { to, message }
                    });
                    if let Some(&send) = sent {
                        let k = rank_slots.len();
                        rank_slots.push(Slot { wait: true, ..send });
                        rank_units.push((i, k..k + 1));
                    }
                    continue;
                }
                let Instr::Comm(g) = instr else { continue };
                let first = rank_slots.len();
                for op in g.ops.iter().filter(|op| op.peer().index() < ranks) {
                    let (pair, is_send) = match *op {
                        CommOp::Send { to, .. } => (p.rank.index() * ranks + to.index(), true),
                        CommOp::Recv { from, .. } => (from.index() * ranks + p.rank.index(), false),
                    };
                    let counter = &mut counters[pair][usize::from(is_send)];
                    rank_slots.push(Slot {
                        op: *op,
                        pair,
                        ordinal: *counter,
                        is_send,
                        wait: false,
                    });
                    *counter += 1;
                }
                match semantics {
                    Semantics::Blocking | Semantics::Rendezvous => {
                        rank_units.extend((first..rank_slots.len()).map(|k| (i, k..k + 1)))
                    }
                    Semantics::Batched => rank_units.push((i, first..rank_slots.len())),
                }
            }
            slots.push(rank_slots);
            units.push(rank_units);
        }
        let posted = counters
            .iter()
            .map(|c| [vec![false; c[0]], vec![false; c[1]]])
            .collect();
        CommReplay {
            semantics,
            slots,
            units,
            posted,
            position: vec![0; ranks],
        }
    }

    fn partner_posted(&self, s: &Slot) -> bool {
        self.posted[s.pair][usize::from(!s.is_send)]
            .get(s.ordinal)
            .copied()
            .unwrap_or(false)
    }

    /// Advances every rank as far as it can: a rank posts its next unit, then completes it once
    /// every blocking operation's partner is posted. Posting wakes the peers.
    fn run(&mut self) {
        let ranks = self.slots.len();
        let mut posted_through = vec![0usize; ranks];
        let mut queue: VecDeque<usize> = (0..ranks).collect();
        let mut queued = vec![true; ranks];
        while let Some(r) = queue.pop_front() {
            queued[r] = false;
            while self.position[r] < self.units[r].len() {
                let u = self.position[r];
                let range = self.units[r][u].1.clone();
                if posted_through[r] <= u {
                    posted_through[r] = u + 1;
                    for s in &self.slots[r][range.clone()] {
                        self.posted[s.pair][usize::from(s.is_send)][s.ordinal] = true;
                        let p = s.op.peer().index();
                        if p != r && !queued[p] {
                            queued[p] = true;
                            queue.push_back(p);
                        }
                    }
                }
                let unit = &self.slots[r][range];
                if !unit
                    .iter()
                    .all(|s| !s.blocks(self.semantics) || self.partner_posted(s))
                {
                    break;
                }
                self.position[r] += 1;
            }
        }
    }

    fn finished(&self) -> bool {
        (0..self.slots.len()).all(|r| self.position[r] == self.units[r].len())
    }

    /// The operation rank `r` is stuck at, with its instruction index.
    fn waiting_op(&self, r: usize) -> Option<(usize, CommOp)> {
        let (instr, range) = self.units[r].get(self.position[r])?;
        self.slots[r][range.clone()]
            .iter()
            .find(|s| s.blocks(self.semantics) && !self.partner_posted(s))
            .map(|s| (*instr, s.op))
    }

    /// The cycle: follow "rank waits for an op whose partner its peer has not posted" from the
    /// first unfinished rank until a rank repeats.
    fn wait_cycle(&self) -> Vec<Waiting> {
        let ranks = self.slots.len();
        let Some(start) = (0..ranks).find(|&r| self.position[r] < self.units[r].len()) else {
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
    let mut replay = CommReplay::new(set, semantics);
    replay.run();
    if replay.finished() {
        return Ok(());
    }
    Err(CommError::Deadlock {
        semantics,
        cycle: replay.wait_cycle(),
    })
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
                    return group.ops.remove(i);
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
        let (_, mut set) = one_f_one_b();
        drop_op(&mut set, 0, |op| matches!(op, CommOp::Send { .. }));
        let err = check_matching(&set).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rank 0 -> rank 1: send #0 carries act(stage 0 -> 1, mb 1) but receive #0 expects act(stage 0 -> 1, mb 0)"
        );
        let (_, mut set) = one_f_one_b();
        drop_op(
            &mut set,
            1,
            |op| matches!(op, CommOp::Send { message, .. } if message.microbatch.get() == 1),
        );
        let err = check_matching(&set).unwrap_err();
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
        let (_, mut set) = one_f_one_b();
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
            check_matching(&set),
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
                    }],
                }),
                Instr::Comm(CommGroup {
                    ops: vec![CommOp::Recv {
                        from: RankId::new(peer),
                        message: message(peer, rank),
                    }],
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
