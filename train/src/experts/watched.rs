//! [`Watched`]: a rank's compute that raises its step's failure flag when any of its
//! operations fails, so that the expert ranks waiting on it in an exchange stop at once instead
//! of at the receive timeout (the threads backend ends a failed rank's pipeline, but a rank of
//! another pipeline waits on it through the exchange, not the pipeline's messages).

use pipeweave_backends::{Capabilities, StageCompute, StageError};
use pipeweave_core::{StageId, Work};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `inner`, raising `failed` on its first error.
pub(crate) struct Watched<C> {
    inner: C,
    failed: Arc<AtomicBool>,
}

impl<C> Watched<C> {
    /// `inner` watched by `failed`.
    pub(crate) fn new(inner: C, failed: Arc<AtomicBool>) -> Self {
        Watched { inner, failed }
    }

    /// The compute.
    pub(crate) fn into_inner(self) -> C {
        self.inner
    }

    /// `result`, raising the flag if it is an error.
    fn watch<T>(&self, result: Result<T, StageError>) -> Result<T, StageError> {
        if result.is_err() {
            self.failed.store(true, Ordering::Release);
        }
        result
    }
}

impl<C: StageCompute> StageCompute for Watched<C> {
    type Tensor = C::Tensor;

    fn forward(&mut self, work: Work, input: Option<C::Tensor>) -> Result<C::Tensor, StageError> {
        let result = self.inner.forward(work, input);
        self.watch(result)
    }

    fn loss(&mut self, work: Work, output: C::Tensor) -> Result<C::Tensor, StageError> {
        let result = self.inner.loss(work, output);
        self.watch(result)
    }

    fn backward_input(
        &mut self,
        work: Work,
        grad_output: C::Tensor,
    ) -> Result<Option<C::Tensor>, StageError> {
        let result = self.inner.backward_input(work, grad_output);
        self.watch(result)
    }

    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        let result = self.inner.backward_weight(work);
        self.watch(result)
    }

    fn backward(
        &mut self,
        work: Work,
        grad_output: C::Tensor,
    ) -> Result<Option<C::Tensor>, StageError> {
        let result = self.inner.backward(work, grad_output);
        self.watch(result)
    }

    fn forward_backward(
        &mut self,
        forward: Work,
        input: Option<C::Tensor>,
        backward: Work,
        grad_output: C::Tensor,
    ) -> Result<(C::Tensor, Option<C::Tensor>), StageError> {
        let result = self
            .inner
            .forward_backward(forward, input, backward, grad_output);
        self.watch(result)
    }

    fn free_output(&mut self, work: Work) {
        self.inner.free_output(work);
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn drop_activations(&mut self, work: Work) -> Result<(), StageError> {
        let result = self.inner.drop_activations(work);
        self.watch(result)
    }

    fn recompute(&mut self, work: Work) -> Result<(), StageError> {
        let result = self.inner.recompute(work);
        self.watch(result)
    }

    fn drop_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        let result = self.inner.drop_weight_grad(work);
        self.watch(result)
    }

    fn recompute_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        let result = self.inner.recompute_weight_grad(work);
        self.watch(result)
    }

    fn offload(&mut self, work: Work) -> Result<(), StageError> {
        let result = self.inner.offload(work);
        self.watch(result)
    }

    fn reload(&mut self, work: Work) -> Result<(), StageError> {
        let result = self.inner.reload(work);
        self.watch(result)
    }

    fn grad_sync(&mut self, stage: StageId) -> Result<(), StageError> {
        let result = self.inner.grad_sync(stage);
        self.watch(result)
    }

    fn flush(&mut self) -> Result<(), StageError> {
        let result = self.inner.flush();
        self.watch(result)
    }
}
