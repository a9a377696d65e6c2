//! What runs around each of a [`GptStage`]'s kernel calls: the input a forward takes (after its
//! injected fault and the device copies freed offloads give back), and what a forward, an
//! input-gradient and a weight-gradient backward leave (the states kept, the byte ledger, the
//! gradients handed on). The calls in turn (`mod.rs`) and an overlapped pair's halves
//! (`pair.rs`) share them.

use super::ledger::{tensor_bytes, Table};
use super::{GptStage, Injection};
use candle_core::Tensor;
use pipeweave_backends::StageError;
use pipeweave_core::Work;
use pipeweave_kernels::{ChunkAt, StagePendingWeightGrad, StageSaved};
use std::time::Instant;

/// What a forward runs on: when it starts, its sequence chunk and its input.
pub(super) struct ForwardInput {
    pub(super) start: Instant,
    pub(super) chunk: Option<(ChunkAt, usize)>,
    pub(super) input: Tensor,
}

impl GptStage {
    /// What a forward of `work` runs on, once its injected fault and the device copies the
    /// offloads freed are through: its start, its sequence chunk and its input (the received
    /// hidden state, else the microbatch's tokens).
    pub(super) fn forward_input(
        &mut self,
        work: Work,
        input: Option<Tensor>,
    ) -> Result<ForwardInput, StageError> {
        match self.injection.take() {
            Some(Injection::Fail) => return Err(StageError::failed("injected failure (--fail)")),
            Some(Injection::Stall(pause)) => std::thread::sleep(pause),
            None => {}
        }
        self.free_offloaded(true)?;
        let start = Instant::now();
        let chunk = self.feed.chunk_at(work)?;
        let input = match input {
            Some(hidden) => hidden,
            None => self.feed.input(work, chunk)?,
        };
        Ok(ForwardInput {
            start,
            chunk,
            input,
        })
    }

    /// Keeps what `work`'s forward saved (and its input) for the backward, and counts its
    /// `output`'s bytes where it leaves the rank.
    pub(super) fn forward_ran(
        &mut self,
        work: Work,
        input: Tensor,
        output: &Tensor,
        saved: StageSaved,
    ) {
        if !self.forward_only {
            self.keep_saved(work, saved);
            self.recomputes.keep_input(work, &input);
            self.kept.set_last_input(work, input);
        }
        if self.stages.output_leaves(work.stage) {
            self.ledger.hold(Table::Output, work, tensor_bytes(output));
        }
    }

    /// Starts the offload the program issues right after `work`'s forward, if any.
    pub(super) fn offload_after_forward(&mut self, work: Work) -> Result<(), StageError> {
        if self.offloads.after_forward(work) && !self.forward_only {
            self.offload_at_producer(work)?;
        }
        Ok(())
    }

    /// Keeps what `work`'s input-gradient backward left for its W (and, where the program
    /// recomputes that, the output gradient); its saved state is no longer live.
    pub(super) fn input_grad_ran(
        &mut self,
        work: Work,
        grad_output: Tensor,
        pending: StagePendingWeightGrad,
    ) {
        self.recomputes.keep_grad(work, grad_output);
        self.ledger.release(Table::Saved, work);
        self.keep_pending(work, pending);
    }

    /// Hands `work`'s weight gradients on; what its W kept is no longer live.
    pub(super) fn weight_grad_ran(
        &mut self,
        work: Work,
        grads: Vec<Tensor>,
    ) -> Result<(), StageError> {
        self.ledger.release(Table::Pending, work);
        let position = self.stages.get(work.stage)?.position;
        let key = self.feed.data_id(work);
        self.outcomes.add_grads(work.stage, position, key, grads)
    }

    /// Keeps `saved` as the saved state of `work` until its backward, its bytes live.
    pub(super) fn keep_saved(&mut self, work: Work, saved: StageSaved) {
        let kept = saved.held_bytes();
        self.kept.keep_saved(work, saved);
        self.ledger.hold(Table::Saved, work, kept);
    }

    /// Keeps `pending` as what `work`'s W needs until it runs, its bytes live.
    pub(super) fn keep_pending(&mut self, work: Work, pending: StagePendingWeightGrad) {
        let kept = pending.held_bytes();
        self.kept.keep_pending(work, pending);
        self.ledger.hold(Table::Pending, work, kept);
    }
}
