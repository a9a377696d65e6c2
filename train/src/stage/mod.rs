//! [`GptStage`]: one rank's share of a GPT as a [`StageCompute`], honouring every marker of the
//! projected programs (it declares every residency capability,
//! [`pipeweave_backends::Capabilities::ALL`]).
//!
//! - forward: token ids from the step's batch on a route's first stage, else the received hidden
//!   state; the saved state waits for the backward (only the input, with recompute);
//! - loss: the cross-entropy of the last stage's logits against the microbatch's targets,
//!   normalised by the global batch's token count ([`crate::batch`]); its gradient starts the
//!   backward;
//! - input- and weight-gradient backwards: the kernels' split halves; a microbatch's weight
//!   gradients go to the [`GradSync`] of the stage's position;
//! - grad-sync marker: the next weight gradient of that stage is its last on this rank; after it,
//!   [`GradSync::stage_complete`] runs (where a data-parallel all-reduce starts);
//! - flush: no weight gradient may still be pending;
//! - free-output: the sent activation's bytes leave the live count;
//! - drop and recompute (a plan's `recompute` pass): the forward's saved state is cut to its input
//!   right after the forward, and rebuilt by running the forward again before the backward;
//! - drop and recompute for the W (an `RW` of a plan's `recompute` pass): after the
//!   input-gradient backward, what the W needs is released, the stage input (kept from the
//!   forward) and the output gradient kept; before the W the forward and the input-gradient
//!   backward run again from them (the pairs are known from the program,
//!   [`GptStage::with_residency`]);
//! - offload and reload (a plan's `offload` pass): the saved state is copied to this rank's host
//!   store and its device tensors released, then copied back, by the rank's host link
//!   ([`crate::host_link`]: a worker thread beside the computes, one transfer at a time). An
//!   offload starts where the plan issues it (right after its forward, or its I for what the W
//!   keeps); its place in the program frees the device copy once the copy ends, and what
//!   allocates next (a forward, a recompute, a reload) waits for that; the backward that needs a
//!   reloaded state waits for its reload;
//! - forward-only evaluation: forwards and losses without saved state for a backward.
//!
//! Every task's measured start and end are recorded for the trace of a step, and the live
//! activation bytes (the distinct tensors of the kernels' saved and pending states, and outputs
//! not yet sent) are counted with their peak, as are the bytes in the host store.
//!
//! The parts, one job each (this file only runs the markers through them):
//!
//! - `held.rs`: the stages the rank holds and whose outputs leave it;
//! - `feed.rs`: the step's inputs and targets as the rank reads them, and the loss;
//! - `kept.rs`: the states kept on the device between a pair's ops;
//! - `ledger.rs`: the byte accounting (live activation bytes per op and their peak);
//! - `offload.rs`: the offload state machine over the host link;
//! - `recompute.rs`: the store of what a weight-gradient recompute needs, and the recompute;
//! - `outcomes.rs`: the losses and weight gradients handed on;
//! - `record.rs`: the measured timeline ([`MeasuredOp`]);
//! - `ran.rs`: what runs around each kernel call (the inputs it takes, what it keeps);
//! - `pair.rs`: an overlapped F&B pair's halves on two threads ([`Pairs`]);
//! - `faults.rs`: the stage's errors.

mod faults;
mod feed;
#[cfg(test)]
mod fixtures;
mod held;
mod kept;
mod ledger;
mod offload;
mod outcomes;
mod pair;
mod ran;
mod recompute;
mod record;

pub use pair::Pairs;
pub use record::MeasuredOp;

use crate::batch::StepBatch;
use crate::chunks::SequenceChunks;
use crate::cut::ModelCut;
use crate::error::TrainError;
use crate::experts::slot::ComputeSlot;
use crate::gradients::GradSync;
use crate::host_link::DeviceState;
use candle_core::Tensor;
use faults::{display, kernel_failure, missing_state, residency_bug, weight_state_bug};
use feed::StepFeed;
use held::HeldStages;
use kept::KeptStates;
use ledger::{Ledger, Table};
use offload::Offloads;
use outcomes::Outcomes;
use pipeweave_backends::{Capabilities, StageCompute, StageError};
use pipeweave_core::{
    FailureKind, Instr, OpKind, Problem, RankId, RankProgram, StageId, Task, Work,
};
use pipeweave_kernels::{
    ExpertPlacement, SequenceState, StageModel, StagePendingWeightGrad, StageSaved,
};
use recompute::WeightRecomputes;
use record::Recorder;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// A fault injected into a rank's stage, for tests of failure handling (`--fail`, `--stall`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Injection {
    /// The rank's first forward of the step returns an error.
    Fail,
    /// The rank's first forward of the step stops responding for this long.
    Stall(std::time::Duration),
}

/// One rank's share of a GPT for one step.
pub struct GptStage {
    stages: HeldStages,
    feed: StepFeed,
    outcomes: Outcomes,
    forward_only: bool,
    injection: Option<Injection>,
    kept: KeptStates,
    ledger: Ledger,
    offloads: Offloads,
    recomputes: WeightRecomputes,
    recorder: Recorder,
    /// The rank's compute stream, where its pairs run overlapped ([`Pairs`]).
    slot: Option<Arc<ComputeSlot>>,
    /// The thread running its pairs' forward halves, once a pair ran overlapped.
    pair_worker: Option<pair::PairWorker>,
}

impl GptStage {
    /// The share of `rank` of `problem`: one model per stage it holds (the models of `cut`'s
    /// positions, in `models`, cloned; tensors are shared, not copied).
    pub fn new(
        rank: RankId,
        problem: &Problem,
        cut: &ModelCut,
        models: &[StageModel],
        batch: Arc<StepBatch>,
        sync: Arc<dyn GradSync>,
        epoch: Instant,
    ) -> Result<GptStage, TrainError> {
        Ok(GptStage {
            stages: HeldStages::new(rank, problem, cut, models)?,
            feed: StepFeed::new(batch, SequenceChunks::of(problem)),
            outcomes: Outcomes::new(sync),
            forward_only: false,
            injection: None,
            kept: KeptStates::default(),
            ledger: Ledger::default(),
            offloads: Offloads::default(),
            recomputes: WeightRecomputes::default(),
            recorder: Recorder::new(epoch),
            slot: None,
            pair_worker: None,
        })
    }

    /// This rank belongs to the data-parallel replica whose microbatch 0 is the global batch's
    /// microbatch `offset`: it reads those microbatches and reports their losses and gradients
    /// under their global index.
    pub fn with_offset(mut self, offset: u32) -> GptStage {
        self.feed.set_offset(offset);
        self
    }

    /// Runs this rank's mixtures of experts as the expert rank of `placement` does (its
    /// experts only, their rows exchanged with its group; `None`: every expert here). Its
    /// overlapped pairs then run their halves overlapped ([`Pairs`]).
    pub fn with_experts(
        mut self,
        placement: Option<&ExpertPlacement>,
    ) -> Result<GptStage, TrainError> {
        if let Some(placement) = placement {
            self.stages.place_experts(placement)?;
            self.slot = Some(ComputeSlot::new());
        }
        Ok(self)
    }

    /// Injects `injection` into this rank's first forward.
    pub fn with_injection(mut self, injection: Option<Injection>) -> GptStage {
        self.injection = injection;
        self
    }

    /// What `program` does with its pairs' state beyond keeping it: the pairs it recomputes
    /// for their Ws (its `RW` tasks: their stage inputs and output gradients are kept for the
    /// recompute), and those it offloads after their forward or their I (the copies start there
    /// on the host link; the program's `offload` is where the device copy is freed).
    pub fn with_residency(mut self, program: &RankProgram) -> GptStage {
        let mut backed = HashSet::new();
        for instr in &program.instrs {
            match instr {
                Instr::Compute(Task::RecomputeWeightGrad(w)) => self.recomputes.mark(*w),
                Instr::Compute(task) => {
                    for op in task.ops().iter().filter(|op| op.kind == OpKind::InputGrad) {
                        backed.insert(Work::new(op.stage.get(), op.microbatch.get()));
                    }
                }
                Instr::Offload(w) if backed.contains(w) => self.offloads.issue_after_input(*w),
                Instr::Offload(w) => self.offloads.issue_after_forward(*w),
                _ => {}
            }
        }
        self
    }

    /// Runs forwards without keeping state for a backward (evaluation).
    pub fn forward_only(mut self) -> GptStage {
        self.forward_only = true;
        self
    }

    /// The rank.
    pub fn rank(&self) -> RankId {
        self.stages.rank()
    }

    /// Summed token loss of every microbatch whose loss this rank computed.
    pub fn losses(&self) -> &BTreeMap<u32, f64> {
        self.outcomes.losses()
    }

    /// Every op as it ran.
    pub fn measured(&self) -> &[MeasuredOp] {
        self.recorder.measured()
    }

    /// The most activation bytes held at once (on the device).
    pub fn peak_activation_bytes(&self) -> usize {
        self.ledger.peak()
    }

    /// The most bytes of saved states held in the host store at once.
    pub fn peak_host_bytes(&self) -> usize {
        self.offloads.host_peak_bytes()
    }

    /// `work`'s stage model and, for a sequence chunk, what the stage keeps of its group's
    /// earlier chunks.
    fn model_and_state(
        &mut self,
        work: Work,
        chunked: bool,
    ) -> Result<(&StageModel, Option<&mut SequenceState>), StageError> {
        let held = self.stages.get(work.stage)?;
        let layers = held.model.layout().layers().len();
        let state = chunked.then(|| self.feed.chunks().state(work, layers));
        Ok((&held.model, state))
    }

    /// Starts copying `work`'s state (its saved state, else what its I keeps) to the host store.
    fn start_offload(&mut self, work: Work) -> Result<(), StageError> {
        let (state, table) = self
            .kept
            .take_either(work)
            .ok_or_else(|| residency_bug("offload", work, "no saved or weight-gradient state"))?;
        let bytes = self.ledger.held(table, work).unwrap_or(0);
        self.offloads.start(work, state, table, bytes)
    }

    /// Frees the device copies of the offloads whose place passed and whose copy ended;
    /// `wait`: first waits for those copies (what allocates device memory does).
    fn free_offloaded(&mut self, wait: bool) -> Result<(), StageError> {
        for (table, work) in self.offloads.freed(wait)? {
            self.ledger.release(table, work);
        }
        Ok(())
    }

    /// Starts the offload the program issues right after `work`'s producer (its forward, or its
    /// I for what the W keeps); its place in the program frees the device copy later.
    fn offload_at_producer(&mut self, work: Work) -> Result<(), StageError> {
        self.start_offload(work)?;
        self.offloads.issue(work);
        Ok(())
    }

    /// `work`'s forward state on the device: kept, or back from the host link (waiting for its
    /// reload to end).
    fn saved_state(&mut self, work: Work) -> Result<StageSaved, StageError> {
        let kept = self.kept.take_saved(work);
        self.on_device(work, "saved forward state", kept, |state| match state {
            DeviceState::Saved(saved) => Some(saved),
            DeviceState::Pending(_) => None,
        })
    }

    /// What `work`'s I kept for its W on the device: kept, or back from the host link.
    fn pending_state(&mut self, work: Work) -> Result<StagePendingWeightGrad, StageError> {
        let kept = self.kept.take_pending(work);
        self.on_device(work, "input-gradient state", kept, |state| match state {
            DeviceState::Pending(pending) => Some(pending),
            DeviceState::Saved(_) => None,
        })
    }

    /// `kept`, else `work`'s `what` back from the host link as `unpack` finds it there.
    fn on_device<T>(
        &mut self,
        work: Work,
        what: &str,
        kept: Option<T>,
        unpack: fn(DeviceState) -> Option<T>,
    ) -> Result<T, StageError> {
        if let Some(state) = kept {
            return Ok(state);
        }
        match self.offloads.take(work)?.and_then(unpack) {
            Some(state) => Ok(state),
            None => Err(missing_state(what, work, self.offloads.on_host(work))),
        }
    }
}

impl StageCompute for GptStage {
    type Tensor = Tensor;

    fn forward(&mut self, work: Work, input: Option<Tensor>) -> Result<Tensor, StageError> {
        let ran::ForwardInput {
            start,
            chunk,
            input,
        } = self.forward_input(work, input)?;
        let (model, state) = self.model_and_state(work, chunk.is_some())?;
        let (output, saved) = match (chunk, state) {
            (Some((at, _)), Some(state)) => model.forward_chunk(&input, at, state),
            _ => model.forward(&input),
        }
        .map_err(kernel_failure(work, "forward"))?;
        let chunks = self.feed.chunks();
        if self.forward_only && chunks.split() && chunks.is_last(work) {
            chunks.finish(work, true)?;
        }
        self.forward_ran(work, input, &output, saved);
        self.recorder.record(Task::Forward(work), start);
        self.offload_after_forward(work)?;
        Ok(output)
    }

    fn loss(&mut self, work: Work, logits: Tensor) -> Result<Tensor, StageError> {
        let ops = self.stages.get(work.stage)?.model.primitives();
        let out = self.feed.loss(ops, work, &logits)?;
        let loss = out
            .loss_sum
            .to_dtype(candle_core::DType::F64)
            .and_then(|t| t.to_scalar::<f64>())
            .map_err(|e| {
                StageError::caused_by(
                    FailureKind::Failed,
                    format!("the loss of {}", display(work)),
                    e,
                )
            })?;
        if !loss.is_finite() {
            // Training diverged: the run fails, nobody's input or code is at fault.
            return Err(StageError::failed(format!(
                "the loss of microbatch {} is not finite ({loss})",
                work.microbatch
            )));
        }
        self.outcomes.add_loss(self.feed.data_id(work), loss);
        self.ledger.release(Table::Output, work);
        // The loss belongs to the last stage's forward (nothing can run between them): its
        // measured forward ends here, as a profile's head forward includes the loss.
        self.recorder.extend_forward(work);
        Ok(out.grad_logits)
    }

    fn backward_input(
        &mut self,
        work: Work,
        grad_output: Tensor,
    ) -> Result<Option<Tensor>, StageError> {
        let saved = self.saved_state(work)?;
        // Timed from here: waiting for a reload is the link's time, not the backward's.
        let start = Instant::now();
        let chunk = self.feed.chunk_at(work)?;
        let (model, state) = self.model_and_state(work, chunk.is_some())?;
        let (grad_input, pending) = match (chunk, state) {
            (Some((at, _)), Some(state)) => {
                model.backward_input_chunk(saved, &grad_output, at, state)
            }
            _ => model.backward_input(saved, &grad_output),
        }
        .map_err(kernel_failure(work, "input-gradient backward"))?;
        if matches!(chunk, Some((at, _)) if at.index == 0) {
            self.feed.chunks().finish(work, false)?;
        }
        self.input_grad_ran(work, grad_output, pending);
        self.recorder.record(Task::InputGrad(work), start);
        if self.offloads.after_input(work) {
            self.offload_at_producer(work)?;
        }
        Ok(grad_input)
    }

    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        let pending = self.pending_state(work)?;
        let start = Instant::now();
        let grads = self
            .stages
            .get(work.stage)?
            .model
            .backward_weight(pending)
            .map_err(kernel_failure(work, "weight-gradient backward"))?;
        self.weight_grad_ran(work, grads)?;
        self.recorder.record(Task::WeightGrad(work), start);
        Ok(())
    }

    fn forward_backward(
        &mut self,
        forward: Work,
        input: Option<Tensor>,
        backward: Work,
        grad_output: Tensor,
    ) -> Result<(Tensor, Option<Tensor>), StageError> {
        match self.overlap_slot(forward, backward)? {
            Some(slot) => self.overlapped(slot, forward, input, backward, grad_output),
            None => {
                let output = self.forward(forward, input)?;
                let grad_input = self.backward_input(backward, grad_output)?;
                self.backward_weight(backward)?;
                Ok((output, grad_input))
            }
        }
    }

    fn free_output(&mut self, work: Work) {
        self.ledger.release(Table::Output, work);
    }

    /// Drop and recompute, offload and reload: every residency instruction.
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn drop_activations(&mut self, work: Work) -> Result<(), StageError> {
        let input = self
            .kept
            .take_last_input(work)
            .ok_or_else(|| residency_bug("drop", work, "it must follow that forward directly"))?;
        if self.kept.take_saved(work).is_none() {
            return Err(residency_bug("drop", work, "no saved state"));
        }
        self.ledger.release(Table::Saved, work);
        let checkpoint = self.stages.get(work.stage)?.model.checkpoint(&input);
        self.keep_saved(work, checkpoint);
        Ok(())
    }

    fn recompute(&mut self, work: Work) -> Result<(), StageError> {
        self.free_offloaded(true)?;
        let start = Instant::now();
        let checkpoint = self
            .kept
            .take_saved(work)
            .filter(StageSaved::is_checkpoint)
            .ok_or_else(|| residency_bug("recompute", work, "it was not dropped"))?;
        let chunk = self.feed.chunk_at(work)?;
        let (model, state) = self.model_and_state(work, chunk.is_some())?;
        let rebuilt = match (chunk, state) {
            (Some((at, _)), Some(state)) => model.recompute_chunk_state(checkpoint, at, state),
            _ => model.recompute_state(checkpoint),
        }
        .map_err(kernel_failure(work, "recompute"))?;
        self.ledger.release(Table::Saved, work);
        self.keep_saved(work, rebuilt);
        self.recorder.record(Task::Recompute(work), start);
        Ok(())
    }

    fn drop_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        let kept = self.recomputes.checkpoint_bytes(work).ok_or_else(|| {
            let not_kept = "its input and output gradient were not kept (the program does not \
                            recompute it for its W)";
            weight_state_bug("drop", work, not_kept)
        })?;
        if self.kept.take_pending(work).is_none() {
            return Err(missing_state("input-gradient state to drop", work, false));
        }
        self.ledger.release(Table::Pending, work);
        self.ledger.hold(Table::WeightCheckpoint, work, kept);
        Ok(())
    }

    fn recompute_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        if self.feed.chunks().split() {
            // Running a chunk's I again would send its keys' gradients back twice.
            return Err(StageError::bad_input(format!(
                "recompute of {}'s weight-gradient state: a sequence chunk's W state is not \
                 recomputed (write recompute(..., weight_grads=keep))",
                display(work)
            )));
        }
        self.free_offloaded(true)?;
        let start = Instant::now();
        let (input, grad_output) = self
            .recomputes
            .take(work)
            .ok_or_else(|| weight_state_bug("recompute", work, "nothing was kept for it"))?;
        let model = &self.stages.get(work.stage)?.model;
        let pending = recompute::rebuild(model, &input, &grad_output)
            .map_err(kernel_failure(work, "recompute for the weight gradient"))?;
        self.ledger.release(Table::WeightCheckpoint, work);
        self.keep_pending(work, pending);
        self.recorder.record(Task::RecomputeWeightGrad(work), start);
        Ok(())
    }

    /// Moves the pair's saved state to host memory, or, after its input-gradient backward, what
    /// that backward keeps for the weight gradient.
    fn offload(&mut self, work: Work) -> Result<(), StageError> {
        // Started at its producer where the program says so; here its device copy is freed
        // (once the copy ends: what allocates next waits for it).
        if !self.offloads.take_issued(work) {
            self.start_offload(work)?;
        }
        self.offloads.place(work);
        self.free_offloaded(false)
    }

    fn reload(&mut self, work: Work) -> Result<(), StageError> {
        // A reload allocates: the device copies freed before it are free by then.
        self.free_offloaded(true)?;
        if let Some((table, bytes)) = self.offloads.reload(work)? {
            self.ledger.hold(table, work, bytes);
        }
        Ok(())
    }

    fn grad_sync(&mut self, stage: StageId) -> Result<(), StageError> {
        self.stages.get(stage)?;
        self.outcomes.announce_last(stage);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StageError> {
        self.free_offloaded(false)?;
        let transfers = self.offloads.finish()?;
        self.recorder.transfers(transfers);
        match self
            .kept
            .any_pending()
            .or_else(|| self.offloads.any_moving())
        {
            Some(work) => Err(StageError::bug(format!(
                "the weight gradient of {} never ran",
                display(work)
            ))),
            None => Ok(()),
        }
    }
}
