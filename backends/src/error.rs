//! The one error type of `pipeweave-backends`: what stops a run, and where.

use pipeweave_core::{CommError, FailureKind, Message, RankId};

use crate::compute::Capability;
use crate::stage_error::StageError;
use thiserror::Error;

/// Why a run failed. Every variant names the rank and the instruction index where it happened.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum BackendError {
    /// The programs failed the communication check; nothing ran.
    #[error("the programs were not run: communication check failed: {0}")]
    Unchecked(#[from] CommError),
    /// The program needs a residency capability its rank's compute does not declare
    /// ([`crate::StageCompute::capabilities`]); nothing ran (no instruction of any rank, on
    /// threads; on MPI, none of this rank's).
    #[error(
        "rank {rank}, instruction {instr} ({what}): the program needs {capability}, which the \
         rank's stage compute does not support; nothing ran"
    )]
    Unsupported {
        /// The rank.
        rank: RankId,
        /// The index of the first instruction that needs the capability.
        instr: usize,
        /// That instruction.
        what: String,
        /// The capability.
        capability: Capability,
    },
    /// A stage's computation returned an error.
    #[error("rank {rank}, instruction {instr} ({what}): the stage failed: {source}")]
    Stage {
        /// The rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The instruction.
        what: String,
        /// The stage's error, with its kind.
        #[source]
        source: StageError,
    },
    /// The stage or the transport panicked.
    #[error("rank {rank}, instruction {instr} ({what}): the {component} panicked: {reason}")]
    Panicked {
        /// The rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The instruction.
        what: String,
        /// `stage` or `transport`.
        component: &'static str,
        /// The panic message.
        reason: String,
    },
    /// A tensor the program needs is not there (an inconsistent program).
    #[error("rank {rank}, instruction {instr} ({what}): {reason}")]
    Program {
        /// The rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The instruction.
        what: String,
        /// What is missing.
        reason: String,
    },
    /// A different message arrived than the one the program expects.
    #[error("rank {rank}, instruction {instr}: expected {expected} from rank {from}, got {got}")]
    Protocol {
        /// The receiving rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The peer.
        from: RankId,
        /// What the program expects.
        expected: Message,
        /// What arrived.
        got: Message,
    },
    /// A transport failed (a peer is gone, a link is closed).
    #[error("rank {rank}, instruction {instr}: transport failed: {reason}")]
    Transport {
        /// The rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// Why.
        reason: String,
    },
    /// This rank stopped because another rank failed first.
    #[error("rank {rank}, instruction {instr}: stopped because rank {failed} failed{}", waiting_for(.waiting))]
    Aborted {
        /// The rank that stopped.
        rank: RankId,
        /// Where it stopped.
        instr: usize,
        /// The rank that failed.
        failed: RankId,
        /// The peer and message it was waiting for, if it was waiting.
        waiting: Option<(RankId, Message)>,
    },
    /// No rank made progress: the ranks that waited longer than the limit, and what every
    /// rank was doing (who waits on whom).
    #[error("no progress within {seconds} s: {}", .report.join("; "))]
    Stalled {
        /// The limit.
        seconds: f64,
        /// One line per rank: its instruction and the message it waits for.
        report: Vec<String>,
    },
    /// A receive waited longer than the run's limit.
    #[error("rank {rank}, instruction {instr}: waited more than {seconds} s for {message} from rank {from}")]
    Timeout {
        /// The waiting rank.
        rank: RankId,
        /// The instruction index.
        instr: usize,
        /// The peer.
        from: RankId,
        /// The awaited message.
        message: Message,
        /// The limit.
        seconds: f64,
    },
}

fn waiting_for(waiting: &Option<(RankId, Message)>) -> String {
    match waiting {
        Some((from, message)) => format!(" (it was waiting for {message} from rank {from})"),
        None => String::new(),
    }
}

impl BackendError {
    /// The kind of failure: a stage's own kind; [`FailureKind::BadInput`] for a program that
    /// needs a capability its compute lacks (the plan asks what the model cannot do);
    /// [`FailureKind::Bug`] for programs that fail the
    /// check, a panic, a missing tensor or a protocol mismatch (the programs or the stage are
    /// wrong); [`FailureKind::Failed`] for a transport failure or a rank stopped by another's;
    /// [`FailureKind::Timeout`] for a receive past the limit or a stall.
    pub fn kind(&self) -> FailureKind {
        match self {
            BackendError::Stage { source, .. } => source.kind(),
            BackendError::Unsupported { .. } => FailureKind::BadInput,
            BackendError::Unchecked(_)
            | BackendError::Panicked { .. }
            | BackendError::Program { .. }
            | BackendError::Protocol { .. } => FailureKind::Bug,
            BackendError::Transport { .. } | BackendError::Aborted { .. } => FailureKind::Failed,
            BackendError::Stalled { .. } | BackendError::Timeout { .. } => FailureKind::Timeout,
        }
    }

    /// Whether this error only reports that another rank failed first.
    pub fn is_secondary(&self) -> bool {
        matches!(self, BackendError::Aborted { .. })
    }
}
