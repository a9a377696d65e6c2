//! Where a step's ranks run and how their results meet: [`Cluster`], with [`ThreadsCluster`]
//! (every rank of every data-parallel replica a thread of this process) here and
//! `mpi::MpiCluster` (one process per rank, cargo feature `mpi`) beside it.
//!
//! The training loop ([`crate::Trainer`]) is the same on both: it asks the cluster for a step's
//! loss and the summed gradients of the positions this process updates, for every parameter's
//! squared gradient norm (in the model's parameter order, so that the clipping factor does not
//! depend on where the parameters live), and for held-out losses.

use crate::batch::StepBatch;
use crate::error::TrainError;
use crate::optim::squared_norms;
use crate::stage::{Injection, MeasuredOp};
use crate::step::{GptModel, StepRunner, TRAINER_RECEIVES};
use candle_core::Tensor;
use pipeweave_core::{Plan, RankId};

/// What one step gave this process.
#[derive(Debug)]
pub struct ClusterStep {
    /// Summed token losses over the global batch, divided by its normaliser (the same on every
    /// process).
    pub loss: f64,
    /// Per position, its summed weight gradients when this process updates it.
    pub gradients: Vec<Option<Vec<Tensor>>>,
    /// Per rank of this process, every op as it ran.
    pub measured: Vec<Vec<MeasuredOp>>,
    /// Per world rank, the most activation bytes it held at once.
    pub peak_activation_bytes: Vec<usize>,
    /// Per world rank, the most bytes of offloaded activations in its host store at once.
    pub peak_host_bytes: Vec<usize>,
}

/// Runs steps of a [`GptModel`] on some set of ranks.
pub trait Cluster {
    /// One step on `batch` (all replicas' microbatches); `injection` names a world rank.
    fn step(
        &mut self,
        model: &GptModel,
        batch: &StepBatch,
        injection: Option<(RankId, Injection)>,
    ) -> Result<ClusterStep, TrainError>;

    /// The summed token loss and the token count of `batch` through the forward-only programs
    /// (one replica's microbatches).
    fn evaluate(&mut self, model: &GptModel, batch: &StepBatch)
        -> Result<(f64, usize), TrainError>;

    /// Every parameter's squared norm, position by position in parameter order, from the
    /// gradients this process holds (`gradients[k]` is `None` where another process holds
    /// position `k`; `parameters[k]` is position `k`'s parameter count).
    fn squared_norms(
        &mut self,
        gradients: &[Option<Vec<Tensor>>],
        parameters: &[usize],
    ) -> Result<Vec<f64>, TrainError>;

    /// `tensors` (this process's values of a position's parameters or moments) as the first
    /// process that holds `position` has them (collective on a cluster of processes: every
    /// process calls it in the same order); in one process, `tensors` themselves.
    fn share(&mut self, _position: usize, tensors: Vec<Tensor>) -> Result<Vec<Tensor>, TrainError> {
        Ok(tensors)
    }

    /// Runs later steps through `plan`'s programs (checked here, once): a plan of the same
    /// problem whose orders differ, as variable-length microbatches ask for (their costs
    /// change every step). A cluster that cannot switch plans says so
    /// ([`TrainError::InvalidArgument`]).
    fn set_plan(&mut self, _plan: &Plan) -> Result<(), TrainError> {
        Err(TrainError::invalid(
            "plan",
            "a new plan",
            "this cluster runs the plan it was made with",
        ))
    }

    /// Whether this process writes files for the run (checkpoints, logs): one process of the
    /// world does.
    fn is_writer(&self) -> bool {
        true
    }

    /// Ends every process of the run after this one failed, so that none waits for it; a
    /// cluster in one process has nothing to end.
    fn abandon(&mut self) {}
}

/// Every rank a thread of this process; data-parallel replicas run side by side.
#[derive(Clone, Debug)]
pub struct ThreadsCluster {
    runner: StepRunner,
    eval_runner: StepRunner,
    replicas: u32,
}

impl ThreadsCluster {
    /// `replicas` copies of `runner`'s pipeline; evaluation through `eval_runner`.
    pub fn new(runner: StepRunner, eval_runner: StepRunner, replicas: u32) -> ThreadsCluster {
        ThreadsCluster {
            runner,
            eval_runner,
            replicas,
        }
    }
}

impl Cluster for ThreadsCluster {
    fn step(
        &mut self,
        model: &GptModel,
        batch: &StepBatch,
        injection: Option<(RankId, Injection)>,
    ) -> Result<ClusterStep, TrainError> {
        let outcome = model.step_replicas(&self.runner, batch, self.replicas, injection)?;
        Ok(ClusterStep {
            loss: outcome.loss,
            gradients: outcome.gradients.into_iter().map(Some).collect(),
            measured: outcome.measured,
            peak_activation_bytes: outcome.peak_activation_bytes,
            peak_host_bytes: outcome.peak_host_bytes,
        })
    }

    fn evaluate(
        &mut self,
        model: &GptModel,
        batch: &StepBatch,
    ) -> Result<(f64, usize), TrainError> {
        model.evaluate(&self.eval_runner, batch)
    }

    fn set_plan(&mut self, plan: &Plan) -> Result<(), TrainError> {
        if plan.problem() != self.runner.problem() {
            return Err(TrainError::invalid(
                "plan",
                "a new plan",
                "a step's plan must keep the run's problem (ranks, stages, microbatches, routes)",
            ));
        }
        let options = self.runner.options();
        self.runner = StepRunner::new(plan, TRAINER_RECEIVES, false)?.with_options(options);
        Ok(())
    }

    fn squared_norms(
        &mut self,
        gradients: &[Option<Vec<Tensor>>],
        _parameters: &[usize],
    ) -> Result<Vec<f64>, TrainError> {
        let mut norms = Vec::new();
        for (k, grads) in gradients.iter().enumerate() {
            let grads = grads
                .as_ref()
                .ok_or_else(|| TrainError::invariant(format!("position {k} has no gradient")))?;
            norms.extend(squared_norms(grads)?);
        }
        Ok(norms)
    }
}
