//! The stage-compute trait: what a backend asks of the model. Tensors are opaque to the
//! interpreter; a scalar model, candle tensors or GPU buffers all fit.

use pipeweave_core::{StageId, Work};

use crate::stage_error::StageError;

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
        let grad_input = self.backward_input(work, grad_output)?;
        self.backward_weight(work)?;
        Ok(grad_input)
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
        let grad_input = self.backward_input(backward, grad_output)?;
        self.backward_weight(backward)?;
        Ok((output, grad_input))
    }

    /// The forward output of `work` was sent; its data may be released.
    fn free_output(&mut self, _work: Work) {}

    /// The forward of `work` just ran and the plan recomputes it before its backward: release
    /// what the forward saved except what [`StageCompute::recompute`] needs (the stage input).
    /// The default keeps everything: results stay right, and no memory is saved.
    fn drop_activations(&mut self, _work: Work) -> Result<(), StageError> {
        Ok(())
    }

    /// Rebuilds what the forward of `work` saved from what [`StageCompute::drop_activations`]
    /// kept (runs the forward again). The default has nothing to rebuild (its drop kept all).
    fn recompute(&mut self, _work: Work) -> Result<(), StageError> {
        Ok(())
    }

    /// Moves what the forward of `work` saved to the rank's host memory. The default keeps it
    /// where it is.
    fn offload(&mut self, _work: Work) -> Result<(), StageError> {
        Ok(())
    }

    /// Moves what [`StageCompute::offload`] moved back for the backward of `work`. The default
    /// has nothing to move.
    fn reload(&mut self, _work: Work) -> Result<(), StageError> {
        Ok(())
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
