//! The facade's error type: what the library glue and the command-line tool can fail with.

use pipeweave_core::{CommError, CoreError, FailureKind, ReplayError, Violations};
use pipeweave_transforms::TransformError;
use thiserror::Error;

/// Errors of the facade and the CLI.
#[derive(Debug, Error)]
pub enum Error {
    /// An invalid problem, model or plan.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// An expression or pass error.
    #[error(transparent)]
    Transform(#[from] TransformError),
    /// A plan (imported, or built and then changed) that fails verification.
    #[error("plan verification failed: {0}")]
    Verification(#[from] Violations),
    /// A plan that cannot run to completion.
    #[error("the plan cannot run: {0}")]
    Replay(#[from] ReplayError),
    /// Programs that fail the communication check.
    #[error("communication check failed: {0}")]
    Communication(#[from] CommError),
    /// A run on a backend failed.
    #[error(transparent)]
    Backend(#[from] pipeweave_backends::BackendError),
    /// The simulated figures are not finite numbers (costs so large that sums overflow).
    #[error("the simulated {what} is {value}: the costs are too large for finite figures")]
    Overflow {
        /// Which figure.
        what: &'static str,
        /// Its value.
        value: f64,
    },
    /// A command-line option with a bad value.
    #[error("option {option}: {message}")]
    Option {
        /// The option, e.g. `--costs`.
        option: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A file whose bytes are not UTF-8 text.
    #[error("{path}: line {line}, column {column}: byte {byte:#04x} is not UTF-8 text")]
    NotText {
        /// The file.
        path: String,
        /// The line of the first byte that is not text (from 1).
        line: usize,
        /// Its column (from 1, in characters).
        column: usize,
        /// The byte.
        byte: u8,
    },
    /// JSON that could not be read.
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
}

impl From<pipeweave_core::ProgramsRefused> for Error {
    fn from(refused: pipeweave_core::ProgramsRefused) -> Error {
        match refused {
            pipeweave_core::ProgramsRefused::Projection(v) => Error::Verification(v),
            pipeweave_core::ProgramsRefused::Communication(c) => Error::Communication(c),
        }
    }
}

impl Error {
    /// The kind of failure: a pass's bug or a run's failure keeps the kind its crate gave it;
    /// everything else here is about the user's input (expressions, options, files, imported
    /// schedules that do not verify, deadlock or fail the communication check).
    pub fn kind(&self) -> FailureKind {
        match self {
            Error::Transform(e) => e.kind(),
            Error::Backend(e) => e.kind(),
            Error::Core(_)
            | Error::Verification(_)
            | Error::Replay(_)
            | Error::Communication(_)
            | Error::Overflow { .. }
            | Error::Option { .. }
            | Error::Io { .. }
            | Error::NotText { .. }
            | Error::Json { .. } => FailureKind::BadInput,
        }
    }
}
