//! An overlapped F&B pair (DualPipe's) with expert parallelism: the forward of one microbatch
//! and the whole backward of another run on two threads of the rank, one computing at a time
//! (the rank's [`ComputeSlot`]), each all-to-all of one half waited for while the other half
//! computes, the way DeepSeek-V3 interleaves a pair (report section 3.2.1).
//!
//! The halves touch disjoint state (the forward its input and what it saves, the backward the
//! state its forward saved and its output gradient) and the model's parameters only read, so
//! they compute the same numbers as in turn; the expert exchange matches the two halves' calls
//! by phase (the forward's combine, the backward's dispatch backward), so the group's ranks
//! agree whichever half reaches its exchange first. The stage's bookkeeping (what is kept, the
//! byte ledger, the gradients handed on, the timeline) runs after both halves, as in turn.
//!
//! The forward half runs on the rank's pair worker ([`PairWorker`]: one thread for the step,
//! whose thread-local buffers stay warm from pair to pair), the backward half on the rank's own
//! thread.
//!
//! [`Pairs::InTurn`] runs the halves one after the other (the baseline the overlap is measured
//! against; `--sequential-pairs`); a rank without expert parallelism has nothing to overlap and
//! always does. So do sequence-chunked stages (their chunk state is shared by a group's
//! forwards and backwards) and forward-only runs.

use super::faults::{display, kernel_failure};
use super::ledger::Table;
use super::GptStage;
use crate::experts::slot::ComputeSlot;
use candle_core::Tensor;
use pipeweave_backends::StageError;
use pipeweave_core::{Task, Work};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// How a rank runs the two halves of an overlapped F&B pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pairs {
    /// On two threads, one computing at a time, each all-to-all under the other's compute.
    #[default]
    Overlapped,
    /// The forward, then the backward.
    InTurn,
}

impl GptStage {
    /// Runs this rank's pairs as `pairs` says (with expert parallelism; without it they run in
    /// turn either way).
    pub fn with_pairs(mut self, pairs: Pairs) -> GptStage {
        if pairs == Pairs::InTurn {
            self.slot = None;
        }
        self
    }

    /// The rank's compute slot where the pair of `forward` and `backward` runs overlapped.
    pub(super) fn overlap_slot(
        &self,
        forward: Work,
        backward: Work,
    ) -> Result<Option<Arc<ComputeSlot>>, StageError> {
        let chunked =
            self.feed.chunk_at(forward)?.is_some() || self.feed.chunk_at(backward)?.is_some();
        Ok(self
            .slot
            .as_ref()
            .filter(|_| !chunked && !self.forward_only)
            .cloned())
    }

    /// The pair of `forward` (on `input`) and `backward` (from `grad_output`), its halves on
    /// two threads sharing `slot`: the forward's output and the backward's input gradient.
    pub(super) fn overlapped(
        &mut self,
        slot: Arc<ComputeSlot>,
        forward: Work,
        input: Option<Tensor>,
        backward: Work,
        grad_output: Tensor,
    ) -> Result<(Tensor, Option<Tensor>), StageError> {
        let input = self.forward_input(forward, input)?.input;
        let saved = self.saved_state(backward)?;
        let forward_model = self.stages.get(forward.stage)?.model.clone();
        let (forward_slot, forward_input) = (Arc::clone(&slot), input.clone());
        let worker = self.pair_worker.get_or_insert_with(PairWorker::start);
        let ahead = worker.run(move || {
            let _held = forward_slot.hold();
            let start = Instant::now();
            let ran = forward_model.forward(&forward_input);
            (ran, start, Instant::now())
        })?;
        let backward_model = &self.stages.get(backward.stage)?.model;
        let behind = {
            let _held = slot.hold();
            let start = Instant::now();
            let ran = backward_model
                .backward_input(saved, &grad_output)
                .map_err(kernel_failure(backward, "input-gradient backward"))
                .and_then(|(grad_input, pending)| {
                    let between = Instant::now();
                    let bytes = pending.held_bytes();
                    let grads = backward_model
                        .backward_weight(pending)
                        .map_err(kernel_failure(backward, "weight-gradient backward"))?;
                    Ok(Backward {
                        grad_input,
                        pending_bytes: bytes,
                        grads,
                        between,
                    })
                });
            (ran, start, Instant::now())
        };
        let ahead = ahead.recv();
        let (ran, start, end) = ahead.map_err(|_| {
            StageError::bug(format!(
                "the forward half of the pair of {} and {} panicked",
                display(forward),
                display(backward)
            ))
        })?;
        let (output, saved) = ran.map_err(kernel_failure(forward, "forward"))?;
        self.forward_ran(forward, input, &output, saved);
        self.recorder
            .record_between(Task::Forward(forward), start, end);
        self.offload_after_forward(forward)?;

        let (ran, start, end) = behind;
        let ran = ran?;
        // What the I kept for the W was live between them, as in turn.
        self.ledger.release(Table::Saved, backward);
        self.ledger
            .hold(Table::Pending, backward, ran.pending_bytes);
        self.recomputes.keep_grad(backward, grad_output);
        let (input_grad, weight_grad) = (Task::InputGrad(backward), Task::WeightGrad(backward));
        self.recorder.record_between(input_grad, start, ran.between);
        self.weight_grad_ran(backward, ran.grads)?;
        self.recorder.record_between(weight_grad, ran.between, end);
        Ok((output, ran.grad_input))
    }
}

/// The thread of a rank that runs the forward halves of its overlapped pairs, for one step (one
/// thread rather than one per pair: its thread-local buffers and allocator arena stay warm).
pub(super) struct PairWorker {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

/// A forward half, as the worker runs it.
type Job = Box<dyn FnOnce() + Send>;

impl PairWorker {
    /// A worker thread waiting for forward halves.
    fn start() -> PairWorker {
        let (jobs, queue) = channel::<Job>();
        let thread = std::thread::spawn(move || {
            for job in queue {
                job();
            }
        });
        PairWorker {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    /// Hands `job` to the worker; its result arrives on the receiver (which fails if the job
    /// panicked).
    fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<Receiver<T>, StageError> {
        let (result, answer) = channel();
        let job: Job = Box::new(move || {
            let _ = result.send(job());
        });
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(job));
        match sent {
            Some(Ok(())) => Ok(answer),
            _ => Err(StageError::bug(
                "the rank's pair worker is gone (an earlier forward half panicked)",
            )),
        }
    }
}

impl Drop for PairWorker {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What the backward half of a pair hands back: its input gradient, the bytes its I kept for
/// its W, the weight gradients, and when its I ended.
struct Backward {
    grad_input: Option<Tensor>,
    pending_bytes: usize,
    grads: Vec<Tensor>,
    between: Instant,
}
