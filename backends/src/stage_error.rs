//! [`StageError`]: why a [`crate::StageCompute`] call failed, with the [`FailureKind`] of the
//! failure (bad input, a bug, a failed computation, a timeout) and the underlying error, typed,
//! as its source. The interpreter adds the rank and the instruction
//! ([`crate::BackendError::Stage`]), and the kind travels up to whoever decides what to do
//! (`train_gpt`'s exit status).

use std::error::Error;
use std::fmt;
use std::sync::Arc;

use pipeweave_core::FailureKind;

/// A stage's failure: what failed, of which kind, and (when another error caused it) that
/// error.
#[derive(Debug, Clone)]
pub struct StageError {
    kind: FailureKind,
    what: String,
    source: Option<Arc<dyn Error + Send + Sync + 'static>>,
}

impl StageError {
    /// A failure of `kind`, described by `what`.
    pub fn new(kind: FailureKind, what: impl Into<String>) -> StageError {
        StageError {
            kind,
            what: what.into(),
            source: None,
        }
    }

    /// A failure of `kind` while doing `what`, caused by `source`.
    pub fn caused_by(
        kind: FailureKind,
        what: impl Into<String>,
        source: impl Error + Send + Sync + 'static,
    ) -> StageError {
        StageError {
            kind,
            what: what.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The input was wrong (e.g. a token outside the vocabulary).
    pub fn bad_input(what: impl Into<String>) -> StageError {
        StageError::new(FailureKind::BadInput, what)
    }

    /// A bug: the program asked for something the stage's state makes impossible (a backward
    /// without its forward, a missing saved state).
    pub fn bug(what: impl Into<String>) -> StageError {
        StageError::new(FailureKind::Bug, what)
    }

    /// The computation failed.
    pub fn failed(what: impl Into<String>) -> StageError {
        StageError::new(FailureKind::Failed, what)
    }

    /// The kind of failure.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }

    /// What failed, without the source.
    pub fn what(&self) -> &str {
        &self.what
    }
}

impl fmt::Display for StageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(source) => write!(f, "{}: {source}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

impl Error for StageError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// Equal when kind and message are (the sources compare by their messages).
impl PartialEq for StageError {
    fn eq(&self, other: &StageError) -> bool {
        self.kind == other.kind && self.to_string() == other.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_is_kept_typed_and_shown() {
        let io = std::io::Error::other("disk gone");
        let e = StageError::caused_by(FailureKind::Failed, "saving activations", io);
        assert_eq!(e.to_string(), "saving activations: disk gone");
        assert_eq!(e.kind(), FailureKind::Failed);
        let source = e.source().expect("a source");
        assert!(source.downcast_ref::<std::io::Error>().is_some());
        assert_eq!(StageError::bug("x").kind(), FailureKind::Bug);
        assert_eq!(StageError::bad_input("x").kind(), FailureKind::BadInput);
        assert_ne!(StageError::bug("x"), StageError::failed("x"));
    }
}
