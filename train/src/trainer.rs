//! The training loop: steps of a [`GptModel`] through a plan's programs, with AdamW, global-norm
//! clipping, a warm-up + cosine learning rate, a seeded byte loader, held-out evaluation through
//! the plan's forward-only programs, and checkpoints that resume bit for bit.
//!
//! One step: the loader's global batch for the step ([`crate::data::Loader`]) runs through the
//! programs ([`GptModel::step`]); the gradients' global norm (one squared norm per parameter, in
//! the model's parameter order, so it does not depend on the cut) scales them to at most
//! `max_grad_norm`; every position's AdamW updates its parameters. Everything random follows from
//! the seed: weights (by parameter name), data order (by epoch). A checkpoint holds the weights,
//! the optimizer's moments, the step and the loader's position, so a run resumed at step k and run
//! to N logs the same losses for steps k+1..N as an uninterrupted run.

use crate::batch::StepBatch;
use crate::checkpoint::{self, CheckpointMeta};
use crate::cluster::{Cluster, ThreadsCluster};
use crate::cut::ModelCut;
use crate::data::{eval_microbatches, BatchShape, Corpus, DataPosition, GlobalBatch, Loader};
use crate::error::TrainError;
use crate::experts::per_microbatch_aux;
use crate::optim::{clip_scale, global_norm, step_positions, AdamW, AdamWConfig, OptimizerState};
use crate::profile::{calibrate, measure_profile, ProfileRequest};
use crate::schedule::LrSchedule;
use crate::stage::{Injection, MeasuredOp, Pairs};
use crate::step::{GptModel, StepRunner, TRAINER_RECEIVES};
use candle_core::{DType, Tensor};
use pipeweave_backends::ThreadOptions;
use pipeweave_core::{Plan, Profile, RankId};
use pipeweave_kernels::GptConfig;
use std::path::Path;
use std::time::{Duration, Instant};

/// Everything that fixes a run besides the plan and the data.
#[derive(Clone, Debug)]
pub struct TrainSettings {
    /// The model.
    pub config: GptConfig,
    /// Sequence length, sequences per microbatch, microbatches per step.
    pub shape: BatchShape,
    /// The learning rate per step.
    pub lr: LrSchedule,
    /// Gradients are scaled down to this global norm.
    pub max_grad_norm: f64,
    /// Seeds weights and data order.
    pub seed: u64,
    /// Weight gradients summed in microbatch order (bit-identical across schedules).
    pub deterministic: bool,
    /// Keep only each stage's input after the forward.
    pub recompute: bool,
    /// Element type of weights and activations.
    pub dtype: DType,
    /// At most this many held-out sequences per evaluation.
    pub eval_sequences: usize,
    /// What a checkpoint must share with a run that resumes it (the schedule and sizes).
    pub fingerprint: String,
    /// How long a rank may wait for a message before the run stops (reporting who waits on whom).
    pub receive_timeout: Duration,
    /// Data-parallel replicas (the plan's microbatches are one replica's, the shape's all theirs).
    pub replicas: u32,
    /// Faults to inject, for tests of failure handling: (world rank, step, what).
    pub injections: Vec<(u32, u64, Injection)>,
    /// Blocks per model stage (`--layers-per-stage`; see [`ModelCut::with_layers`]); `None`
    /// cuts as evenly as the block count allows.
    pub layers_per_stage: Option<Vec<usize>>,
    /// Variable-length microbatches cut at document boundaries ([`Loader::variable`]).
    pub variable_length: bool,
    /// Expert ranks per pipeline rank (`--expert-parallel`; 1: every expert on its pipeline
    /// rank): each holds and runs its share of every mixture's experts ([`crate::experts`]).
    pub expert_ranks: u32,
    /// How their overlapped pairs run (`--sequential-pairs`: in turn; [`Pairs`]).
    pub pairs: Pairs,
    /// Each expert exchange's least duration (`--exchange-latency`; zero on a real run).
    pub exchange_latency: Duration,
}

impl TrainSettings {
    /// Settings for `config` trained in batches of `shape`, with the defaults of a short run
    /// (override fields with struct update syntax): a constant learning rate of 1e-3, clipping at
    /// global norm 1, seed 1, gradients summed as they arrive, no recompute, f32, 64 held-out
    /// sequences, one replica, a 60 s receive timeout, the even cut, fixed-length microbatches,
    /// every expert on its pipeline rank, pairs overlapped.
    pub fn new(config: GptConfig, shape: BatchShape) -> TrainSettings {
        TrainSettings {
            config,
            shape,
            lr: LrSchedule::constant(1e-3).expect("a constant 1e-3 is a valid learning rate"),
            max_grad_norm: 1.0,
            seed: 1,
            deterministic: false,
            recompute: false,
            dtype: DType::F32,
            eval_sequences: 64,
            fingerprint: String::new(),
            receive_timeout: Duration::from_secs(60),
            replicas: 1,
            injections: Vec::new(),
            layers_per_stage: None,
            variable_length: false,
            expert_ranks: 1,
            pairs: Pairs::Overlapped,
            exchange_latency: Duration::ZERO,
        }
    }
}

/// What one step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepLog {
    /// The step (1 first).
    pub step: u64,
    /// Mean token loss over the global batch.
    pub loss: f64,
    /// Non-padding tokens of the global batch.
    pub tokens: usize,
    /// Wall time of the step (forward, backward and update).
    pub seconds: f64,
    /// The learning rate used.
    pub lr: f64,
    /// The gradients' global norm before clipping.
    pub grad_norm: f64,
}

/// How many of the last steps a profile's calibration takes its op times from.
pub const CALIBRATION_STEPS: usize = 5;

/// A training run in progress.
pub struct Trainer {
    settings: TrainSettings,
    cluster: Box<dyn Cluster>,
    model: GptModel,
    optimizers: Vec<AdamW>,
    loader: Loader,
    held_out: Vec<u8>,
    corpus_origin: std::path::PathBuf,
    position: DataPosition,
    step: u64,
    measured: Vec<Vec<MeasuredOp>>,
    /// Per rank, the ops of the last [`CALIBRATION_STEPS`] steps (a profile's calibration takes
    /// their medians, so one slow step does not scale it).
    recent_measured: std::collections::VecDeque<Vec<Vec<MeasuredOp>>>,
    /// Slot `s` of every replica takes the replica's data microbatch `order[s]` (None: in data
    /// order).
    microbatch_order: Option<Vec<usize>>,
    peak_activation_bytes: Vec<usize>,
    peak_host_bytes: Vec<usize>,
}

impl Trainer {
    /// A fresh run of `settings` through `plan` on `corpus` (its last tenth held out), every
    /// rank of every replica a thread of this process.
    pub fn new(
        plan: &Plan,
        corpus: &Corpus,
        settings: TrainSettings,
    ) -> Result<Trainer, TrainError> {
        let options = ThreadOptions {
            receive_timeout: settings.receive_timeout,
        };
        let runner = StepRunner::new(plan, TRAINER_RECEIVES, false)?.with_options(options);
        let eval_runner = StepRunner::new(plan, TRAINER_RECEIVES, true)?;
        let cluster = ThreadsCluster::new(runner, eval_runner, settings.replicas);
        Trainer::on_cluster(plan, corpus, settings, Box::new(cluster))
    }

    /// A fresh run as [`Trainer::new`], its steps run by `cluster` (e.g. one MPI process per
    /// rank); every process of the cluster makes its own trainer with the same arguments.
    pub fn on_cluster(
        plan: &Plan,
        corpus: &Corpus,
        settings: TrainSettings,
        cluster: Box<dyn Cluster>,
    ) -> Result<Trainer, TrainError> {
        let split = corpus.split(settings.shape.seq_len)?;
        let per_replica = plan.problem().sample_groups() as usize;
        crate::chunks::check_plan(plan.problem(), settings.shape.seq_len)?;
        if settings.replicas == 0
            || settings.shape.global_microbatches != per_replica * settings.replicas as usize
        {
            return Err(TrainError::invalid(
                "microbatches",
                settings.shape.global_microbatches,
                format!(
                    "the plan has {per_replica} per replica and there are {} replica(s)",
                    settings.replicas
                ),
            ));
        }
        let cut = ModelCut::with_layers(
            &settings.config,
            plan.problem(),
            settings.layers_per_stage.as_deref(),
        )?;
        // Each microbatch's (each sequence chunk's) backward adds its load-balancing loss.
        let chunks = plan.problem().seq_chunks() as usize;
        let config = per_microbatch_aux(
            &settings.config,
            settings.shape.global_microbatches * chunks,
        )?;
        let model = GptModel::on_cut(
            &config,
            cut,
            settings.seed,
            settings.dtype,
            settings.recompute,
            settings.deterministic,
        )?
        .with_expert_parallel(settings.expert_ranks)?
        .with_pairs(settings.pairs)
        .with_exchange_latency(settings.exchange_latency);
        let optimizers = model
            .models()
            .iter()
            .map(|m| AdamW::new(AdamWConfig::default(), &m.parameters()))
            .collect::<Result<Vec<_>, _>>()?;
        let loader = if settings.variable_length {
            Loader::variable(
                split.train.to_vec(),
                corpus.documents(),
                settings.shape,
                settings.seed,
            )?
        } else {
            Loader::new(split.train.to_vec(), settings.shape, settings.seed)?
        };
        Ok(Trainer {
            held_out: split.held_out.to_vec(),
            corpus_origin: corpus.origin().to_path_buf(),
            settings,
            cluster,
            model,
            optimizers,
            loader,
            position: DataPosition::default(),
            step: 0,
            measured: Vec::new(),
            recent_measured: std::collections::VecDeque::new(),
            microbatch_order: None,
            peak_activation_bytes: Vec::new(),
            peak_host_bytes: Vec::new(),
        })
    }

    /// Optimizer steps completed.
    pub fn steps_done(&self) -> u64 {
        self.step
    }

    /// The model.
    pub fn model(&self) -> &GptModel {
        &self.model
    }

    /// The run's profile (what `train_gpt --profile` writes): every layer of the model measured
    /// alone with this run's microbatch shape and compute threads, `repeats` times each, then
    /// scaled to the median op times the last [`CALIBRATION_STEPS`] steps measured at each
    /// stage ([`calibrate`]; under MPI, this process's stages).
    pub fn profile(&self, repeats: usize) -> Result<Profile, TrainError> {
        let shape = self.settings.shape;
        let mut profile = measure_profile(&ProfileRequest {
            config: self.settings.config,
            microbatch_size: shape.microbatch_size,
            seq_len: shape.seq_len,
            dtype: self.settings.dtype,
            threads_per_rank: candle_core::utils::get_num_threads(),
            repeats,
            seed: self.settings.seed,
        })?;
        // Per rank, the ops of the recent steps together.
        let ranks = self.recent_measured.iter().map(Vec::len).max().unwrap_or(0);
        let recent: Vec<Vec<MeasuredOp>> = (0..ranks)
            .map(|r| {
                self.recent_measured
                    .iter()
                    .filter_map(|step| step.get(r))
                    .flatten()
                    .cloned()
                    .collect()
            })
            .collect();
        calibrate(&mut profile, self.model.cut(), &recent)?;
        Ok(profile)
    }

    /// Per rank, every op of the last step as it ran.
    pub fn last_measured(&self) -> &[Vec<MeasuredOp>] {
        &self.measured
    }

    /// Keeps `step`'s ops among the last [`CALIBRATION_STEPS`] steps'.
    fn remember_measured(&mut self, step: &[Vec<MeasuredOp>]) {
        if self.recent_measured.len() == CALIBRATION_STEPS {
            self.recent_measured.pop_front();
        }
        self.recent_measured.push_back(step.to_vec());
    }

    /// Per rank, the most activation bytes held at once in the last step.
    pub fn peak_activation_bytes(&self) -> &[usize] {
        &self.peak_activation_bytes
    }

    /// Per rank, the most bytes of offloaded activations in its host store at once in the last
    /// step (zeros without offload).
    pub fn peak_host_bytes(&self) -> &[usize] {
        &self.peak_host_bytes
    }

    /// Tokens per sequence of each microbatch of the next step's global batch (all `seq_len`
    /// without variable lengths): what a per-step plan's costs follow.
    pub fn next_microbatch_lengths(&mut self) -> Result<Vec<usize>, TrainError> {
        Ok(self.loader.batch_at(self.position)?.0.microbatch_lengths())
    }

    /// Runs the next steps through `plan` (the same problem; its programs are checked once
    /// here). See [`Cluster::set_plan`].
    pub fn set_plan(&mut self, plan: &Plan) -> Result<(), TrainError> {
        self.cluster.set_plan(plan)
    }

    /// From the next step on, slot `s` of every replica takes that replica's data microbatch
    /// `order[s]` (a permutation of the plan's microbatches;
    /// `pipeweave_transforms::schedules::microbatch_order` chooses one from their costs). The loss and the gradients'
    /// sum do not depend on it beyond the order of the deterministic sum, which is the slots'
    /// on every schedule and rank count.
    pub fn set_microbatch_order(&mut self, order: Vec<usize>) -> Result<(), TrainError> {
        let per_replica =
            self.settings.shape.global_microbatches / self.settings.replicas.max(1) as usize;
        let mut seen = vec![false; per_replica];
        for &m in &order {
            match seen.get_mut(m) {
                Some(slot) if !*slot => *slot = true,
                _ => {
                    return Err(TrainError::invalid(
                        "microbatch order",
                        format!("{order:?}"),
                        format!("must be a permutation of 0..{per_replica}"),
                    ))
                }
            }
        }
        if order.len() != per_replica {
            return Err(TrainError::invalid(
                "microbatch order",
                format!("{order:?}"),
                format!("must be a permutation of 0..{per_replica}"),
            ));
        }
        self.microbatch_order = Some(order);
        Ok(())
    }

    /// `batch` with every replica's microbatches in slot order, and each slot's data id (None
    /// in data order).
    fn in_slots(&self, batch: GlobalBatch) -> (GlobalBatch, Option<Vec<u32>>) {
        let Some(order) = &self.microbatch_order else {
            return (batch, None);
        };
        let per_replica = order.len();
        let pick = |ids: &[Vec<u32>]| -> Vec<Vec<u32>> {
            ids.chunks(per_replica)
                .flat_map(|replica| order.iter().map(|&m| replica[m].clone()))
                .collect()
        };
        let replicas = batch.inputs.len() / per_replica.max(1);
        let data_ids = (0..replicas)
            .flat_map(|d| order.iter().map(move |&m| (d * per_replica + m) as u32))
            .collect();
        let slotted = GlobalBatch {
            inputs: pick(&batch.inputs),
            targets: pick(&batch.targets),
            ..batch
        };
        (slotted, Some(data_ids))
    }

    fn step_batch(&self, batch: &GlobalBatch) -> Result<StepBatch, TrainError> {
        StepBatch::new(
            &batch.inputs,
            &batch.targets,
            batch.microbatch_size,
            batch.seq_len,
            Some(crate::batch::PAD_ID),
        )
    }

    /// One optimizer step; an error names the step.
    pub fn step(&mut self) -> Result<StepLog, TrainError> {
        let step = self.step + 1;
        self.try_step().map_err(|source| TrainError::Step {
            step,
            source: Box::new(source),
        })
    }

    fn try_step(&mut self) -> Result<StepLog, TrainError> {
        let start = Instant::now();
        let (global, next) = self.loader.batch_at(self.position)?;
        let (slotted, data_ids) = self.in_slots(global);
        let mut batch = self.step_batch(&slotted)?;
        if let Some(ids) = data_ids {
            batch = batch.with_data_ids(ids)?;
        }
        let step = self.step + 1;
        let injection = self
            .settings
            .injections
            .iter()
            .find(|(_, at, _)| *at == step)
            .map(|&(rank, _, what)| (RankId::new(rank), what));
        let outcome = self.cluster.step(&self.model, &batch, injection)?;
        let counts: Vec<usize> = self
            .model
            .models()
            .iter()
            .map(|m| m.parameters().len())
            .collect();
        let norms = self.cluster.squared_norms(&outcome.gradients, &counts)?;
        let norm = global_norm(&norms);
        let scale = clip_scale(norm, self.settings.max_grad_norm)?;
        let lr = self.settings.lr.lr(step);
        let params: Vec<Vec<Tensor>> = self
            .model
            .models()
            .iter()
            .map(|m| m.parameters().into_iter().map(|(_, t)| t).collect())
            .collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let updated = step_positions(
            &mut self.optimizers,
            &params,
            &outcome.gradients,
            lr,
            scale,
            threads,
        )?;
        drop(params);
        for (k, values) in updated.into_iter().enumerate() {
            // `None`: another process updates this position.
            if let Some(values) = values {
                self.model.set_parameters(k, values)?;
            }
        }
        self.step = step;
        self.position = next;
        self.remember_measured(&outcome.measured);
        self.measured = outcome.measured;
        self.peak_activation_bytes = outcome.peak_activation_bytes;
        self.peak_host_bytes = outcome.peak_host_bytes;
        Ok(StepLog {
            step,
            loss: outcome.loss,
            tokens: batch.tokens(),
            seconds: start.elapsed().as_secs_f64(),
            lr,
            grad_norm: norm,
        })
    }

    /// The mean token loss of the held-out text (at most `eval_sequences` sequences) through the
    /// plan's forward-only programs.
    pub fn evaluate(&mut self) -> Result<f64, TrainError> {
        let shape = self.settings.shape;
        let limit =
            (self.settings.eval_sequences.max(1) * shape.seq_len).min(self.held_out.len() - 1);
        let text = self.held_out[..=limit].to_vec();
        self.loss_and_tokens_on(&text).map(|(loss, _)| loss)
    }

    /// The mean next-byte loss of `text` cut into windows of `seq_len + 1` bytes overlapping by
    /// one (the last incomplete window dropped), through the forward-only programs, and the
    /// number of bytes predicted.
    pub fn loss_and_tokens_on(&mut self, text: &[u8]) -> Result<(f64, usize), TrainError> {
        let shape = self.settings.shape;
        let windows = eval_microbatches(
            &self.corpus_origin,
            text,
            shape.seq_len,
            shape.microbatch_size,
        )?;
        let m = shape.global_microbatches / self.settings.replicas.max(1) as usize;
        let (mut sum, mut tokens) = (0.0, 0usize);
        for first in (0..windows.inputs.len()).step_by(m) {
            let pad = |ids: &[Vec<u32>], id: u32| -> Vec<Vec<u32>> {
                let mut out: Vec<Vec<u32>> = ids[first..(first + m).min(ids.len())].to_vec();
                while out.len() < m {
                    out.push(vec![id; shape.microbatch_tokens()]);
                }
                out
            };
            let inputs = pad(&windows.inputs, crate::data::PAD_INPUT);
            let targets = pad(&windows.targets, crate::batch::PAD_ID);
            let batch = StepBatch::new(
                &inputs,
                &targets,
                shape.microbatch_size,
                shape.seq_len,
                Some(crate::batch::PAD_ID),
            )?;
            let (loss, counted) = self.cluster.evaluate(&self.model, &batch)?;
            sum += loss;
            tokens += counted;
        }
        Ok((sum / tokens as f64, tokens))
    }

    /// Whether this process writes the run's files (one process of a cluster does).
    pub fn is_writer(&self) -> bool {
        self.cluster.is_writer()
    }

    /// Ends every process of the run after this one failed (MPI); nothing to do on threads.
    pub fn abandon(&mut self) {
        self.cluster.abandon();
    }

    /// Gives every process the weights and optimizer moments of every position as the process
    /// that updates it has them (a cluster of processes updates each position on its holders
    /// only).
    fn share_positions(&mut self) -> Result<(), TrainError> {
        for k in 0..self.model.models().len() {
            let params: Vec<Tensor> = self.model.models()[k]
                .parameters()
                .into_iter()
                .map(|(_, t)| t)
                .collect();
            let params = self.cluster.share(k, params)?;
            self.model.set_parameters(k, params)?;
            let state = self.optimizers[k].state();
            let names: Vec<String> = state.m.keys().cloned().collect();
            let m = self.cluster.share(k, state.m.into_values().collect())?;
            let v = self.cluster.share(k, state.v.into_values().collect())?;
            let shared = OptimizerState {
                step: self.step,
                m: names.iter().cloned().zip(m).collect(),
                v: names.into_iter().zip(v).collect(),
            };
            self.optimizers[k].load_state(&shared)?;
        }
        Ok(())
    }

    /// Writes a checkpoint of the run as it stands (collective on a cluster of processes: every
    /// process calls it, one writes).
    pub fn save(&mut self, path: &Path) -> Result<(), TrainError> {
        self.share_positions()?;
        if !self.cluster.is_writer() {
            return Ok(());
        }
        let mut state = self.optimizers[0].state();
        for optimizer in &self.optimizers[1..] {
            state.merge(optimizer.state())?;
        }
        let meta = CheckpointMeta {
            step: self.step,
            data: self.position,
            rng: vec![self.settings.seed],
            schedule: self.settings.fingerprint.clone(),
            config: self.settings.config,
        };
        checkpoint::save(path, &self.model.parameters(), &state, &meta)
    }

    /// Continues from the checkpoint `path`: weights, optimizer moments, step and data position.
    /// It must have been made for this model and schedule.
    pub fn resume(&mut self, path: &Path) -> Result<(), TrainError> {
        let saved = checkpoint::load(path)?;
        saved.meta.check_model(path, &self.settings.config)?;
        saved
            .meta
            .check_schedule(path, &self.settings.fingerprint)?;
        for k in 0..self.model.models().len() {
            let names = self.model.models()[k].parameter_names();
            let weights = saved.weights_for(path, &names)?;
            self.model.set_parameters(k, weights)?;
            self.optimizers[k].load_state(&saved.optimizer)?;
        }
        self.step = saved.meta.step;
        self.position = saved.meta.data;
        Ok(())
    }

    /// Loads only the weights of the checkpoint `path` (for evaluation), checking the model.
    pub fn load_weights(&mut self, path: &Path) -> Result<(), TrainError> {
        let (weights, meta) = checkpoint::load_weights(path)?;
        meta.check_model(path, &self.settings.config)?;
        for k in 0..self.model.models().len() {
            let names = self.model.models()[k].parameter_names();
            let mut values = Vec::with_capacity(names.len());
            for name in &names {
                values.push(weights.get(name).cloned().ok_or_else(|| {
                    TrainError::MissingTensor {
                        path: path.to_path_buf(),
                        name: name.clone(),
                    }
                })?);
            }
            self.model.set_parameters(k, values)?;
        }
        Ok(())
    }
}
