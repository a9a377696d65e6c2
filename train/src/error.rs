//! The crate's one error type, [`TrainError`]: every fallible function of the crate returns it,
//! and each variant says what went wrong, where (which file, tensor, field or part of the run)
//! and why.
//!
//! **Adding variants.** The enum is deliberately not `#[non_exhaustive]`: add a variant per new
//! kind of failure (e.g. a stage error naming the rank and the instruction, a non-finite loss, a
//! lost peer), with fields that name what and where, and classify it in
//! [`TrainError::is_bad_input`], whose `match` has no wildcard so that the compiler asks for it.

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
    #[error("batch: {0}")]
    Batch(String),
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
    #[error("cutting the model into stages: {0}")]
    Cut(String),
    /// The schedule's plan cannot be turned into checked rank programs.
    #[error("plan: {0}")]
    Plan(String),
    /// A stage's computation, or the gathering of its results, failed.
    #[error("stage: {0}")]
    Stage(String),
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

impl TrainError {
    /// Whether the error is the user's input being wrong (exit status 2: bad data, sizes,
    /// arguments, a checkpoint for another model or schedule) rather than the run failing (exit
    /// status 1).
    pub fn is_bad_input(&self) -> bool {
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
            | TrainError::Cut(_)
            | TrainError::Plan(_) => true,
            TrainError::Io { action, .. } => {
                action.starts_with("read") || action.starts_with("list")
            }
            TrainError::Step { source, .. } | TrainError::Replica { source, .. } => {
                source.is_bad_input()
            }
            TrainError::Tensor { .. }
            | TrainError::Kernel { .. }
            | TrainError::NonFiniteNorm { .. }
            | TrainError::Batch(_)
            | TrainError::Stage(_)
            | TrainError::Backend(_) => false,
        }
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

    /// A closure that turns a kernel error while computing `what` into [`TrainError::Kernel`].
    pub fn kernel(what: impl Into<String>) -> impl FnOnce(pipeweave_kernels::KernelError) -> Self {
        let what = what.into();
        move |source| TrainError::Kernel { what, source }
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
    fn io_errors_name_the_path_and_action() {
        let source = std::io::Error::new(std::io::ErrorKind::NotFound, "gone");
        let e = TrainError::io("x/y", "read")(source);
        assert_eq!(e.to_string(), "x/y: cannot read: gone");
        assert!(e.is_bad_input());
        let source = std::io::Error::new(std::io::ErrorKind::StorageFull, "full");
        assert!(!TrainError::io("x/y", "write")(source).is_bad_input());
    }
}
