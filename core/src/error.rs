//! The one error type of `pipeweave-core`.
//!
//! Errors here are about input: a problem, cost or memory description that cannot describe a
//! pipeline, facts that do not match their plan, action notation or a schedule file that does not
//! parse. What the analyses find wrong with a well-formed plan is reported by their own types,
//! never as a `CoreError`: the verifier's [`crate::analysis::verify::Violations`] (after a pass,
//! always a bug in that pass), the replay engine's [`crate::analysis::replay::ReplayError`] and the
//! communication checker's [`crate::spmd::check::CommError`].
//!
//! This module depends on nothing else in the crate.

use thiserror::Error;

/// Everything that can go wrong in `pipeweave-core`.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CoreError {
    /// A size is zero or beyond what a plan can hold.
    #[error("{what} = {value} is out of range: {constraint}")]
    SizeOutOfRange {
        /// Which size (e.g. `ranks`).
        what: &'static str,
        /// The value given (signed and wide, so that any count a user types is named as typed).
        value: i128,
        /// The rule it breaks, e.g. `must be between 1 and 4096`.
        constraint: String,
    },
    /// The problem description is inconsistent (placement, routes, tied stages).
    #[error("invalid problem: {0}")]
    InvalidProblem(String),
    /// A sequence cannot be cut into the chunks asked for (Seq1F1B's split).
    #[error("cannot split the sequence: {0}")]
    SequenceSplit(String),
    /// A cost or memory figure is negative, not finite or inconsistent.
    #[error("invalid {model} for stage {stage}: {reason}")]
    InvalidModel {
        /// `cost model` or `memory model`.
        model: &'static str,
        /// The stage it concerns (or `all` for global figures).
        stage: String,
        /// What is wrong.
        reason: String,
    },
    /// A model describes a different number of stages than the problem.
    #[error("{model} describes {got} stages but the problem has {expected}")]
    StageCountMismatch {
        /// `cost model` or `memory model`.
        model: &'static str,
        /// Stages in the model.
        got: usize,
        /// Stages in the problem.
        expected: usize,
    },
    /// A plan's orders do not match its problem's rank count.
    #[error("the plan has orders for {got} ranks but the problem has {expected}")]
    RankCountMismatch {
        /// Rows of orders given.
        got: usize,
        /// Ranks in the problem.
        expected: usize,
    },
    /// An action string in PyTorch's notation did not parse.
    #[error("cannot parse action `{text}`: {reason}")]
    Notation {
        /// The text given.
        text: String,
        /// Why it is not an action.
        reason: String,
    },
    /// A schedule CSV cell or row is malformed.
    #[error("line {line}, column {column}: {reason}")]
    Csv {
        /// 1-based line (the rank is `line - 1`).
        line: usize,
        /// 1-based cell index in the line.
        column: usize,
        /// What is wrong.
        reason: String,
    },
    /// A plan that a file format cannot express.
    #[error("{format} cannot express this plan: {reason}")]
    NotExpressible {
        /// The format, e.g. `PyTorch's schedule CSV`.
        format: &'static str,
        /// Why, and what to use instead.
        reason: String,
    },
    /// An imported schedule is consistent as text but not as a pipeline.
    #[error("imported schedule: {0}")]
    Import(String),
}

impl CoreError {
    /// Always [`FailureKind::BadInput`]: every core error is about a description the caller gave.
    pub fn kind(&self) -> FailureKind {
        FailureKind::BadInput
    }
}

/// What kind of failure an error is, for whoever must react to it: a command's exit status, a
/// report, a retry. Every crate's error type says the kind of each of its errors (`kind()`), and
/// errors that wrap others keep the kind of what they wrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The input is wrong (arguments, files, sizes, data): the user's to fix.
    BadInput,
    /// A bug in pipeweave: a pass that broke its plan, programs of a verified plan that fail to
    /// project or check, an invariant of a run that does not hold, a panic.
    Bug,
    /// The run failed: a rank's computation or its transport failed, a peer was lost.
    Failed,
    /// A rank waited longer than the run's limit for a message.
    Timeout,
}

impl FailureKind {
    /// The exit status of a command that stops with this failure: 2 for bad input, 1 for the
    /// rest (the contract of `pipeweave` and `train_gpt`).
    pub fn exit_status(self) -> u8 {
        match self {
            FailureKind::BadInput => 2,
            FailureKind::Bug | FailureKind::Failed | FailureKind::Timeout => 1,
        }
    }
}

#[cfg(test)]
mod kind_tests {
    use super::*;

    #[test]
    fn only_bad_input_exits_with_two() {
        assert_eq!(FailureKind::BadInput.exit_status(), 2);
        for kind in [FailureKind::Bug, FailureKind::Failed, FailureKind::Timeout] {
            assert_eq!(kind.exit_status(), 1);
        }
        let e = CoreError::Import("x".into());
        assert_eq!(e.kind(), FailureKind::BadInput);
    }
}
