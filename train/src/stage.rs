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

use crate::batch::StepBatch;
use crate::chunks::SequenceChunks;
use crate::cut::ModelCut;
use crate::error::{kernel_fault, TrainError};
use crate::gradients::GradSync;
use crate::host_link::{DeviceState, HostLink};
use candle_core::Tensor;
use pipeweave_backends::{Capabilities, StageCompute, StageError};
use pipeweave_core::{
    FailureKind, Instr, OpKind, Problem, RankId, RankProgram, StageId, Task, Work,
};
use pipeweave_kernels::{
    ChunkAt, CrossEntropy, KernelError, SequenceState, StageModel, StagePendingWeightGrad,
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
    /// The rank's host link: offloads and reloads copied beside the computes.
    link: HostLink,
    /// The pairs this rank's program offloads right after their forward, and right after their
    /// I (what the W keeps): their copies start there, as the plan issues them.
    offload_after_forward: HashSet<Work>,
    offload_after_input: HashSet<Work>,
    /// Offloads started at their producer whose place in the program has not come yet.
    issued: HashSet<Work>,
    /// Offloads whose place passed, their device copies not yet freed (until their copy ends).
    placed: HashSet<Work>,
    /// Per pair on its way to or in the host store, the table and bytes of its device copy.
    moving: HashMap<Work, (Table, usize)>,
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
    /// The plan's sequence chunks (a `seq_split` plan) and each stage's memory of its groups'
    /// earlier chunks.
    chunks: SequenceChunks,
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
            link: HostLink::default(),
            offload_after_forward: HashSet::new(),
            offload_after_input: HashSet::new(),
            issued: HashSet::new(),
            placed: HashSet::new(),
            moving: HashMap::new(),
            weight_recomputed: HashSet::new(),
            weight_inputs: HashMap::new(),
            weight_checkpoint_bytes: HashMap::new(),
            outputs_leave,
            injection: None,
            offset: 0,
            chunks: SequenceChunks::of(problem),
        })
    }

    /// This rank belongs to the data-parallel replica whose microbatch 0 is the global batch's
    /// microbatch `offset`: it reads those microbatches and reports their losses and gradients
    /// under their global index.
    pub fn with_offset(mut self, offset: u32) -> GptStage {
        self.offset = offset;
        self
    }

    /// The global index in the step's batch of `work`'s microbatch (of its sample group where
    /// the sequences are split into chunks).
    fn global(&self, work: Work) -> u32 {
        self.offset + self.chunks.group(work)
    }

    /// The data microbatch `work`'s slot holds (with sequence chunks, its group's and its
    /// chunk): the key of deterministic sums.
    fn data_id(&self, work: Work) -> u32 {
        let global = self.global(work);
        let group = self.batch.data_id(global as usize).unwrap_or(global);
        self.chunks.key(work, group)
    }

    /// Where `work`'s chunk sits in its group's sequence and its length (None: whole
    /// sequences), from the group's input.
    fn chunk_at(&self, work: Work) -> Result<Option<(ChunkAt, usize)>, StageError> {
        if !self.chunks.split() {
            return Ok(None);
        }
        let input = self.batch_entry(work, "input", StepBatch::input)?;
        let tokens = input.dims().get(1).copied().unwrap_or(0);
        self.chunks.at(work, tokens)
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

    /// What `program` does with its pairs' state beyond keeping it: the pairs it recomputes
    /// for their Ws (its `RW` tasks: their stage inputs and output gradients are kept for the
    /// recompute), and those it offloads after their forward or their I (the copies start there
    /// on the host link; the program's `offload` is where the device copy is freed).
    pub fn with_residency(mut self, program: &RankProgram) -> GptStage {
        let mut backed = HashSet::new();
        for instr in &program.instrs {
            match instr {
                Instr::Compute(Task::RecomputeWeightGrad(w)) => {
                    self.weight_recomputed.insert(*w);
                }
                Instr::Compute(task) => {
                    for op in task.ops().iter().filter(|op| op.kind == OpKind::InputGrad) {
                        backed.insert(Work::new(op.stage.get(), op.microbatch.get()));
                    }
                }
                Instr::Offload(w) if backed.contains(w) => {
                    self.offload_after_input.insert(*w);
                }
                Instr::Offload(w) => {
                    self.offload_after_forward.insert(*w);
                }
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
        self.link.host_peak_bytes()
    }

    fn stage(&self, stage: StageId) -> Result<&HeldStage, StageError> {
        self.stages
            .get(&stage)
            .ok_or_else(|| StageError::bug(format!("rank {} holds no stage {stage}", self.rank)))
    }

    /// `work`'s stage model and, for a sequence chunk, what the stage keeps of its group's
    /// earlier chunks.
    fn model_and_state(
        &mut self,
        work: Work,
        chunked: bool,
    ) -> Result<(&StageModel, Option<&mut SequenceState>), StageError> {
        let rank = self.rank;
        let held = self
            .stages
            .get(&work.stage)
            .ok_or_else(|| StageError::bug(format!("rank {rank} holds no stage {}", work.stage)))?;
        let state = chunked.then(|| self.chunks.state(work, held.model.layout().layers().len()));
        Ok((&held.model, state))
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

    /// Starts copying `work`'s state (its saved state, else what its I keeps) to the host store.
    fn start_offload(&mut self, work: Work) -> Result<(), StageError> {
        let (state, table) = if let Some(saved) = self.saved.remove(&work) {
            (DeviceState::Saved(saved), Table::Saved)
        } else if let Some(pending) = self.pending.remove(&work) {
            (DeviceState::Pending(pending), Table::Pending)
        } else {
            return Err(StageError::bug(format!(
                "offload of {}: no saved or weight-gradient state",
                display(work)
            )));
        };
        let bytes = self.table(table).get(&work).copied().unwrap_or(0);
        self.moving.insert(work, (table, bytes));
        self.link.offload(work, state)
    }

    /// Frees the device copies of the offloads whose place passed and whose copy ended;
    /// `wait`: first waits for those copies (what allocates device memory does).
    fn free_offloaded(&mut self, wait: bool) -> Result<(), StageError> {
        if wait {
            let placed = &self.placed;
            self.link.settle(|w| placed.contains(w))?;
        } else {
            self.link.poll()?;
        }
        let freed: Vec<Work> = self.placed.iter().copied().collect();
        for work in freed {
            if self.link.finished(work) {
                self.placed.remove(&work);
                if let Some(&(table, _)) = self.moving.get(&work) {
                    self.release(table, work);
                }
            }
        }
        Ok(())
    }

    /// Starts the offload the program issues right after `work`'s producer (its forward, or its
    /// I for what the W keeps); its place in the program frees the device copy later.
    fn offload_at_producer(&mut self, work: Work) -> Result<(), StageError> {
        self.start_offload(work)?;
        self.issued.insert(work);
        Ok(())
    }

    /// `work`'s forward state on the device: kept, or back from the host link (waiting for its
    /// reload to end).
    fn saved_state(&mut self, work: Work) -> Result<StageSaved, StageError> {
        if let Some(saved) = self.saved.remove(&work) {
            return Ok(saved);
        }
        match self.link.take(work)? {
            Some(DeviceState::Saved(saved)) => Ok(saved),
            _ => Err(missing_state(
                "saved forward state",
                work,
                self.link.holds(work),
            )),
        }
    }

    /// What `work`'s I kept for its W on the device: kept, or back from the host link.
    fn pending_state(&mut self, work: Work) -> Result<StagePendingWeightGrad, StageError> {
        if let Some(pending) = self.pending.remove(&work) {
            return Ok(pending);
        }
        match self.link.take(work)? {
            Some(DeviceState::Pending(pending)) => Ok(pending),
            _ => Err(missing_state(
                "input-gradient state",
                work,
                self.link.holds(work),
            )),
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
        self.free_offloaded(true)?;
        let start = Instant::now();
        let chunk = self.chunk_at(work)?;
        let input = match (input, chunk) {
            (Some(hidden), _) => hidden,
            (None, None) => self.batch_entry(work, "input", StepBatch::input)?.clone(),
            (None, Some((at, len))) => {
                let ids = self.batch_entry(work, "input", StepBatch::input)?;
                SequenceChunks::narrow(ids, at, len)?
            }
        };
        let (model, state) = self.model_and_state(work, chunk.is_some())?;
        let (output, saved) = match (chunk, state) {
            (Some((at, _)), Some(state)) => model.forward_chunk(&input, at, state),
            _ => model.forward(&input),
        }
        .map_err(kernel_failure(work, "forward"))?;
        if self.forward_only && self.chunks.split() && self.chunks.is_last(work) {
            self.chunks.finish(work, true)?;
        }
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
        if self.offload_after_forward.contains(&work) && !self.forward_only {
            self.offload_at_producer(work)?;
        }
        Ok(output)
    }

    fn loss(&mut self, work: Work, logits: Tensor) -> Result<Tensor, StageError> {
        let targets = self.batch_entry(work, "targets", StepBatch::target)?;
        let targets = match self.chunk_at(work)? {
            Some((at, len)) => SequenceChunks::narrow(targets, at, len)?,
            None => targets.clone(),
        };
        let held = self.stage(work.stage)?;
        let out = self
            .cross_entropy
            .loss_and_grad(
                held.model.primitives(),
                &logits,
                &targets,
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
        let saved = self.saved_state(work)?;
        // Timed from here: waiting for a reload is the link's time, not the backward's.
        let start = Instant::now();
        let chunk = self.chunk_at(work)?;
        let (model, state) = self.model_and_state(work, chunk.is_some())?;
        let (grad_input, pending) = match (chunk, state) {
            (Some((at, _)), Some(state)) => {
                model.backward_input_chunk(saved, &grad_output, at, state)
            }
            _ => model.backward_input(saved, &grad_output),
        }
        .map_err(kernel_failure(work, "input-gradient backward"))?;
        if matches!(chunk, Some((at, _)) if at.index == 0) {
            self.chunks.finish(work, false)?;
        }
        if let Some((_, grad)) = self.weight_inputs.get_mut(&work) {
            *grad = Some(grad_output);
        }
        let kept = pending.held_bytes();
        self.pending.insert(work, pending);
        self.release(Table::Saved, work);
        self.hold(Table::Pending, work, kept);
        self.record(Task::InputGrad(work), start);
        if self.offload_after_input.contains(&work) {
            self.offload_at_producer(work)?;
        }
        Ok(grad_input)
    }

    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        let pending = self.pending_state(work)?;
        let start = Instant::now();
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
        self.free_offloaded(true)?;
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
        let chunk = self.chunk_at(work)?;
        let (model, state) = self.model_and_state(work, chunk.is_some())?;
        let rebuilt = match (chunk, state) {
            (Some((at, _)), Some(state)) => model.recompute_chunk_state(checkpoint, at, state),
            _ => model.recompute_state(checkpoint),
        }
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
        if self.chunks.split() {
            // Running a chunk's I again would send its keys' gradients back twice.
            return Err(StageError::bad_input(format!(
                "recompute of {}'s weight-gradient state: a sequence chunk's W state is not \
                 recomputed (write recompute(..., weight_grads=keep))",
                display(work)
            )));
        }
        self.free_offloaded(true)?;
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
        // Started at its producer where the program says so; here its device copy is freed
        // (once the copy ends: what allocates next waits for it).
        if !self.issued.remove(&work) {
            self.start_offload(work)?;
        }
        self.placed.insert(work);
        self.free_offloaded(false)
    }

    fn reload(&mut self, work: Work) -> Result<(), StageError> {
        // A reload allocates: the device copies freed before it are free by then.
        self.free_offloaded(true)?;
        self.link.reload(work)?;
        if let Some((table, bytes)) = self.moving.remove(&work) {
            self.hold(table, work, bytes);
        }
        Ok(())
    }

    fn grad_sync(&mut self, stage: StageId) -> Result<(), StageError> {
        self.stage(stage)?;
        self.last_weight.insert(stage);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StageError> {
        self.free_offloaded(false)?;
        for transfer in self.link.finish()? {
            let at = |t: Instant| t.duration_since(self.epoch).as_secs_f64();
            self.measured.push(MeasuredOp {
                task: transfer.task,
                work: transfer.task.work(),
                start: at(transfer.start),
                end: at(transfer.end),
            });
        }
        match self.pending.keys().chain(self.moving.keys()).next() {
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
