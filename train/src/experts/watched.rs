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

/// The methods of [`StageCompute`] that may fail, each written as `inner`'s, its result watched
/// ([`Watched::watch`]): `fn name(&mut self, arg: Type, ...) -> Output;` per method, `Output`
/// what the method returns in its `Ok`.
macro_rules! watched {
    ($(fn $method:ident(&mut self $(, $arg:ident: $ty:ty)*) -> $output:ty;)+) => {$(
        fn $method(&mut self $(, $arg: $ty)*) -> Result<$output, StageError> {
            let result = self.inner.$method($($arg),*);
            self.watch(result)
        }
    )+};
}

impl<C: StageCompute> StageCompute for Watched<C> {
    type Tensor = C::Tensor;

    watched! {
        fn forward(&mut self, work: Work, input: Option<C::Tensor>) -> C::Tensor;
        fn loss(&mut self, work: Work, output: C::Tensor) -> C::Tensor;
        fn backward_input(&mut self, work: Work, grad_output: C::Tensor) -> Option<C::Tensor>;
        fn backward_weight(&mut self, work: Work) -> ();
        fn backward(&mut self, work: Work, grad_output: C::Tensor) -> Option<C::Tensor>;
        fn forward_backward(
            &mut self,
            forward: Work,
            input: Option<C::Tensor>,
            backward: Work,
            grad_output: C::Tensor
        ) -> (C::Tensor, Option<C::Tensor>);
        fn drop_activations(&mut self, work: Work) -> ();
        fn recompute(&mut self, work: Work) -> ();
        fn drop_weight_grad(&mut self, work: Work) -> ();
        fn recompute_weight_grad(&mut self, work: Work) -> ();
        fn offload(&mut self, work: Work) -> ();
        fn reload(&mut self, work: Work) -> ();
        fn grad_sync(&mut self, stage: StageId) -> ();
        fn flush(&mut self) -> ();
    }

    fn free_output(&mut self, work: Work) {
        self.inner.free_output(work);
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}
