//! The one error type of `pipeweave-transforms`.
//!
//! It separates what the user got wrong (a malformed expression, an unknown pass or argument, a
//! precondition a pass states, passes in the wrong order) from what a pass got wrong (a plan that
//! fails verification after the pass: always a bug in that pass, blamed by name).

use pipeweave_core::{CoreError, FailureKind, Violations};
use thiserror::Error;

/// Everything that can go wrong while parsing, composing and running passes.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum TransformError {
    /// The schedule expression does not parse.
    #[error("syntax error at column {column}: {message}")]
    Syntax {
        /// 1-based column in the expression.
        column: usize,
        /// What was expected.
        message: String,
    },
    /// A pass name the expression language does not know.
    #[error("unknown pass `{name}` at column {column}; known passes: {known}")]
    UnknownPass {
        /// The name given.
        name: String,
        /// 1-based column.
        column: usize,
        /// The known names.
        known: String,
    },
    /// An argument a pass does not take, or a value it cannot accept.
    #[error("pass `{pass}`, argument `{argument}` at column {column}: {message}")]
    BadArgument {
        /// The pass.
        pass: String,
        /// The argument (or `schedule` for the positional one).
        argument: String,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// The expression nests deeper than the parser allows.
    #[error("syntax error at column {column}: the expression nests more than {limit} calls deep")]
    TooDeep {
        /// 1-based column of the call past the limit.
        column: usize,
        /// The nesting limit.
        limit: usize,
    },
    /// A pass's input lacks a fact the pass needs: it comes at the wrong point of the pipeline
    /// (the built-ins apply in the order gpipe, f1b, vpp, dual, zero_bubble, seq_split, each at
    /// most once, then recompute or offload).
    #[error("pass `{pass}` cannot run after `{after}`: it needs {needs}, but the plan has {found} (the built-in passes apply in the order gpipe, f1b, vpp, dual, zero_bubble, seq_split, each at most once, then recompute or offload)")]
    OutOfOrder {
        /// The pass that came too late.
        pass: String,
        /// The pass before it.
        after: String,
        /// The fact it needs.
        needs: String,
        /// The fact the plan has.
        found: String,
    },
    /// A pass changed what its contract says it leaves alone: a bug in that pass.
    #[error(
        "pass `{pass}` changed {what}, which its contract says it leaves alone (a bug in the pass)"
    )]
    UndeclaredChange {
        /// The pass to blame.
        pass: String,
        /// What changed.
        what: &'static str,
    },
    /// A factory registered under one name built a pass that names itself otherwise.
    #[error("the pass registered as `{registered}` names itself `{named}`: a pass has one name (its `Pass::name`), register it under that")]
    MisnamedPass {
        /// The name it was registered under.
        registered: String,
        /// The name the pass gives.
        named: String,
    },
    /// A pass name registered twice.
    #[error("a pass named `{name}` is already registered")]
    DuplicatePass {
        /// The name.
        name: String,
    },
    /// The input plan does not meet a precondition the pass states.
    #[error("pass `{pass}` precondition `{constraint}` violated: {details}")]
    Precondition {
        /// The pass.
        pass: String,
        /// The rule, in a few words (e.g. `ranks <= group <= microbatches`).
        constraint: String,
        /// The values that broke it.
        details: String,
    },
    /// A pass produced a plan that fails verification: a bug in that pass.
    #[error("pass `{pass}` produced an invalid plan (a bug in the pass): {violations}")]
    PassBroke {
        /// The pass to blame.
        pass: String,
        /// What the verifier found.
        violations: Violations,
    },
    /// A pass's rewrite failed on a plan that met its contract (a pass written in Python raised,
    /// or returned orders that are not a plan's): a bug in that pass.
    #[error("pass `{pass}` failed (a bug in the pass): {message}")]
    PassFailed {
        /// The pass to blame.
        pass: String,
        /// What went wrong, as the pass reported it.
        message: String,
    },
    /// The plan a pass produced is sound but exceeds the declared memory limit: the pass cannot
    /// meet the user's bound (not a bug).
    #[error("pass `{pass}` exceeds the memory limit: {violations}")]
    MemoryLimit {
        /// The pass whose plan holds too much.
        pass: String,
        /// The memory-bound violations, one per rank over the limit.
        violations: Violations,
    },
    /// A core error (invalid problem or model) while building or rewriting a plan.
    #[error("{context}: {source}")]
    Core {
        /// Where it happened.
        context: String,
        /// The error.
        #[source]
        source: CoreError,
    },
}

impl TransformError {
    /// A precondition error of the pass that returns it, without the pass's name: the driver puts
    /// it on the errors of a rewrite and the registry on those of a factory ([`Self::of_pass`]).
    /// Code that runs outside both (a pass's constructor) names its pass with
    /// [`Self::precondition`].
    pub fn unmet(constraint: &str, details: impl Into<String>) -> Self {
        TransformError::precondition("", constraint, details)
    }

    /// The error with `pass` named where a pass's rewrite or factory returned it without its name
    /// (or a precondition error with another name): the driver calls this on every error of a
    /// rewrite, the registry on every error of a factory.
    pub fn of_pass(self, pass: &str) -> Self {
        match self {
            TransformError::Precondition {
                constraint,
                details,
                ..
            } => TransformError::Precondition {
                pass: pass.to_string(),
                constraint,
                details,
            },
            TransformError::Core { context, source } if context.is_empty() => {
                TransformError::Core {
                    context: pass.to_string(),
                    source,
                }
            }
            other => other,
        }
    }

    /// A precondition error.
    pub fn precondition(pass: &str, constraint: &str, details: impl Into<String>) -> Self {
        TransformError::Precondition {
            pass: pass.to_string(),
            constraint: constraint.to_string(),
            details: details.into(),
        }
    }

    /// [`FailureKind::Bug`] for a bug in a pass, [`FailureKind::BadInput`] for the rest.
    pub fn kind(&self) -> FailureKind {
        if self.is_pass_bug() {
            FailureKind::Bug
        } else {
            FailureKind::BadInput
        }
    }

    /// Whether the error is a bug in a pass (not the user's to fix).
    pub fn is_pass_bug(&self) -> bool {
        matches!(
            self,
            TransformError::PassBroke { .. }
                | TransformError::UndeclaredChange { .. }
                | TransformError::PassFailed { .. }
        )
    }

    /// Wraps a core error with context.
    pub fn core(context: impl Into<String>, source: CoreError) -> Self {
        TransformError::Core {
            context: context.into(),
            source,
        }
    }
}
