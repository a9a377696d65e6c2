//! What the communication checker reports: [`CommError`], why a program set is unsound (with
//! [`Waiting`], one rank of a deadlock's cycle), and [`CheckReport`], what a passing check
//! measured.

use crate::analysis::replay::describe_waits;
use crate::ir::ids::RankId;
use crate::spmd::all_to_all::A2aFault;
use crate::spmd::params::{ParamFault, ParamUse};
use crate::spmd::program::{CommOp, Message, Semantics};
use crate::spmd::residency::ResidencyFault;
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
    /// An all-to-all instruction is out of order.
    #[error("rank {rank}, instruction {instr}: {fault}")]
    AllToAll {
        /// The rank.
        rank: RankId,
        /// The instruction.
        instr: usize,
        /// What is wrong.
        fault: A2aFault,
    },
    /// The programs cannot finish under the given semantics.
    #[error("deadlock under {semantics} semantics: {}", describe_waits(.cycle))]
    Deadlock {
        /// The semantics.
        semantics: Semantics,
        /// The cycle of waiting ranks.
        cycle: Vec<Waiting>,
    },
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
