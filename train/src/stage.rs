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
//!   [`GptStage::with_weight_recomputes`]);
//! - offload and reload (a plan's `offload` pass): the saved state is copied to this rank's host
//!   store and its device tensors released, then copied back (real copies, run in the rank's
//!   thread: this backend has no separate copy engine, so a transfer takes the rank's time);
//! - forward-only evaluation: forwards and losses without saved state for a backward.
//!
//! Every task's measured start and end are recorded for the trace of a step, and the live
//! activation bytes (the distinct tensors of the kernels' saved and pending states, and outputs
//! not yet sent) are counted with their peak, as are the bytes in the host store.

use crate::batch::StepBatch;
use crate::cut::ModelCut;
use crate::error::{kernel_fault, TrainError};
use crate::gradients::GradSync;
use candle_core::Tensor;
use pipeweave_backends::{Capabilities, StageCompute, StageError};
use pipeweave_core::{FailureKind, Instr, Problem, RankId, RankProgram, StageId, Task, Work};
use pipeweave_kernels::{
    CrossEntropy, HostPending, HostSaved, KernelError, StageModel, StagePendingWeightGrad,
    StageSaved,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// One task as it ran: which, and when (seconds since the step's start).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasuredOp {
    /// The task: a single op (F, I or W; a fused B or an overlapped F&B is recorded as its
    /// parts), a recompute, an offload or a reload.
    pub task: Task,
    /// Where and for what.
    pub work: Work,
    /// Start, in seconds since the step began.
    pub start: f64,
    /// End, in seconds since the step began.
    pub end: f64,
}

/// A fault injected into a rank's stage, for tests of failure handling (`--fail`, `--stall`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Injection {
    /// The rank's first forward of the step returns an error.
    Fail,
    /// The rank's first forward of the step stops responding for this long.
    Stall(std::time::Duration),
}

/// A stage of this rank: its position along the route and its layers.
#[derive(Debug, Clone)]
struct HeldStage {
    position: usize,
    model: StageModel,
}

/// One rank's share of a GPT for one step.
pub struct GptStage {
    rank: RankId,
    stages: BTreeMap<StageId, HeldStage>,
    batch: Arc<StepBatch>,
    cross_entropy: CrossEntropy,
    sync: Arc<dyn GradSync>,
    forward_only: bool,
    saved: HashMap<Work, StageSaved>,
    pending: HashMap<Work, StagePendingWeightGrad>,
    /// Stages whose next weight gradient is their last on this rank.
    last_weight: HashSet<StageId>,
    /// Summed loss of every microbatch whose loss this rank computed.
    losses: BTreeMap<u32, f64>,
    epoch: Instant,
    measured: Vec<MeasuredOp>,
    live_bytes: usize,
    peak_bytes: usize,
    saved_bytes: HashMap<Work, usize>,
    pending_bytes: HashMap<Work, usize>,
    output_bytes: HashMap<Work, usize>,
    /// The last forward's input (until the next forward): what a drop right after it keeps. An
    /// overlapped F&B runs its backward between its forward and the drop.
    last_input: Option<(Work, Tensor)>,
    /// Saved states copied to host memory.
    host: HashMap<Work, HostSaved>,
    /// Weight-gradient states copied to host memory (offloaded between a pair's I and W).
    host_pending: HashMap<Work, HostPending>,
    host_bytes: usize,
    host_peak_bytes: usize,
    /// The pairs this rank's program recomputes for their Ws (`RW`): their stage inputs are kept
    /// from the forward and their output gradients from the I, for the recompute.
    weight_recomputed: HashSet<Work>,
    /// Per such pair, its stage input (from its forward) and, once its I ran, the output
    /// gradient it received.
    weight_inputs: HashMap<Work, (Tensor, Option<Tensor>)>,
    /// Per pair whose W state is dropped, the live bytes of what it keeps for its `RW`.
    weight_checkpoint_bytes: HashMap<Work, usize>,
    /// Stages whose output leaves the rank (sent, or consumed by the loss): their output stays
    /// live until freed; a hand-over to a local next stage is not counted twice.
    outputs_leave: HashSet<StageId>,
    injection: Option<Injection>,
    /// The global index of this replica's microbatch 0 (data parallelism: replica `d` of `D`
    /// runs microbatches `d M .. (d + 1) M` of the global batch).
    offset: u32,
}

fn bytes(t: &Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
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
        let mut stages = BTreeMap::new();
        let held = problem.stages_of(rank);
        let outputs_leave = held
            .iter()
            .copied()
            .filter(|&stage| {
                problem.routes().iter().any(|route| {
                    route.contains(stage)
                        && route
                            .next(stage)
                            .is_none_or(|next| problem.rank_of(next) != Some(rank))
                })
            })
            .collect();
        for &stage in &held {
            let position = cut.position(stage).ok_or_else(|| {
                TrainError::invariant(format!("stage {stage} has no position in the model cut"))
            })?;
            let model = models
                .get(position)
                .ok_or_else(|| TrainError::invariant(format!("no model for position {position}")))?
                .clone();
            stages.insert(stage, HeldStage { position, model });
        }
        Ok(GptStage {
            rank,
            stages,
            batch,
            cross_entropy: CrossEntropy::new(Some(crate::batch::PAD_ID)),
            sync,
            forward_only: false,
            saved: HashMap::new(),
            pending: HashMap::new(),
            last_weight: HashSet::new(),
            losses: BTreeMap::new(),
            epoch,
            measured: Vec::new(),
            live_bytes: 0,
            peak_bytes: 0,
            saved_bytes: HashMap::new(),
            pending_bytes: HashMap::new(),
            output_bytes: HashMap::new(),
            last_input: None,
            host: HashMap::new(),
            host_pending: HashMap::new(),
            host_bytes: 0,
            host_peak_bytes: 0,
            weight_recomputed: HashSet::new(),
            weight_inputs: HashMap::new(),
            weight_checkpoint_bytes: HashMap::new(),
            outputs_leave,
            injection: None,
            offset: 0,
        })
    }

    /// This rank belongs to the data-parallel replica whose microbatch 0 is the global batch's
    /// microbatch `offset`: it reads those microbatches and reports their losses and gradients
    /// under their global index.
    pub fn with_offset(mut self, offset: u32) -> GptStage {
        self.offset = offset;
        self
    }

    fn global(&self, work: Work) -> u32 {
        self.offset + work.microbatch.get()
    }

    /// The data microbatch `work`'s slot holds: the key of deterministic sums.
    fn data_id(&self, work: Work) -> u32 {
        let global = self.global(work);
        self.batch.data_id(global as usize).unwrap_or(global)
    }

    /// The `what` (`input`, `targets`) of `work`'s microbatch in the step's batch, by `pick`.
    fn batch_entry(
        &self,
        work: Work,
        what: &str,
        pick: fn(&StepBatch, usize) -> Option<&Tensor>,
    ) -> Result<&Tensor, StageError> {
        pick(&self.batch, self.global(work) as usize).ok_or_else(|| {
            StageError::bug(format!(
                "the batch has no {what} for microbatch {}",
                work.microbatch
            ))
        })
    }

    /// Injects `injection` into this rank's first forward.
    pub fn with_injection(mut self, injection: Option<Injection>) -> GptStage {
        self.injection = injection;
        self
    }

    /// The pairs `program` recomputes for their Ws (its `RW` tasks): their stage inputs and
    /// output gradients are kept for the recompute.
    pub fn with_weight_recomputes(mut self, program: &RankProgram) -> GptStage {
        self.weight_recomputed = program
            .instrs
            .iter()
            .filter_map(|i| match i {
                Instr::Compute(Task::RecomputeWeightGrad(w)) => Some(*w),
                _ => None,
            })
            .collect();
        self
    }

    /// Runs forwards without keeping state for a backward (evaluation).
    pub fn forward_only(mut self) -> GptStage {
        self.forward_only = true;
        self
    }

    /// The rank.
    pub fn rank(&self) -> RankId {
        self.rank
    }

    /// Summed token loss of every microbatch whose loss this rank computed.
    pub fn losses(&self) -> &BTreeMap<u32, f64> {
        &self.losses
    }

    /// Every op as it ran.
    pub fn measured(&self) -> &[MeasuredOp] {
        &self.measured
    }

    /// The most activation bytes held at once (on the device).
    pub fn peak_activation_bytes(&self) -> usize {
        self.peak_bytes
    }

    /// The most bytes of saved states held in the host store at once.
    pub fn peak_host_bytes(&self) -> usize {
        self.host_peak_bytes
    }

    fn stage(&self, stage: StageId) -> Result<&HeldStage, StageError> {
        self.stages
            .get(&stage)
            .ok_or_else(|| StageError::bug(format!("rank {} holds no stage {stage}", self.rank)))
    }

    fn record(&mut self, task: Task, start: Instant) {
        self.measured.push(MeasuredOp {
            task,
            work: task.work(),
            start: start.duration_since(self.epoch).as_secs_f64(),
            end: self.epoch.elapsed().as_secs_f64(),
        });
    }

    /// The live bytes held for `table`, per op.
    fn table(&mut self, table: Table) -> &mut HashMap<Work, usize> {
        match table {
            Table::Saved => &mut self.saved_bytes,
            Table::Pending => &mut self.pending_bytes,
            Table::Output => &mut self.output_bytes,
            Table::WeightCheckpoint => &mut self.weight_checkpoint_bytes,
        }
    }

    fn hold(&mut self, table: Table, work: Work, amount: usize) {
        self.table(table).insert(work, amount);
        self.live_bytes += amount;
        self.peak_bytes = self.peak_bytes.max(self.live_bytes);
    }

    fn release(&mut self, table: Table, work: Work) {
        if let Some(amount) = self.table(table).remove(&work) {
            self.live_bytes -= amount;
        }
    }

    /// Keeps `saved` as the saved state of `work` until its backward, its bytes live.
    fn keep_saved(&mut self, work: Work, saved: StageSaved) {
        let kept = saved.held_bytes();
        self.saved.insert(work, saved);
        self.hold(Table::Saved, work, kept);
    }
}

/// What live activation bytes are held for: a forward's saved state (until its input-gradient
/// backward), its pending weight-gradient state (until its W), an output not yet sent.
#[derive(Clone, Copy)]
enum Table {
    Saved,
    Pending,
    Output,
    /// What a pair whose W state was dropped keeps for its `RW` (stage input, output gradient).
    WeightCheckpoint,
}

impl StageCompute for GptStage {
    type Tensor = Tensor;

    fn forward(&mut self, work: Work, input: Option<Tensor>) -> Result<Tensor, StageError> {
        match self.injection.take() {
            Some(Injection::Fail) => return Err(StageError::failed("injected failure (--fail)")),
            Some(Injection::Stall(pause)) => std::thread::sleep(pause),
            None => {}
        }
        let start = Instant::now();
        let input = match input {
            Some(hidden) => hidden,
            None => self.batch_entry(work, "input", StepBatch::input)?.clone(),
        };
        let held = self.stage(work.stage)?;
        let (output, saved) = held
            .model
            .forward(&input)
            .map_err(kernel_failure(work, "forward"))?;
        if !self.forward_only {
            self.keep_saved(work, saved);
            if self.weight_recomputed.contains(&work) {
                self.weight_inputs.insert(work, (input.clone(), None));
            }
            self.last_input = Some((work, input));
        }
        if self.outputs_leave.contains(&work.stage) {
            self.hold(Table::Output, work, bytes(&output));
        }
        self.record(Task::Forward(work), start);
        Ok(output)
    }

    fn loss(&mut self, work: Work, logits: Tensor) -> Result<Tensor, StageError> {
        let targets = self.batch_entry(work, "targets", StepBatch::target)?;
        let held = self.stage(work.stage)?;
        let out = self
            .cross_entropy
            .loss_and_grad(
                held.model.primitives(),
                &logits,
                targets,
                self.batch.normalizer(),
            )
            .map_err(kernel_failure(work, "loss"))?;
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
        self.losses.insert(self.data_id(work), loss);
        self.release(Table::Output, work);
        // The loss belongs to the last stage's forward (nothing can run between them): its
        // measured forward ends here, as a profile's head forward includes the loss.
        let now = self.epoch.elapsed().as_secs_f64();
        if let Some(op) = self
            .measured
            .iter_mut()
            .rev()
            .find(|op| op.task == Task::Forward(work))
        {
            op.end = now;
        }
        Ok(out.grad_logits)
    }

    fn backward_input(
        &mut self,
        work: Work,
        grad_output: Tensor,
    ) -> Result<Option<Tensor>, StageError> {
        let start = Instant::now();
        let on_host = self.host.contains_key(&work);
        let saved = self
            .saved
            .remove(&work)
            .ok_or_else(|| missing_state("saved forward state", work, on_host))?;
        let held = self.stage(work.stage)?;
        let (grad_input, pending) = held
            .model
            .backward_input(saved, &grad_output)
            .map_err(kernel_failure(work, "input-gradient backward"))?;
        if let Some((_, grad)) = self.weight_inputs.get_mut(&work) {
            *grad = Some(grad_output);
        }
        let kept = pending.held_bytes();
        self.pending.insert(work, pending);
        self.release(Table::Saved, work);
        self.hold(Table::Pending, work, kept);
        self.record(Task::InputGrad(work), start);
        Ok(grad_input)
    }

    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        let start = Instant::now();
        let on_host = self.host_pending.contains_key(&work);
        let pending = self
            .pending
            .remove(&work)
            .ok_or_else(|| missing_state("input-gradient state", work, on_host))?;
        let held = self.stage(work.stage)?;
        let position = held.position;
        let grads = held
            .model
            .backward_weight(pending)
            .map_err(kernel_failure(work, "weight-gradient backward"))?;
        self.release(Table::Pending, work);
        let microbatch = self.data_id(work);
        self.sync.add(position, microbatch, grads)?;
        if self.last_weight.remove(&work.stage) {
            self.sync.stage_complete(position)?;
        }
        self.record(Task::WeightGrad(work), start);
        Ok(())
    }

    fn free_output(&mut self, work: Work) {
        self.release(Table::Output, work);
    }

    /// Drop and recompute, offload and reload: every residency instruction.
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn drop_activations(&mut self, work: Work) -> Result<(), StageError> {
        let input = match self.last_input.take() {
            Some((last, input)) if last == work => input,
            _ => {
                return Err(StageError::bug(format!(
                    "drop of {}: it must follow that forward directly",
                    display(work)
                )))
            }
        };
        if self.saved.remove(&work).is_none() {
            return Err(StageError::bug(format!(
                "drop of {}: no saved state",
                display(work)
            )));
        }
        self.release(Table::Saved, work);
        let checkpoint = self.stage(work.stage)?.model.checkpoint(&input);
        self.keep_saved(work, checkpoint);
        Ok(())
    }

    fn recompute(&mut self, work: Work) -> Result<(), StageError> {
        let start = Instant::now();
        let checkpoint = self
            .saved
            .remove(&work)
            .filter(StageSaved::is_checkpoint)
            .ok_or_else(|| {
                StageError::bug(format!(
                    "recompute of {}: it was not dropped",
                    display(work)
                ))
            })?;
        let model = &self.stage(work.stage)?.model;
        let rebuilt = model
            .recompute_state(checkpoint)
            .map_err(kernel_failure(work, "recompute"))?;
        self.release(Table::Saved, work);
        self.keep_saved(work, rebuilt);
        self.record(Task::Recompute(work), start);
        Ok(())
    }

    fn drop_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        let kept = match self.weight_inputs.get(&work) {
            Some((input, Some(grad))) => bytes(input) + bytes(grad),
            _ => {
                return Err(StageError::bug(format!(
                    "drop of {}'s weight-gradient state: its input and output gradient were not \
                     kept (the program does not recompute it for its W)",
                    display(work)
                )))
            }
        };
        if self.pending.remove(&work).is_none() {
            return Err(missing_state("input-gradient state to drop", work, false));
        }
        self.release(Table::Pending, work);
        self.hold(Table::WeightCheckpoint, work, kept);
        Ok(())
    }

    fn recompute_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        let start = Instant::now();
        let Some((input, Some(grad_output))) = self.weight_inputs.remove(&work) else {
            return Err(StageError::bug(format!(
                "recompute of {}'s weight-gradient state: nothing was kept for it",
                display(work)
            )));
        };
        let model = &self.stage(work.stage)?.model;
        let saved = model
            .recompute_state(model.checkpoint(&input))
            .map_err(kernel_failure(work, "recompute for the weight gradient"))?;
        // The input gradient computed again is not used: the I sent it already.
        let (_, pending) = model
            .backward_input(saved, &grad_output)
            .map_err(kernel_failure(work, "recompute for the weight gradient"))?;
        self.release(Table::WeightCheckpoint, work);
        let kept = pending.held_bytes();
        self.pending.insert(work, pending);
        self.hold(Table::Pending, work, kept);
        self.record(Task::RecomputeWeightGrad(work), start);
        Ok(())
    }

    /// Moves the pair's saved state to host memory, or, after its input-gradient backward, what
    /// that backward keeps for the weight gradient.
    fn offload(&mut self, work: Work) -> Result<(), StageError> {
        let start = Instant::now();
        let copied = if let Some(saved) = self.saved.remove(&work) {
            let copied = saved.to_host().map_err(kernel_failure(work, "offload"))?;
            self.release(Table::Saved, work);
            let bytes = copied.bytes();
            self.host.insert(work, copied);
            bytes
        } else if let Some(pending) = self.pending.remove(&work) {
            let copied = pending.to_host().map_err(kernel_failure(work, "offload"))?;
            self.release(Table::Pending, work);
            let bytes = copied.bytes();
            self.host_pending.insert(work, copied);
            bytes
        } else {
            return Err(StageError::bug(format!(
                "offload of {}: no saved or weight-gradient state",
                display(work)
            )));
        };
        self.host_bytes += copied;
        self.host_peak_bytes = self.host_peak_bytes.max(self.host_bytes);
        self.record(Task::Offload(work), start);
        Ok(())
    }

    fn reload(&mut self, work: Work) -> Result<(), StageError> {
        let start = Instant::now();
        if let Some(copied) = self.host.remove(&work) {
            self.host_bytes -= copied.bytes();
            let saved = copied.to_device().map_err(kernel_failure(work, "reload"))?;
            self.keep_saved(work, saved);
        } else if let Some(copied) = self.host_pending.remove(&work) {
            self.host_bytes -= copied.bytes();
            let pending = copied.to_device().map_err(kernel_failure(work, "reload"))?;
            let kept = pending.held_bytes();
            self.pending.insert(work, pending);
            self.hold(Table::Pending, work, kept);
        } else {
            return Err(StageError::bug(format!(
                "reload of {}: nothing in the host store",
                display(work)
            )));
        }
        self.record(Task::Reload(work), start);
        Ok(())
    }

    fn grad_sync(&mut self, stage: StageId) -> Result<(), StageError> {
        self.stage(stage)?;
        self.last_weight.insert(stage);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StageError> {
        match self.pending.keys().chain(self.host_pending.keys()).next() {
            Some(work) => Err(StageError::bug(format!(
                "the weight gradient of {} never ran",
                display(*work)
            ))),
            None => Ok(()),
        }
    }
}

/// A kernel error of `what` for `work` as a stage error of its kind ([`kernel_fault`]: the stage
/// built every tensor the kernels check but the data's).
fn kernel_failure(work: Work, what: &'static str) -> impl FnOnce(KernelError) -> StageError {
    move |e| StageError::caused_by(kernel_fault(&e), format!("{what} of {}", display(work)), e)
}

/// The bug of a backward that finds no `what` for `work` on the device (`on_host`: it is in the
/// host store, no reload ran).
fn missing_state(what: &str, work: Work, on_host: bool) -> StageError {
    let place = if on_host {
        " on the device (it is in the host store: no reload ran)"
    } else {
        ""
    };
    StageError::bug(format!("no {what} for {}{place}", display(work)))
}

fn display(work: Work) -> String {
    format!("stage {} microbatch {}", work.stage, work.microbatch)
}
