//! The stage's errors: a kernel's failure for a pair, a state missing on the device, and how a
//! pair is named in them.

use crate::error::kernel_fault;
use pipeweave_backends::StageError;
use pipeweave_core::Work;
use pipeweave_kernels::KernelError;

/// A kernel error of `what` for `work` as a stage error of its kind ([`kernel_fault`]: the stage
/// built every tensor the kernels check but the data's).
pub(crate) fn kernel_failure(
    work: Work,
    what: &'static str,
) -> impl FnOnce(KernelError) -> StageError {
    move |e| StageError::caused_by(kernel_fault(&e), format!("{what} of {}", display(work)), e)
}

/// The bug of a backward that finds no `what` for `work` on the device (`on_host`: it is in the
/// host store, no reload ran).
pub(crate) fn missing_state(what: &str, work: Work, on_host: bool) -> StageError {
    let place = if on_host {
        " on the device (it is in the host store: no reload ran)"
    } else {
        ""
    };
    StageError::bug(format!("no {what} for {}{place}", display(work)))
}

/// The bug of a residency instruction `doing` (`drop`, `recompute`, `offload`) that finds
/// `problem` with `work`'s state: `drop of stage 1 microbatch 3: no saved state`.
pub(crate) fn residency_bug(doing: &str, work: Work, problem: &str) -> StageError {
    StageError::bug(format!("{doing} of {}: {problem}", display(work)))
}

/// [`residency_bug`] of the state `work`'s input-gradient backward keeps for its W.
pub(crate) fn weight_state_bug(doing: &str, work: Work, problem: &str) -> StageError {
    let state = format!("{}'s weight-gradient state", display(work));
    StageError::bug(format!("{doing} of {state}: {problem}"))
}

/// `work` in a message: `stage 1 microbatch 3`.
pub(crate) fn display(work: Work) -> String {
    format!("stage {} microbatch {}", work.stage, work.microbatch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::FailureKind;

    #[test]
    fn a_missing_state_is_a_bug_that_says_where_it_is() {
        let work = Work::new(2, 5);
        let on_device = missing_state("saved forward state", work, false);
        let on_host = missing_state("saved forward state", work, true);
        assert_eq!(on_device.kind(), FailureKind::Bug);
        assert!(on_device
            .to_string()
            .contains("no saved forward state for stage 2 microbatch 5"));
        assert!(on_host.to_string().contains("no reload ran"));
    }
}
