//! The communication checker: an independent check of projected (or imported) rank programs.
//!
//! Checks, in order:
//! 1. **Inputs received.** Every compute's inputs from other ranks were received earlier in its
//!    rank's program, and every output another rank needs is sent after it is computed.
//! 2. **Matching.** For every ordered pair of ranks, the k-th send from one to the other carries the
//!    same message (direction, stages, microbatch, shape slot) as the k-th receive there.
//! 3. **Blocking rendezvous** (for program sets that claim it, see [`ProgramSet::semantics`]).
//!    Executing every send and receive one at a time, each send completing only together with its
//!    receive, every rank runs to its end.
//! 4. **Batched.** Posting each group's sends and receives together and waiting for its receives
//!    (sends complete when received, by the end of the program at the latest), every rank runs to
//!    its end.
//!
//! A program set that cannot finish is reported with the cycle of waiting ranks, e.g.
//! `rank 2 waits for recv-grad(stage 5, mb 3) from rank 3; rank 3 waits for ...`.

use crate::deps::predecessors;
use crate::ids::RankId;
use crate::op::OpKind;
use crate::problem::Problem;
use crate::program::{CommOp, Instr, Message, ProgramSet};
use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use thiserror::Error;

/// How sends and receives complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Semantics {
    /// One at a time; a send completes only with its receive.
    Blocking,
    /// A group's operations are posted together; the rank goes on once the group's receives are
    /// matched, and its sends complete when the peers receive them (all by the end of the
    /// program), as with `batch_isend_irecv` and waiting on the receive requests.
    Batched,
}

impl fmt::Display for Semantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Semantics::Blocking => "blocking rendezvous",
            Semantics::Batched => "batched",
        })
    }
}

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
    check_dataflow(problem, set)?;
    let messages = check_matching(set)?;
    if set.semantics == Semantics::Blocking {
        simulate_comm(set, Semantics::Blocking)?;
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

/// Check 1: every cross-rank input is received before the compute using it, and every send
/// carries data computed earlier on its rank.
fn check_dataflow(problem: &Problem, set: &ProgramSet) -> Result<(), CommError> {
    let owner = |s| problem.rank_of(s);
    for program in &set.programs {
        let rank = program.rank;
        let mut received: HashSet<Message> = HashSet::new();
        let mut computed: HashSet<crate::op::Op> = HashSet::new();
        for (i, instr) in program.instrs.iter().enumerate() {
            match instr {
                Instr::Comm(group) => {
                    for op in &group.ops {
                        match *op {
                            CommOp::Recv { message, .. } => {
                                received.insert(message);
                            }
                            CommOp::Send { message, .. } => {
                                let kind = match message.direction {
                                    crate::program::Direction::Activation => OpKind::Forward,
                                    crate::program::Direction::Gradient => OpKind::InputGrad,
                                };
                                let source = crate::op::Op::new(
                                    kind,
                                    message.from_stage,
                                    message.microbatch,
                                );
                                if !computed.contains(&source)
                                    || owner(message.from_stage) != Some(rank)
                                {
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
                Instr::Compute(task) => {
                    let ops = task.ops();
                    for op in &ops {
                        for dep in predecessors(problem, *op) {
                            let Some(from) = owner(dep.stage) else {
                                continue;
                            };
                            if from == rank || ops.contains(&dep) {
                                continue;
                            }
                            let message = match dep.kind {
                                OpKind::Forward => {
                                    Message::activation(dep.stage, op.stage, op.microbatch)
                                }
                                _ => Message::gradient(dep.stage, op.stage, op.microbatch),
                            };
                            if !received.contains(&message) {
                                return Err(CommError::NotReceived {
                                    rank,
                                    instr: i,
                                    task: task.to_string(),
                                    message,
                                    from,
                                });
                            }
                        }
                        computed.insert(*op);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Check 2: per ordered pair, the k-th send is the k-th receive. Returns the message count.
fn check_matching(set: &ProgramSet) -> Result<usize, CommError> {
    let mut sends: HashMap<(RankId, RankId), Vec<Message>> = HashMap::new();
    let mut recvs: HashMap<(RankId, RankId), Vec<Message>> = HashMap::new();
    for program in &set.programs {
        for (_, op) in program.comm_ops() {
            match *op {
                CommOp::Send { to, message } => {
                    sends.entry((program.rank, to)).or_default().push(message)
                }
                CommOp::Recv { from, message } => {
                    recvs.entry((from, program.rank)).or_default().push(message)
                }
            }
        }
    }
    let mut pairs: Vec<(RankId, RankId)> = sends.keys().chain(recvs.keys()).copied().collect();
    pairs.sort();
    pairs.dedup();
    let mut total = 0;
    for (from, to) in pairs {
        let s = sends.get(&(from, to)).map_or(&[][..], Vec::as_slice);
        let r = recvs.get(&(from, to)).map_or(&[][..], Vec::as_slice);
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

/// Checks 3 and 4: runs the programs' communication under `semantics`.
pub fn simulate_comm(set: &ProgramSet, semantics: Semantics) -> Result<(), CommError> {
    let ranks = set.programs.len();
    // Flatten every program into units: under blocking semantics one op per unit, under batched
    // one group per unit. Computes and markers need no unit: they always proceed.
    let units: Vec<Vec<(usize, Vec<CommOp>)>> = set
        .programs
        .iter()
        .map(|p| {
            let mut out = Vec::new();
            for (i, instr) in p.instrs.iter().enumerate() {
                if let Instr::Comm(g) = instr {
                    match semantics {
                        Semantics::Blocking => out.extend(g.ops.iter().map(|op| (i, vec![*op]))),
                        Semantics::Batched => out.push((i, g.ops.clone())),
                    }
                }
            }
            out
        })
        .collect();
    // Index of each op within its (from, to) sequence, to pair sends with receives.
    let mut counters: HashMap<(RankId, RankId, bool), usize> = HashMap::new();
    let mut ordinal: Vec<Vec<Vec<usize>>> = Vec::with_capacity(ranks);
    for (r, rank_units) in units.iter().enumerate() {
        let rank = RankId::new(r as u32);
        ordinal.push(
            rank_units
                .iter()
                .map(|(_, ops)| {
                    ops.iter()
                        .map(|op| {
                            let key = match *op {
                                CommOp::Send { to, .. } => (rank, to, true),
                                CommOp::Recv { from, .. } => (from, rank, false),
                            };
                            let c = counters.entry(key).or_insert(0);
                            *c += 1;
                            *c - 1
                        })
                        .collect()
                })
                .collect(),
        );
    }
    let mut posted: HashSet<(RankId, RankId, bool, usize)> = HashSet::new();
    let mut position = vec![0usize; ranks];
    let mut posted_through = vec![0usize; ranks];
    let mut queue: VecDeque<usize> = (0..ranks).collect();
    let mut queued = vec![true; ranks];
    let key_of = |r: usize, op: &CommOp, k: usize| -> (RankId, RankId, bool, usize) {
        let rank = RankId::new(r as u32);
        match *op {
            CommOp::Send { to, .. } => (rank, to, true, k),
            CommOp::Recv { from, .. } => (from, rank, false, k),
        }
    };
    let partner = |(from, to, is_send, k): (RankId, RankId, bool, usize)| (from, to, !is_send, k);
    while let Some(r) = queue.pop_front() {
        queued[r] = false;
        while position[r] < units[r].len() {
            let u = position[r];
            let (_, ops) = &units[r][u];
            if posted_through[r] <= u {
                posted_through[r] = u + 1;
                for (op, &k) in ops.iter().zip(&ordinal[r][u]) {
                    posted.insert(key_of(r, op, k));
                }
                // Tell the peers: their own units may now be complete.
                for op in ops {
                    let p = op.peer().index();
                    if p < ranks && !queued[p] && p != r {
                        queued[p] = true;
                        queue.push_back(p);
                    }
                }
            }
            let done = ops.iter().zip(&ordinal[r][u]).all(|(op, &k)| {
                (semantics == Semantics::Batched && matches!(op, CommOp::Send { .. }))
                    || posted.contains(&partner(key_of(r, op, k)))
            });
            if !done {
                break;
            }
            position[r] += 1;
        }
    }
    if (0..ranks).all(|r| position[r] == units[r].len()) {
        return Ok(());
    }
    // Build the cycle: follow "rank waits for an op whose partner its peer has not posted".
    let waiting_op = |r: usize| -> Option<(usize, CommOp)> {
        let u = position[r];
        let (instr, ops) = units[r].get(u)?;
        ops.iter()
            .zip(&ordinal[r][u])
            .find(|(op, &k)| {
                !(semantics == Semantics::Batched && matches!(op, CommOp::Send { .. }))
                    && !posted.contains(&partner(key_of(r, op, k)))
            })
            .map(|(op, _)| (*instr, *op))
    };
    let start = (0..ranks)
        .find(|&r| position[r] < units[r].len())
        .expect("some rank is unfinished");
    let mut path: Vec<Waiting> = Vec::new();
    let mut seen = vec![usize::MAX; ranks];
    let mut r = start;
    loop {
        if seen[r] != usize::MAX {
            path.drain(..seen[r]);
            break;
        }
        let Some((instr, op)) = waiting_op(r) else {
            break;
        };
        seen[r] = path.len();
        path.push(Waiting {
            rank: RankId::new(r as u32),
            instr,
            op,
        });
        let next = op.peer().index();
        if next >= ranks {
            break;
        }
        r = next;
    }
    Err(CommError::Deadlock {
        semantics,
        cycle: path,
    })
}
