//! The crate's one error type, [`KernelError`]: every fallible function of the crate returns it,
//! and each variant says what was wrong, where (which layer or tensor) and why.

use candle_core::DType;

/// Result type of the crate.
pub type Result<T> = std::result::Result<T, KernelError>;

/// Everything that can go wrong in `pipeweave-kernels`.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A tensor has the wrong shape.
    #[error("{layer}: `{tensor}` has shape {actual:?}, expected {expected}")]
    Shape {
        /// The layer or function that checked the shape.
        layer: &'static str,
        /// Which tensor (argument or parameter) is wrong.
        tensor: &'static str,
        /// The shape it has.
        actual: Vec<usize>,
        /// What was expected, in words (e.g. `"[B, T, 768]"`).
        expected: String,
    },
    /// A tensor has the wrong element type.
    #[error("{layer}: `{tensor}` has dtype {actual:?}, expected {expected}")]
    DType {
        /// The layer or function that checked the dtype.
        layer: &'static str,
        /// Which tensor is wrong.
        tensor: &'static str,
        /// The dtype it has.
        actual: DType,
        /// What was expected, in words.
        expected: String,
    },
    /// A token id (input or target) is not below the vocabulary size.
    #[error("{layer}: `{tensor}` holds token id {id} at flat position {position}, but the vocabulary has only {vocab_size} tokens")]
    TokenOutOfRange {
        /// The layer or function that read the ids.
        layer: &'static str,
        /// Which tensor holds the bad id.
        tensor: &'static str,
        /// Row-major position of the bad id.
        position: usize,
        /// The bad id.
        id: u32,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A sequence is longer than the learned position table.
    #[error("{layer}: sequence length {seq_len} exceeds the maximum of {max_seq_len} positions")]
    SequenceTooLong {
        /// The layer that checked the length.
        layer: &'static str,
        /// The length given.
        seq_len: usize,
        /// The number of learned positions.
        max_seq_len: usize,
    },
    /// A configuration value or scalar argument is out of its domain.
    #[error("invalid {field} = {value}: {reason}")]
    InvalidArgument {
        /// Which field or argument.
        field: &'static str,
        /// Its value, formatted.
        value: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A mixture of experts would send each token to more experts than it has.
    #[error("top-k {top_k} is above the {experts} experts")]
    TopKAboveExperts {
        /// The experts per token asked for.
        top_k: usize,
        /// The number of experts.
        experts: usize,
    },
    /// The expert-parallel ranks cannot hold equal shares of the experts.
    #[error("{ranks} expert-parallel ranks do not divide the {experts} experts")]
    ExpertRanksDoNotDivide {
        /// The number of expert-parallel ranks.
        ranks: usize,
        /// The number of experts.
        experts: usize,
    },
    /// An expert-parallel rank outside the ranks.
    #[error("expert-parallel rank {rank} is not below the {ranks} ranks")]
    ExpertRankOutOfRange {
        /// The rank given.
        rank: usize,
        /// The number of expert-parallel ranks.
        ranks: usize,
    },
    /// Rows handed to a phase of a mixture of experts do not match its routing or its experts
    /// (an expert missing, repeated, or not held).
    #[error("Moe::{phase}: {problem}")]
    ExpertRowsMismatch {
        /// The phase that checked the rows (`combine`, `experts`, ...).
        phase: &'static str,
        /// What does not match.
        problem: String,
    },
    /// An expert-parallel rank could not exchange its experts' rows with its group (a rank of
    /// the group failed, is gone, or did not answer in time).
    #[error("expert exchange ({phase}): {reason}")]
    ExpertExchange {
        /// The mixture's phase (`combine`, `dispatch_backward`).
        phase: &'static str,
        /// What went wrong, naming the ranks.
        reason: String,
    },
    /// A list of parameters has the wrong length.
    #[error("{layer}: got {actual} parameter tensors, expected {expected}")]
    ParameterCount {
        /// The layer or model that took the list.
        layer: &'static str,
        /// How many were given.
        actual: usize,
        /// How many the layer has.
        expected: usize,
    },
    /// An error raised inside a named part of a model, with the part's GPT-2 name.
    #[error("in `{location}`: {source}")]
    At {
        /// The part of the model, e.g. `transformer.h.3`.
        location: String,
        /// The error raised there.
        #[source]
        source: Box<KernelError>,
    },
    /// The tensor backend (candle) failed inside a primitive op.
    #[error("primitive `{op}` failed in the tensor backend: {source}")]
    Backend {
        /// The primitive op.
        op: &'static str,
        /// candle's error.
        #[source]
        source: candle_core::Error,
    },
}

impl KernelError {
    /// Wraps `self` with the model location where it was raised.
    pub fn at(self, location: impl Into<String>) -> Self {
        KernelError::At {
            location: location.into(),
            source: Box::new(self),
        }
    }

    /// The error itself, under any [`KernelError::At`] locations.
    pub fn innermost(&self) -> &KernelError {
        match self {
            KernelError::At { source, .. } => source.innermost(),
            other => other,
        }
    }

    /// Whether the error is about the data fed to the model (a token id outside the
    /// vocabulary, a sequence longer than the position table) rather than the model's own
    /// tensors or the tensor backend.
    pub fn is_about_data(&self) -> bool {
        matches!(
            self.innermost(),
            KernelError::TokenOutOfRange { .. } | KernelError::SequenceTooLong { .. }
        )
    }

    /// Whether an expert-parallel rank's exchange with its group failed (a transport's failure,
    /// not a check of the kernels').
    pub fn is_exchange_failure(&self) -> bool {
        matches!(self.innermost(), KernelError::ExpertExchange { .. })
    }

    /// Whether the tensor backend failed (rather than a check of the kernels').
    pub fn is_backend_failure(&self) -> bool {
        matches!(self.innermost(), KernelError::Backend { .. })
    }

    /// A closure that turns a candle error of primitive `op` into a [`KernelError::Backend`].
    pub(crate) fn backend(op: &'static str) -> impl FnOnce(candle_core::Error) -> Self {
        move |source| KernelError::Backend { op, source }
    }
}

/// Fails with [`KernelError::InvalidArgument`] (`field = value`, rejected for `reason`) unless
/// `valid`: a configuration's check of one value.
pub(crate) fn require(
    valid: bool,
    field: &'static str,
    value: impl std::fmt::Display,
    reason: &'static str,
) -> Result<()> {
    if valid {
        return Ok(());
    }
    Err(KernelError::InvalidArgument {
        field,
        value: value.to_string(),
        reason,
    })
}
