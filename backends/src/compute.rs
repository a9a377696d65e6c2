//! The stage-compute trait: what a backend asks of the model. Tensors are opaque to the
//! interpreter; a scalar model, candle tensors or GPU buffers all fit.
//!
//! The residency instructions (drop and recompute, offload and reload) are capabilities: a
//! compute declares the ones it implements ([`StageCompute::capabilities`], none by default), and
//! the interpreter refuses a program that needs one it lacks before it runs any instruction
//! ([`crate::BackendError::Unsupported`]), so a plan counting on a memory saving never runs
//! without it.

use pipeweave_core::{Instr, StageId, Task, Work};
use std::fmt;

use crate::stage_error::StageError;

/// A residency capability a program may need of its compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// Drop a forward's saved state to its input and rebuild it before the backward
    /// (`Instr::Drop`, `Task::Recompute`); drop what a W keeps after its input-gradient
    /// backward and rebuild it before the W (`Instr::Drop` after the I,
    /// `Task::RecomputeWeightGrad`).
    Recompute,
    /// Move a forward's saved state to host memory and back (`Instr::Offload`, `Instr::Reload`,
    /// `Task::Offload`, `Task::Reload`).
    Offload,
}

impl Capability {
    /// The capability `instr` needs, if any.
    pub fn needed_by(instr: &Instr) -> Option<Capability> {
        match instr {
            Instr::Drop(_) | Instr::Compute(Task::Recompute(_) | Task::RecomputeWeightGrad(_)) => {
                Some(Capability::Recompute)
            }
            Instr::Offload(_)
            | Instr::Reload(_)
            | Instr::Compute(Task::Offload(_))
            | Instr::Compute(Task::Reload(_)) => Some(Capability::Offload),
            _ => None,
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Capability::Recompute => "recompute (drop and recompute)",
            Capability::Offload => "offload (offload and reload)",
        })
    }
}

/// The residency capabilities a compute implements ([`StageCompute::capabilities`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Capabilities {
    /// [`StageCompute::drop_activations`] and [`StageCompute::recompute`] are implemented.
    pub recompute: bool,
    /// [`StageCompute::offload`] and [`StageCompute::reload`] are implemented.
    pub offload: bool,
}

impl Capabilities {
    /// No residency instruction: the default of every compute.
    pub const NONE: Capabilities = Capabilities {
        recompute: false,
        offload: false,
    };

    /// Every residency instruction.
    pub const ALL: Capabilities = Capabilities {
        recompute: true,
        offload: true,
    };

    /// Whether `capability` is among these.
    pub fn supports(self, capability: Capability) -> bool {
        match capability {
            Capability::Recompute => self.recompute,
            Capability::Offload => self.offload,
        }
    }

    /// The first instruction of `instrs` (its index, the capability) these lack, if any.
    pub fn first_unsupported(self, instrs: &[Instr]) -> Option<(usize, Capability)> {
        instrs.iter().enumerate().find_map(|(index, instr)| {
            Capability::needed_by(instr)
                .filter(|&c| !self.supports(c))
                .map(|c| (index, c))
        })
    }
}

/// One rank's share of the model: the computations of the stages it holds.
///
/// Errors are [`StageError`]s: what went wrong, its kind (bad input, a bug, a failed computation)
/// and its typed cause; the interpreter adds the rank and instruction.
pub trait StageCompute {
    /// What flows between stages (activations and gradients).
    type Tensor: Send + 'static;

    /// Forward of `work`; `input` is None on the first stage of a route (the stage loads the
    /// microbatch itself). Keeps whatever the backward needs.
    fn forward(
        &mut self,
        work: Work,
        input: Option<Self::Tensor>,
    ) -> Result<Self::Tensor, StageError>;

    /// The loss of `work` (on the last stage of its route), from its forward output; returns the
    /// gradient of the loss with respect to that output.
    fn loss(&mut self, work: Work, output: Self::Tensor) -> Result<Self::Tensor, StageError>;

    /// Input-gradient backward of `work` from the gradient of its output; returns the gradient
    /// with respect to its input, or None on the first stage of a route.
    fn backward_input(
        &mut self,
        work: Work,
        grad_output: Self::Tensor,
    ) -> Result<Option<Self::Tensor>, StageError>;

    /// Weight-gradient backward of `work` (after its input-gradient backward).
    fn backward_weight(&mut self, work: Work) -> Result<(), StageError>;

    /// A whole backward of `work` (input and weight gradients) as one op. The default runs the
    /// two halves one after the other; a stage that fuses them (or charges the fused op's time)
    /// overrides it.
    fn backward(
        &mut self,
        work: Work,
        grad_output: Self::Tensor,
    ) -> Result<Option<Self::Tensor>, StageError> {
        backward_in_halves(self, work, grad_output)
    }

    /// One forward and one full backward run as one overlapped op. The default runs them one
    /// after the other; a backend that overlaps computation and communication overrides it.
    fn forward_backward(
        &mut self,
        forward: Work,
        input: Option<Self::Tensor>,
        backward: Work,
        grad_output: Self::Tensor,
    ) -> Result<(Self::Tensor, Option<Self::Tensor>), StageError> {
        let output = self.forward(forward, input)?;
        let grad_input = backward_in_halves(self, backward, grad_output)?;
        Ok((output, grad_input))
    }

    /// The forward output of `work` was sent; its data may be released.
    fn free_output(&mut self, _work: Work) {}

    /// The residency instructions this compute implements. The default is
    /// [`Capabilities::NONE`]: a program with a drop, recompute, offload or reload is refused
    /// before it runs ([`crate::BackendError::Unsupported`]). A compute that overrides the
    /// methods of a capability declares it here.
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }

    /// The forward of `work` just ran and the plan recomputes it before its backward: release
    /// what the forward saved except what [`StageCompute::recompute`] needs (the stage input).
    /// Called only when [`StageCompute::capabilities`] declares `recompute`; the default is an
    /// error (a compute that declares the capability implements it).
    fn drop_activations(&mut self, work: Work) -> Result<(), StageError> {
        Err(not_implemented("drop", work))
    }

    /// Rebuilds what the forward of `work` saved from what [`StageCompute::drop_activations`]
    /// kept (runs the forward again). Called only with the `recompute` capability; the default
    /// is an error.
    fn recompute(&mut self, work: Work) -> Result<(), StageError> {
        Err(not_implemented("recompute", work))
    }

    /// The input-gradient backward of `work` ran and the plan rebuilds what its W needs right
    /// before the W: release that state except what [`StageCompute::recompute_weight_grad`]
    /// needs (the stage input and the output gradient the backward received). Called only with
    /// the `recompute` capability; the default is an error.
    fn drop_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        Err(not_implemented("drop (weight-gradient state)", work))
    }

    /// Rebuilds what the W of `work` needs from what [`StageCompute::drop_weight_grad`] kept
    /// (runs the forward and the input-gradient backward again; the input gradient is not
    /// used). Called only with the `recompute` capability; the default is an error.
    fn recompute_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        Err(not_implemented("recompute (weight-gradient state)", work))
    }

    /// Moves what the forward of `work` saved to the rank's host memory. Called only with the
    /// `offload` capability; the default is an error.
    fn offload(&mut self, work: Work) -> Result<(), StageError> {
        Err(not_implemented("offload", work))
    }

    /// Moves what [`StageCompute::offload`] moved back for the backward of `work`. Called only
    /// with the `offload` capability; the default is an error.
    fn reload(&mut self, work: Work) -> Result<(), StageError> {
        Err(not_implemented("reload", work))
    }

    /// The next compute finishes the weight gradients of `stage` on this rank: start its
    /// data-parallel gradient sync after it.
    fn grad_sync(&mut self, _stage: StageId) -> Result<(), StageError> {
        Ok(())
    }

    /// End of the step: flush weight gradients still pending.
    fn flush(&mut self) -> Result<(), StageError> {
        Ok(())
    }
}

/// A whole backward of `work` run as its two halves, the input gradient's then the weight
/// gradient's: what [`StageCompute::backward`] does by default (and a compute that only times the
/// two as one op).
pub(crate) fn backward_in_halves<C: StageCompute + ?Sized>(
    compute: &mut C,
    work: Work,
    grad_output: C::Tensor,
) -> Result<Option<C::Tensor>, StageError> {
    let grad_input = compute.backward_input(work, grad_output)?;
    compute.backward_weight(work)?;
    Ok(grad_input)
}

/// The error of a residency method a compute declared but did not implement.
fn not_implemented(what: &str, work: Work) -> StageError {
    StageError::bug(format!(
        "{what} of stage {} microbatch {}: the compute declares the capability but does not \
         implement it",
        work.stage, work.microbatch
    ))
}
