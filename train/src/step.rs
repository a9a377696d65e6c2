//! One training step through a plan's programs, for any model.
//!
//! [`StepRunner`] projects a verified plan once, checks its programs, and runs them on the threaded
//! backend with whatever [`StageCompute`] a model makes for each rank: the generic half of the
//! training loop. [`GptModel`] is the model half for a GPT on the kernels: it holds one
//! [`StageModel`] per position of its [`ModelCut`], makes a [`GptStage`] per rank, and folds the
//! step's losses and gradients (the losses in microbatch order, the gradients through
//! [`LocalGradients`]). With expert parallelism ([`GptModel::with_expert_parallel`]) every rank
//! of every replica is `X` expert ranks, each a thread running the same program on its own
//! pipeline's channels, their mixtures' rows exchanged within each rank's group
//! ([`crate::experts`]).

use crate::batch::StepBatch;
use crate::cut::ModelCut;
use crate::error::TrainError;
use crate::experts::{ExpertGroups, ExpertParallel, ExpertRank, Watched};
use crate::gradients::{GradSync, LocalGradients};
use crate::stage::{GptStage, Injection, MeasuredOp, Pairs};
use candle_core::{DType, Tensor};
use pipeweave_backends::{run_threads, StageCompute, ThreadOptions};
use pipeweave_core::{CheckedPrograms, Plan, Problem, ProjectionOptions, RankId, RecvPolicy};
use pipeweave_kernels::{ExpertPlacement, GptConfig, StageModel};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the trainer's programs receive: just before the task that needs the message. A receive
/// completes before the rank goes on, and the projection places early receives by the plan's
/// costs; where the real costs differ (the last stage, with the head and the loss, is dearer), an
/// early receive stops the rank before computes it could run. Measured on `offload(f1b(gpipe),
/// memory=1)` at 2 ranks: a step 1.11-1.30x its replay from the measured op times with early
/// receives, 1.00-1.05x just in time. Sends never wait (buffered channels, MPI's `isend`), so a
/// late receive costs the sender nothing.
pub const TRAINER_RECEIVES: RecvPolicy = RecvPolicy::JustInTime;

/// A plan's checked programs, ready to run a step (checked once, here; every step runs them as
/// they are).
#[derive(Clone, Debug)]
pub struct StepRunner {
    checked: CheckedPrograms,
    options: ThreadOptions,
}

impl StepRunner {
    /// Projects `plan` (forward only for evaluation) and checks its programs.
    pub fn new(
        plan: &Plan,
        recv: RecvPolicy,
        forward_only: bool,
    ) -> Result<StepRunner, TrainError> {
        let checked =
            CheckedPrograms::of_plan(plan, None, ProjectionOptions { recv, forward_only })?;
        Ok(StepRunner {
            checked,
            options: ThreadOptions::default(),
        })
    }

    /// The options the ranks run with.
    pub fn options(&self) -> ThreadOptions {
        self.options
    }

    /// How long a receive may wait.
    pub fn with_options(mut self, options: ThreadOptions) -> StepRunner {
        self.options = options;
        self
    }

    /// The plan's problem.
    pub fn problem(&self) -> &Problem {
        self.checked.problem()
    }

    /// The checked programs.
    pub fn checked(&self) -> &CheckedPrograms {
        &self.checked
    }

    /// Runs one step with the computes `make` gives each rank; returns them in rank order.
    pub fn run<C, F>(&self, make: F) -> Result<Vec<C>, TrainError>
    where
        C: StageCompute + Send,
        F: Fn(RankId) -> C,
    {
        run_threads(&self.checked, make, self.options).map_err(TrainError::from)
    }
}

/// What a step of a [`GptModel`] produced.
#[derive(Debug)]
pub struct StepOutcome {
    /// The loss: summed token losses over the global batch's non-padding targets.
    pub loss: f64,
    /// Every position's summed weight gradients, in its parameter order.
    pub gradients: Vec<Vec<Tensor>>,
    /// Per rank, every op as it ran.
    pub measured: Vec<Vec<MeasuredOp>>,
    /// Per rank, the most activation bytes held at once.
    pub peak_activation_bytes: Vec<usize>,
    /// Per rank, the most bytes of offloaded activations in its host store at once.
    pub peak_host_bytes: Vec<usize>,
}

/// A GPT cut into a plan's positions.
#[derive(Debug, Clone)]
pub struct GptModel {
    cut: ModelCut,
    models: Vec<StageModel>,
    deterministic: bool,
    /// Where each rank's experts run: `None` for one expert rank per pipeline rank.
    experts: Option<ExpertParallel>,
    /// How the ranks run an overlapped pair's halves (with expert parallelism).
    pairs: Pairs,
    /// The emulated all-to-all's least duration (`--exchange-latency`; zero: none).
    exchange_latency: Duration,
}

impl GptModel {
    /// The model `config` initialised from `seed`, cut into `problem`'s stages evenly. The
    /// weights do not depend on the cut (each parameter is drawn from the seed and its name).
    pub fn new(
        config: &GptConfig,
        problem: &Problem,
        seed: u64,
        dtype: DType,
        recompute: bool,
        deterministic: bool,
    ) -> Result<GptModel, TrainError> {
        let cut = ModelCut::new(config, problem)?;
        GptModel::on_cut(config, cut, seed, dtype, recompute, deterministic)
    }

    /// [`GptModel::new`] on a given cut ([`ModelCut::with_layers`]).
    pub fn on_cut(
        config: &GptConfig,
        cut: ModelCut,
        seed: u64,
        dtype: DType,
        recompute: bool,
        deterministic: bool,
    ) -> Result<GptModel, TrainError> {
        let models = (0..cut.positions())
            .map(|k| {
                let layout = cut
                    .layout(k)
                    .cloned()
                    .ok_or_else(|| TrainError::invariant(format!("position {k} has no layout")))?;
                StageModel::new(*config, layout, seed, dtype)
                    .map(|m| m.with_recompute(recompute))
                    .map_err(TrainError::kernel_config(format!(
                        "the model of position {k}"
                    )))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(GptModel {
            cut,
            models,
            deterministic,
            experts: None,
            pairs: Pairs::default(),
            exchange_latency: Duration::ZERO,
        })
    }

    /// The same model with each pipeline rank's experts spread over `ranks` expert ranks
    /// ([`crate::experts`]); `ranks` must divide the experts of the model's mixture. One rank
    /// keeps every expert on its pipeline rank.
    pub fn with_expert_parallel(mut self, ranks: u32) -> Result<GptModel, TrainError> {
        self.experts = match ranks {
            1 => None,
            _ => {
                let config = self.models.first().map(|m| *m.config()).ok_or_else(|| {
                    TrainError::invariant("a model of no positions has no experts")
                })?;
                Some(ExpertParallel::new(&config, &self.models, ranks)?)
            }
        };
        Ok(self)
    }

    /// The same model with its ranks running an overlapped pair's halves as `pairs` says.
    pub fn with_pairs(mut self, pairs: Pairs) -> GptModel {
        self.pairs = pairs;
        self
    }

    /// How the ranks run an overlapped pair's halves.
    pub fn pairs(&self) -> Pairs {
        self.pairs
    }

    /// The same model with every expert exchange ending no sooner than `latency` after it was
    /// issued (an emulated interconnect: see `--exchange-latency`).
    pub fn with_exchange_latency(mut self, latency: Duration) -> GptModel {
        self.exchange_latency = latency;
        self
    }

    /// The emulated all-to-all's least duration.
    pub fn exchange_latency(&self) -> Duration {
        self.exchange_latency
    }

    /// Expert ranks per pipeline rank (1 without expert parallelism).
    pub fn expert_ranks(&self) -> u32 {
        self.expert_parallel().map_or(1, ExpertParallel::ranks)
    }

    /// Where each rank's experts run (`None`: every expert on its pipeline rank).
    pub(crate) fn expert_parallel(&self) -> Option<&ExpertParallel> {
        self.experts.as_ref()
    }

    /// The cut.
    pub fn cut(&self) -> &ModelCut {
        &self.cut
    }

    /// Every position's model.
    pub fn models(&self) -> &[StageModel] {
        &self.models
    }

    /// Every parameter with its GPT-2 name, position by position.
    pub fn parameters(&self) -> Vec<(String, Tensor)> {
        self.models.iter().flat_map(|m| m.parameters()).collect()
    }

    /// Replaces position `k`'s parameters (in its parameter order).
    pub fn set_parameters(
        &mut self,
        position: usize,
        values: Vec<Tensor>,
    ) -> Result<(), TrainError> {
        self.models
            .get_mut(position)
            .ok_or_else(|| {
                TrainError::invalid("position", position, "the model has no such position")
            })?
            .set_parameters(values)
            .map_err(TrainError::kernel_config(format!(
                "the parameters of position {position}"
            )))
    }

    /// Runs forward and backward of one step through `runner`'s programs: the loss and every
    /// position's gradients.
    pub fn step(&self, runner: &StepRunner, batch: &StepBatch) -> Result<StepOutcome, TrainError> {
        self.step_injected(runner, batch, None)
    }

    /// [`GptModel::step`] with a fault injected into one rank (tests of failure handling).
    pub fn step_injected(
        &self,
        runner: &StepRunner,
        batch: &StepBatch,
        injection: Option<(RankId, Injection)>,
    ) -> Result<StepOutcome, TrainError> {
        self.step_replicas(runner, batch, 1, injection)
    }

    /// One step of `replicas` data-parallel copies of the pipeline, each running `runner`'s
    /// programs on its own microbatches (replica `d` on microbatches `d M .. (d + 1) M` of
    /// `batch`), all folding their gradients into one sum (in global microbatch order when
    /// deterministic: `--dp 2 --microbatches 4` gives the bits of `--dp 1 --microbatches 8`).
    /// With `X` expert ranks, each replica is `X` pipelines (`d·X + x`) on the same
    /// microbatches. `injection` names a world rank `(d·X + x)·P + r`.
    pub fn step_replicas(
        &self,
        runner: &StepRunner,
        batch: &StepBatch,
        replicas: u32,
        injection: Option<(RankId, Injection)>,
    ) -> Result<StepOutcome, TrainError> {
        let problem = runner.problem();
        // With sequence chunks, the batch holds the sample groups the plan's units are cut from.
        let (p, m) = (problem.ranks(), problem.sample_groups());
        let chunks = problem.seq_chunks() as usize;
        if replicas == 0 || batch.microbatches() != (replicas * m) as usize {
            return Err(TrainError::Batch {
                reason: format!(
                    "the batch has {} microbatches, {replicas} replica(s) of the plan {}",
                    batch.microbatches(),
                    replicas * m
                ),
            });
        }
        let x_ranks = self.expert_ranks();
        let syncs: Vec<Arc<LocalGradients>> = (0..x_ranks)
            .map(|_| {
                Arc::new(LocalGradients::new(
                    self.cut.positions(),
                    self.deterministic,
                ))
            })
            .collect();
        let waits = (runner.options().receive_timeout, self.exchange_latency);
        let mut groups = ExpertGroups::new(replicas, p, x_ranks, waits);
        let batch = Arc::new(batch.clone());
        let epoch = Instant::now();
        let pipelines = (0..replicas * x_ranks)
            .map(|q| {
                let (d, x) = (q / x_ranks, ExpertRank::new(q % x_ranks));
                let how = StageRun {
                    epoch,
                    forward_only: false,
                    injection: injection
                        .filter(|(w, _)| w.get() / p == q)
                        .map(|(w, what)| (RankId::new(w.get() % p), what)),
                    offset: d * m,
                };
                let sync: Arc<dyn GradSync> = syncs[x.get() as usize].clone();
                Ok((how, sync, self.placements(&mut groups, d, x, p)?))
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        let failed = groups.failure_flag();
        let outcomes: Vec<Result<Vec<GptStage>, TrainError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = pipelines
                .into_iter()
                .map(|(how, sync, placements)| {
                    let (batch, failed) = (Arc::clone(&batch), Arc::clone(&failed));
                    scope.spawn(move || {
                        self.run_stages(runner, &batch, sync, how, placements, failed)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(TrainError::invariant(
                            "a data-parallel replica's thread panicked",
                        ))
                    })
                })
                .collect()
        });
        let pipelines = first_cause(outcomes)?;
        // Every expert rank of a replica computes the same losses: expert rank 0's are read.
        let losses: Vec<&GptStage> = (pipelines.iter().enumerate())
            .filter(|(q, _)| *q as u32 % x_ranks == 0)
            .flat_map(|(_, stages)| stages)
            .collect();
        let loss = fold_losses(losses, batch.microbatches() * chunks)? / batch.normalizer();
        let stages: Vec<GptStage> = pipelines.into_iter().flatten().collect();
        let measured = stages.iter().map(|s| s.measured().to_vec()).collect();
        let peak_activation_bytes = stages.iter().map(GptStage::peak_activation_bytes).collect();
        let peak_host_bytes = stages.iter().map(GptStage::peak_host_bytes).collect();
        drop(stages);
        let per_rank = syncs
            .into_iter()
            .map(position_sums)
            .collect::<Result<Vec<_>, _>>()?;
        let gradients = match &self.experts {
            Some(experts) => experts.merge(&per_rank)?,
            None => per_rank.into_iter().next().unwrap_or_default(),
        };
        Ok(StepOutcome {
            loss,
            gradients,
            measured,
            peak_activation_bytes,
            peak_host_bytes,
        })
    }

    /// The placements of expert rank `x` of every pipeline rank of replica `d` (`None` without
    /// expert parallelism), their exchanges from `groups`.
    fn placements(
        &self,
        groups: &mut ExpertGroups,
        d: u32,
        x: ExpertRank,
        p: u32,
    ) -> Result<Option<Vec<ExpertPlacement>>, TrainError> {
        let Some(experts) = &self.experts else {
            return Ok(None);
        };
        (0..p)
            .map(|r| {
                let exchange = groups.take(d, RankId::new(r), x).ok_or_else(|| {
                    TrainError::invariant(format!("no exchange for expert rank {}", x.get()))
                })?;
                experts.placement(x, Arc::new(exchange))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }
}

/// Every pipeline's stages, or the first error that is not a rank giving up on an exchange
/// because another failed (else the first error).
fn first_cause(
    outcomes: Vec<Result<Vec<GptStage>, TrainError>>,
) -> Result<Vec<Vec<GptStage>>, TrainError> {
    let mut pipelines = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(stages) => pipelines.push(stages),
            Err(e) => errors.push(e),
        }
    }
    let root = errors
        .iter()
        .position(|e| !gave_up_on_exchange(e))
        .unwrap_or(0);
    match errors.into_iter().nth(root) {
        Some(error) => Err(error),
        None => Ok(pipelines),
    }
}

/// Whether `error` is an expert rank's exchange failing (a peer failed, is gone or stalled).
fn gave_up_on_exchange(error: &TrainError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(kernel) = e.downcast_ref::<pipeweave_kernels::KernelError>() {
            return kernel.is_exchange_failure();
        }
        cause = e.source();
    }
    false
}

/// Every position's summed gradients of one fold.
fn position_sums(sync: Arc<LocalGradients>) -> Result<Vec<Vec<Tensor>>, TrainError> {
    let sync = Arc::try_unwrap(sync)
        .map_err(|_| TrainError::invariant("a rank still holds the gradients"))?;
    sync.into_sums()?
        .into_iter()
        .enumerate()
        .map(|(k, (sum, _))| {
            sum.ok_or_else(|| TrainError::invariant(format!("position {k} received no gradient")))
        })
        .collect()
}

impl GptModel {
    /// The summed token loss and the non-padding token count of `batch` through `runner`'s
    /// forward-only programs (no state kept for a backward, no gradient).
    pub fn evaluate(
        &self,
        runner: &StepRunner,
        batch: &StepBatch,
    ) -> Result<(f64, usize), TrainError> {
        let batch = Arc::new(batch.clone());
        let sync: Arc<dyn GradSync> = Arc::new(LocalGradients::new(self.cut.positions(), false));
        let how = StageRun {
            epoch: Instant::now(),
            forward_only: true,
            injection: None,
            offset: 0,
        };
        let failed = Arc::new(AtomicBool::new(false));
        let stages = self.run_stages(runner, &batch, sync, how, None, failed)?;
        let chunks = runner.problem().seq_chunks() as usize;
        let loss = fold_losses(stages.iter().collect(), batch.microbatches() * chunks)?;
        Ok((loss, batch.tokens()))
    }
}

impl GptModel {
    /// Makes every rank's [`GptStage`] (on its expert rank's `placements`, by rank, where the
    /// model has expert parallelism) and runs the step, each rank raising `failed` when it
    /// fails; returns them in rank order.
    fn run_stages(
        &self,
        runner: &StepRunner,
        batch: &Arc<StepBatch>,
        sync: Arc<dyn GradSync>,
        how: StageRun,
        placements: Option<Vec<ExpertPlacement>>,
        failed: Arc<AtomicBool>,
    ) -> Result<Vec<GptStage>, TrainError> {
        let problem = runner.problem();
        let made = (0..problem.ranks())
            .map(|r| {
                let program = &runner.checked.programs().programs[r as usize];
                let placement = placements.as_ref().and_then(|all| all.get(r as usize));
                let stage = self
                    .rank_stage(problem, RankId::new(r), batch, &sync, how)?
                    .with_residency(program)
                    .with_experts(placement)?
                    .with_pairs(self.pairs);
                Ok(Some(Watched::new(stage, Arc::clone(&failed))))
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        drop(sync);
        let made = Mutex::new(made);
        let stages = runner.run(|rank| {
            made.lock()
                .ok()
                .and_then(|mut m| m.get_mut(rank.index()).and_then(Option::take))
                .expect("run_threads makes each rank's compute exactly once")
        })?;
        Ok(stages.into_iter().map(Watched::into_inner).collect())
    }
}

/// How one replica's stages run: the step's clock, forward only or not, a fault to inject (at a
/// rank of the replica), and the global index of the replica's microbatch 0.
#[derive(Clone, Copy)]
pub(crate) struct StageRun {
    pub(crate) epoch: Instant,
    pub(crate) forward_only: bool,
    pub(crate) injection: Option<(RankId, Injection)>,
    pub(crate) offset: u32,
}

impl GptModel {
    /// The [`GptStage`] of `rank` of `problem` for one step run as `how` says.
    pub(crate) fn rank_stage(
        &self,
        problem: &Problem,
        rank: RankId,
        batch: &Arc<StepBatch>,
        sync: &Arc<dyn GradSync>,
        how: StageRun,
    ) -> Result<GptStage, TrainError> {
        let stage = GptStage::new(
            rank,
            problem,
            &self.cut,
            &self.models,
            Arc::clone(batch),
            Arc::clone(sync),
            how.epoch,
        )?
        .with_injection(how.injection.filter(|(at, _)| *at == rank).map(|(_, i)| i))
        .with_offset(how.offset);
        Ok(if how.forward_only {
            stage.forward_only()
        } else {
            stage
        })
    }
}

/// The summed loss of every microbatch (of every sequence chunk of each, keyed `m·k + c`),
/// added in that order.
fn fold_losses(stages: Vec<&GptStage>, microbatches: usize) -> Result<f64, TrainError> {
    let mut per_microbatch = vec![None; microbatches];
    for stage in stages {
        for (&m, &loss) in stage.losses() {
            if let Some(slot) = per_microbatch.get_mut(m as usize) {
                *slot = Some(loss);
            }
        }
    }
    per_microbatch
        .iter()
        .enumerate()
        .try_fold(0.0, |sum, (m, loss)| match loss {
            Some(l) => Ok(sum + l),
            None => Err(TrainError::invariant(format!("microbatch {m} has no loss"))),
        })
}
