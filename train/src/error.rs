//! The crate's one error type, [`TrainError`]: every fallible function of the crate returns it,
//! and each variant says what went wrong, where (which file, tensor, field or part of the run)
//! and why.
//!
//! **Adding variants.** The enum is deliberately not `#[non_exhaustive]`: add a variant per new
//! kind of failure (e.g. a stage error naming the rank and the instruction, a non-finite loss, a
//! lost peer), with fields that name what and where, and classify it in [`TrainError::kind`]
//! (bad input, a bug, a failed run, a timeout), whose `match` has no wildcard so that the
//! compiler asks for it. Errors of other crates are kept as typed sources, with their kinds.

use pipeweave_core::FailureKind;
use std::path::PathBuf;

/// Result type of the crate.
pub type Result<T> = std::result::Result<T, TrainError>;

/// Everything that can go wrong in `pipeweave-train`.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A text file is not valid UTF-8.
    #[error("{}: not UTF-8 text (invalid byte sequence at byte offset {offset})", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// Byte offset of the first invalid sequence within the file.
        offset: usize,
    },
    /// The training data is too short for the sequences asked for.
    #[error("{}: {bytes} bytes of text, but {needed} are needed: {why}", origin.display())]
    DataTooShort {
        /// The file or folder the text came from.
        origin: PathBuf,
        /// How many bytes there are.
        bytes: usize,
        /// How many are needed at least.
        needed: usize,
        /// What the bytes are needed for.
        why: String,
    },
    /// Reading or writing a file or folder failed.
    #[error("{}: cannot {action}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// What was being done, e.g. `"read"`, `"rename the temporary file into place"`; an
        /// action starting with `read` or `list` reads the user's input (exit status 2).
        action: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// An argument or setting is out of its domain.
    #[error("invalid {field} = {value}: {reason}")]
    InvalidArgument {
        /// Which argument or setting.
        field: &'static str,
        /// Its value, formatted.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A checkpoint lacks a tensor the model needs.
    #[error("{}: checkpoint has no tensor `{name}`", path.display())]
    MissingTensor {
        /// The checkpoint file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A checkpoint holds a tensor the model does not have.
    #[error("{}: checkpoint has tensor `{name}`, which the model does not have", path.display())]
    UnexpectedTensor {
        /// The checkpoint file.
        path: PathBuf,
        /// The tensor's name.
        name: String,
    },
    /// A tensor has another shape than the model's.
    #[error("{}: tensor `{name}` has shape {actual:?}, expected {expected:?}", path.display())]
    TensorShape {
        /// The checkpoint file (empty when the tensor did not come from a file).
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// The shape it has.
        actual: Vec<usize>,
        /// The shape the model needs.
        expected: Vec<usize>,
    },
    /// A tensor has an element type that cannot be used here.
    #[error("{}: tensor `{name}` has dtype {actual}, expected {expected}", path.display())]
    TensorDType {
        /// The checkpoint file (empty when the tensor did not come from a file).
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// The dtype it has.
        actual: String,
        /// What was expected.
        expected: String,
    },
    /// A checkpoint was made for a model of another shape.
    #[error(
        "{}: checkpoint was made for another model: {field} is {checkpoint} there, {expected} here",
        path.display()
    )]
    ConfigMismatch {
        /// The checkpoint file.
        path: PathBuf,
        /// The model field that differs (GPT-2's name, e.g. `n_layer`).
        field: &'static str,
        /// Its value in the checkpoint.
        checkpoint: String,
        /// Its value in this run.
        expected: String,
    },
    /// A checkpoint was made for another schedule (or other run settings it fingerprints).
    #[error(
        "{}: checkpoint was made for another schedule: `{checkpoint}` there, `{expected}` here",
        path.display()
    )]
    ScheduleMismatch {
        /// The checkpoint file.
        path: PathBuf,
        /// The schedule fingerprint in the checkpoint.
        checkpoint: String,
        /// The schedule fingerprint of this run.
        expected: String,
    },
    /// A checkpoint's metadata is missing, unreadable or inconsistent.
    #[error("{}: bad checkpoint metadata `{key}`: {reason}", path.display())]
    Metadata {
        /// The checkpoint file.
        path: PathBuf,
        /// The metadata key (or file part) at fault.
        key: String,
        /// Why it is rejected.
        reason: String,
    },
    /// A file is not a readable safetensors file, or tensors cannot be serialised.
    #[error("{}: safetensors: {reason}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The safetensors library's complaint.
        reason: String,
    },
    /// The tensor library (candle) failed.
    #[error("{what}: tensor operation failed: {source}")]
    Tensor {
        /// What was being computed, e.g. `"AdamW step of transformer.h.0.attn.c_attn.weight"`.
        what: String,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
    /// A kernel (a layer's or the optimizer's op) failed.
    #[error("{what}: {source}")]
    Kernel {
        /// What was being computed, e.g. `"AdamW step of transformer.h.0.attn.c_attn.weight"`.
        what: String,
        /// Whose fault: the configuration's (a model the kernels refuse), the run's (the
        /// tensor backend failed) or a bug (tensors the trainer built).
        kind: FailureKind,
        /// The kernels' error.
        #[source]
        source: pipeweave_kernels::KernelError,
    },
    /// The global gradient norm is NaN or infinite.
    #[error("the global gradient norm is {norm}: some gradient is not finite")]
    NonFiniteNorm {
        /// The norm found.
        norm: f64,
    },
    /// A step's batch cannot be built (wrong sizes, no non-padding target).
    #[error("batch: {reason}")]
    Batch {
        /// What is wrong with it.
        reason: String,
    },
    /// A training step failed: which step, and why (a backend error names the rank and the
    /// instruction).
    #[error("step {step}: {source}")]
    Step {
        /// The step (1 first).
        step: u64,
        /// What failed.
        source: Box<TrainError>,
    },
    /// The model cannot be cut into the plan's stages.
    #[error("cutting the model into stages: {reason}")]
    Cut {
        /// Why not.
        reason: String,
    },
    /// A verified plan's programs cannot be projected (a bug in the pass that built the plan).
    #[error("the plan's programs cannot be projected: {0}")]
    Projection(#[source] pipeweave_core::Violations),
    /// A verified plan's programs fail the communication check (a bug in a pass or in the
    /// projection).
    #[error("the plan's programs fail the communication check: {0}")]
    Communication(#[source] pipeweave_core::CommError),
    /// Measured op durations do not make a cost model (a bug: durations are finite and
    /// non-negative).
    #[error("the measured op costs: {0}")]
    MeasuredCosts(#[source] pipeweave_core::CoreError),
    /// The simulator cannot replay a plan the trainer ran (a bug).
    #[error("replaying the measured step: {0}")]
    Replay(#[source] pipeweave_core::ReplayError),
    /// A trace cannot be written as JSON (a bug).
    #[error("writing the trace: {0}")]
    Trace(#[source] serde_json::Error),
    /// Something the trainer relies on does not hold (a bug): a gradient that never arrived, a
    /// replica's thread that panicked.
    #[error("internal error: {what}")]
    Invariant {
        /// What does not hold.
        what: String,
    },
    /// MPI failed: a communicator is missing, a message cannot be exchanged or decoded.
    #[error("MPI: {what}")]
    Mpi {
        /// What failed.
        what: String,
    },
    /// A process of a data-parallel run failed: which replica and world rank, and why.
    #[error("replica {replica} (world rank {world_rank}): {source}")]
    Replica {
        /// The data-parallel replica.
        replica: u32,
        /// The process's rank in the world.
        world_rank: usize,
        /// What failed.
        source: Box<TrainError>,
    },
    /// The run failed in a backend (a stage error, a panic, a timeout, a lost peer), naming the
    /// rank and the instruction.
    #[error(transparent)]
    Backend(#[from] pipeweave_backends::BackendError),
}

impl From<pipeweave_core::ProgramsRefused> for TrainError {
    fn from(refused: pipeweave_core::ProgramsRefused) -> TrainError {
        match refused {
            pipeweave_core::ProgramsRefused::Projection(v) => TrainError::Projection(v),
            pipeweave_core::ProgramsRefused::Communication(c) => TrainError::Communication(c),
        }
    }
}

impl TrainError {
    /// The kind of failure: bad input (bad data, sizes, arguments, a checkpoint for another
    /// model or schedule), a bug (programs of a verified plan that do not project or check, an
    /// invariant that does not hold), a failed run (a computation, a transport, a diverged loss)
    /// or a timeout; errors that wrap others keep their kind.
    pub fn kind(&self) -> FailureKind {
        match self {
            TrainError::NotUtf8 { .. }
            | TrainError::DataTooShort { .. }
            | TrainError::InvalidArgument { .. }
            | TrainError::MissingTensor { .. }
            | TrainError::UnexpectedTensor { .. }
            | TrainError::TensorShape { .. }
            | TrainError::TensorDType { .. }
            | TrainError::ConfigMismatch { .. }
            | TrainError::ScheduleMismatch { .. }
            | TrainError::Metadata { .. }
            | TrainError::Safetensors { .. }
            | TrainError::Batch { .. }
            | TrainError::Cut { .. } => FailureKind::BadInput,
            TrainError::Io { action, .. } => {
                if action.starts_with("read") || action.starts_with("list") {
                    FailureKind::BadInput
                } else {
                    FailureKind::Failed
                }
            }
            TrainError::Step { source, .. } | TrainError::Replica { source, .. } => source.kind(),
            TrainError::Kernel { kind, .. } => *kind,
            TrainError::Projection(_)
            | TrainError::Communication(_)
            | TrainError::MeasuredCosts(_)
            | TrainError::Replay(_)
            | TrainError::Trace(_)
            | TrainError::Invariant { .. } => FailureKind::Bug,
            TrainError::Tensor { .. }
            | TrainError::NonFiniteNorm { .. }
            | TrainError::Mpi { .. } => FailureKind::Failed,
            TrainError::Backend(e) => e.kind(),
        }
    }

    /// Whether the error is the user's input being wrong (exit status 2) rather than the run
    /// failing or a bug (exit status 1): [`TrainError::kind`] is [`FailureKind::BadInput`].
    pub fn is_bad_input(&self) -> bool {
        self.kind() == FailureKind::BadInput
    }

    /// An [`TrainError::Invariant`]: `what` does not hold.
    pub fn invariant(what: impl Into<String>) -> Self {
        TrainError::Invariant { what: what.into() }
    }

    /// A closure that turns an I/O error on `path` while doing `action` into [`TrainError::Io`].
    pub fn io(
        path: impl Into<PathBuf>,
        action: &'static str,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| TrainError::Io {
            path,
            action,
            source,
        }
    }

    /// A closure that turns a candle error while computing `what` into [`TrainError::Tensor`].
    pub fn tensor(what: impl Into<String>) -> impl FnOnce(candle_core::Error) -> Self {
        let what = what.into();
        move |source| TrainError::Tensor { what, source }
    }

    /// A closure that turns a kernel error while computing `what` on tensors the trainer built
    /// into [`TrainError::Kernel`]: bad input when it is about the data, a failed run when the
    /// tensor backend failed, a bug otherwise.
    pub fn kernel(what: impl Into<String>) -> impl FnOnce(pipeweave_kernels::KernelError) -> Self {
        let what = what.into();
        move |source| {
            let kind = kernel_fault(&source);
            TrainError::Kernel { what, kind, source }
        }
    }

    /// [`TrainError::kernel`] for a model or parameters the user chose (a configuration, a
    /// checkpoint): bad input unless the tensor backend failed.
    pub fn kernel_config(
        what: impl Into<String>,
    ) -> impl FnOnce(pipeweave_kernels::KernelError) -> Self {
        let what = what.into();
        move |source| {
            let kind = if source.is_backend_failure() {
                FailureKind::Failed
            } else {
                FailureKind::BadInput
            };
            TrainError::Kernel { what, kind, source }
        }
    }

    /// An [`TrainError::InvalidArgument`] for `field` with `value` rejected because of `reason`.
    pub fn invalid(
        field: &'static str,
        value: impl std::fmt::Display,
        reason: impl Into<String>,
    ) -> Self {
        TrainError::InvalidArgument {
            field,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// Whose fault a kernel error on tensors the trainer built is: the input's when it is about the
/// data (a token outside the vocabulary), the run's when the tensor backend failed or an
/// expert-parallel rank's exchange with its group did (a peer failed or is gone), a bug otherwise
/// (the kernels check every other tensor the trainer hands them).
pub(crate) fn kernel_fault(error: &pipeweave_kernels::KernelError) -> FailureKind {
    if error.is_about_data() {
        FailureKind::BadInput
    } else if error.is_backend_failure() || error.is_exchange_failure() {
        FailureKind::Failed
    } else {
        FailureKind::Bug
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_where_and_why() {
        let e = TrainError::NotUtf8 {
            path: "data/a.txt".into(),
            offset: 17,
        };
        assert_eq!(
            e.to_string(),
            "data/a.txt: not UTF-8 text (invalid byte sequence at byte offset 17)"
        );
        let e = TrainError::ConfigMismatch {
            path: "ck.safetensors".into(),
            field: "n_layer",
            checkpoint: "2".into(),
            expected: "4".into(),
        };
        let text = e.to_string();
        assert!(text.contains("n_layer") && text.contains('2') && text.contains('4'));
        assert!(e.is_bad_input());
    }

    #[test]
    fn kinds_survive_wrapping_and_decide_the_exit_status() {
        use pipeweave_backends::{BackendError, StageError};
        use pipeweave_core::RankId;
        let stage = |source: StageError| TrainError::Step {
            step: 3,
            source: Box::new(TrainError::Backend(BackendError::Stage {
                rank: RankId::new(1),
                instr: 4,
                what: "0F1".into(),
                source,
            })),
        };
        let data = stage(StageError::bad_input("token 300 outside the vocabulary"));
        assert_eq!(data.kind(), FailureKind::BadInput);
        assert_eq!(data.kind().exit_status(), 2);
        let bug = stage(StageError::bug("no saved forward state"));
        assert_eq!(bug.kind(), FailureKind::Bug);
        assert_eq!(bug.kind().exit_status(), 1);
        assert_eq!(
            stage(StageError::failed("--fail")).kind(),
            FailureKind::Failed
        );
        let stalled = TrainError::Backend(BackendError::Stalled {
            seconds: 1.0,
            report: vec![],
        });
        assert_eq!(stalled.kind(), FailureKind::Timeout);
        // Programs of a verified plan that fail the check: a bug in a pass, exit 1.
        let invariant = TrainError::invariant("position 0 received no gradient");
        assert_eq!(invariant.kind().exit_status(), 1);
        assert!(!invariant.is_bad_input());
        let cut = TrainError::Cut {
            reason: "3 stages for 2 layers".into(),
        };
        assert!(cut.is_bad_input());
    }

    #[test]
    fn io_errors_name_the_path_and_action() {
        let source = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = TrainError::io("x/y", "read")(source);
        assert_eq!(e.to_string(), "x/y: cannot read: gone");
        assert!(e.is_bad_input());
        let source = std::io::Error::new(std::io::ErrorKind::StorageFull, "full");
        assert!(!TrainError::io("x/y", "write")(source).is_bad_input());
    }
}
