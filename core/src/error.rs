//! The one error type of `pipeweave-core`.
//!
//! Errors here are about user input: a problem, cost or memory description that cannot describe a
//! pipeline, action notation that does not parse, or a plan that failed verification (the list of
//! [`Violation`]s says what broke where). A verification failure of a plan produced by a pass is a
//! bug in that pass; the pass driver in `pipeweave-transforms` attributes it by name.

use crate::verify::Violations;
use thiserror::Error;

/// Everything that can go wrong in `pipeweave-core`.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CoreError {
    /// A size is zero or beyond what a plan can hold.
    #[error("{what} = {value} is out of range: {constraint}")]
    SizeOutOfRange {
        /// Which size (e.g. `ranks`).
        what: &'static str,
        /// The value given.
        value: u64,
        /// The rule it breaks, e.g. `must be between 1 and 4096`.
        constraint: String,
    },
    /// The problem description is inconsistent (placement, routes, tied stages).
    #[error("invalid problem: {0}")]
    InvalidProblem(String),
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
    /// An imported schedule is consistent as text but not as a pipeline.
    #[error("imported schedule: {0}")]
    Import(String),
    /// Projected or imported programs failed the communication check.
    #[error("communication check failed: {0}")]
    Communication(#[from] crate::check::CommError),
    /// The plan broke one or more invariants; every violation is listed.
    #[error("plan verification failed: {0}")]
    Verification(Violations),
}
