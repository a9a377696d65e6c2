//! The trainer's command-line front door (contract: ../shared/TRAIN.md): [`TrainOptions`], the
//! options as a clap [`clap::Args`] struct, and [`run`], which trains with them.
//! `pipeweave train` and `examples/train_gpt.rs` are thin callers of the same code.
//!
//! Plans come through a [`Planner`]: schedule expressions, cost profiles and memory limits are
//! the facade's (`pipeweave::cli::train_command` implements it), which sits above this crate.
//!
//! Every rank runs in its own thread over the checked per-rank programs of the plan, or, with
//! `--backend mpi` (cargo feature `mpi`), in its own process under `mpirun -np RANKS·DP·X`; the
//! model is cut into the plan's stages; losses equal a single-rank run (bit for bit with
//! `--deterministic`, on either backend). Without `--data` it trains on the source files of this
//! checkout. Under MPI, world rank 0 prints, logs and writes the files; a failing rank reports
//! and aborts the job.

mod options;
mod session;

pub use options::TrainOptions;

use crate::data::BatchShape;
use crate::{Corpus, LrSchedule, Pairs, TrainError, TrainSettings, Trainer};
use pipeweave_core::{FailureKind, Plan};
use pipeweave_kernels::GptConfig;

/// Where the ranks run (the one `Backend` of every front end, `pipeweave_backends::Backend`).
pub use pipeweave_backends::Backend;

/// A failed run with its exit status: 2 for bad input, 1 for a bug or a failed run (the kind the
/// error carries, as `pipeweave` decides its own).
#[derive(Clone, Debug)]
pub struct Failure {
    status: u8,
    message: String,
}

impl Failure {
    /// A failure of `kind` (its exit status) saying `message`.
    pub fn of(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            status: kind.exit_status(),
            message: message.into(),
        }
    }

    /// Bad input (exit status 2).
    pub fn bad(message: impl Into<String>) -> Failure {
        Failure::of(FailureKind::BadInput, message)
    }

    /// The exit status.
    pub fn status(&self) -> u8 {
        self.status
    }

    /// What failed, on one line.
    pub fn line(&self) -> String {
        self.message.replace('\n', " ")
    }
}

impl From<TrainError> for Failure {
    fn from(e: TrainError) -> Failure {
        Failure::of(e.kind(), e.to_string())
    }
}

/// A step's plan for its microbatches' lengths.
#[derive(Clone, Debug)]
pub struct StepPlan {
    /// Slot `s` takes data microbatch `order[s]` (of every data-parallel replica).
    pub order: Vec<usize>,
    /// The schedule built with those microbatches' costs.
    pub plan: Plan,
}

/// Where a run's plans come from: the options' schedule expression on their sizes (with their
/// cost profile and memory limit), and with `--variable-length` one plan per step.
pub trait Planner {
    /// The run's plan. A schedule that does not parse or fit is bad input (2); a pass that
    /// breaks its plan is a bug (1).
    fn plan(&self) -> Result<Plan, Failure>;

    /// The plan for microbatches of `lengths` tokens per sequence (every replica's, replica
    /// major) and the slot order of their data.
    fn plan_for_lengths(&self, lengths: &[usize]) -> Result<StepPlan, Failure>;
}

/// Trains as `options` say, with plans from the planner `planner` makes for the run's compute
/// threads per rank. Prints progress and the summary; under MPI, on every process of the world.
pub fn run<P: Planner>(
    options: &TrainOptions,
    planner: impl FnOnce(usize) -> Result<P, Failure>,
) -> Result<(), Failure> {
    if options.dp == 0 {
        return Err(Failure::bad(
            "--dp 0: there must be at least one data-parallel replica",
        ));
    }
    if options.eval.is_some() && options.resume.is_none() {
        return Err(Failure::bad("--eval needs --resume CHECKPOINT"));
    }
    let threads = options.threads();
    // candle's matrix products read the thread count of each call from this variable.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let config = GptConfig::new(
        options.layers,
        options.d_model,
        options.heads,
        options.seq_len,
    )
    .map_err(|e| Failure::bad(e.to_string()))?;
    let mixture = options.mixture(config.mlp_hidden())?;
    let (config, expert_ranks) = match mixture {
        Some((moe, ranks)) => (config.with_moe(moe), ranks),
        None => (config, 1),
    };
    let mpi = start_mpi(options, expert_ranks)?;
    let planner = planner(threads)?;
    let plan = planner.plan()?;
    let corpus = match &options.data {
        Some(path) => Corpus::from_path(path)?,
        None => Corpus::default_sources()?,
    };
    let lr = LrSchedule::new(
        options.lr,
        options.lr / 10.0,
        (options.steps / 10).max(1),
        options.steps,
    )?;
    let settings = TrainSettings {
        config,
        shape: BatchShape::new(
            options.seq_len,
            options.microbatch_size,
            (options.microbatches * options.dp) as usize,
        )?,
        replicas: options.dp,
        lr,
        max_grad_norm: 1.0,
        seed: options.seed,
        deterministic: options.deterministic,
        recompute: options.recompute,
        dtype: candle_core::DType::F32,
        eval_sequences: 64,
        receive_timeout: options.receive_timeout()?,
        injections: options.injections()?,
        layers_per_stage: options.layers_per_stage.clone(),
        variable_length: options.variable_length,
        fingerprint: options.fingerprint(),
        expert_ranks,
        exchange_latency: options.exchange_latency()?,
        pairs: match options.sequential_pairs {
            true => Pairs::InTurn,
            false => Pairs::Overlapped,
        },
    };
    let mut trainer = make_trainer(&mpi, &plan, &corpus, settings)?;
    let run = Run {
        options,
        planner: &planner,
        plan: &plan,
        corpus: &corpus,
    };
    let result = resume_and_train(&run, &mut trainer);
    if let Err(failure) = &result {
        if failure.status == 1 {
            // Under MPI the other ranks must not wait for this one: report, then end the job.
            eprintln!("error: {}", failure.line());
            trainer.abandon();
        }
    }
    result
}

/// MPI, started once per process for `--backend mpi` (finalized when dropped).
#[cfg(feature = "mpi")]
type Mpi = Option<pipeweave_backends::mpi::rsmpi::environment::Universe>;
#[cfg(not(feature = "mpi"))]
type Mpi = Option<()>;

#[cfg(feature = "mpi")]
fn start_mpi(options: &TrainOptions, expert_ranks: u32) -> Result<Mpi, Failure> {
    if options.backend != Backend::Mpi {
        return Ok(None);
    }
    if options.timeline.is_some() {
        return Err(Failure::bad(
            "--timeline needs --backend threads (one process sees only its own rank's ops)",
        ));
    }
    crate::mpi::start(expert_ranks)?.map(Some).ok_or_else(|| {
        Failure::bad("--backend mpi: MPI could not be initialised (is this run under mpirun?)")
    })
}

#[cfg(not(feature = "mpi"))]
fn start_mpi(options: &TrainOptions, _expert_ranks: u32) -> Result<Mpi, Failure> {
    if options.backend == Backend::Mpi {
        return Err(Failure::bad(
            "--backend mpi needs the binary built with the cargo feature `mpi` (see README)",
        ));
    }
    Ok(None)
}

/// The trainer on threads, or on this process's rank of the MPI world.
fn make_trainer(
    mpi: &Mpi,
    plan: &Plan,
    corpus: &Corpus,
    settings: TrainSettings,
) -> Result<Trainer, Failure> {
    #[cfg(feature = "mpi")]
    if let Some(universe) = mpi {
        let cluster = crate::mpi::MpiCluster::new(
            &universe.world(),
            plan,
            &settings.config,
            (settings.replicas, settings.expert_ranks),
            settings.deterministic,
            settings.receive_timeout,
        )?;
        return Ok(Trainer::on_cluster(
            plan,
            corpus,
            settings,
            Box::new(cluster),
        )?);
    }
    let _ = mpi;
    Ok(Trainer::new(plan, corpus, settings)?)
}

/// `--resume` with `--eval`: the checkpoint's loss on a text; otherwise the run, resumed from
/// `--resume` where given.
fn resume_and_train(run: &Run<'_>, trainer: &mut Trainer) -> Result<(), Failure> {
    let options = run.options;
    if let (Some(checkpoint), Some(text)) = (&options.resume, &options.eval) {
        trainer.load_weights(checkpoint)?;
        let corpus = Corpus::from_path(text)?;
        let (loss, tokens) = trainer.loss_and_tokens_on(corpus.bytes())?;
        if trainer.is_writer() {
            println!("{{\"eval_loss\": {loss}, \"tokens\": {tokens}}}");
        }
        return Ok(());
    }
    if let Some(checkpoint) = &options.resume {
        trainer.resume(checkpoint)?;
    }
    session::train(run, trainer)
}

/// What a run trains with: its options, the planner of its step plans, its first plan and its
/// corpus.
#[derive(Clone, Copy)]
struct Run<'a> {
    options: &'a TrainOptions,
    planner: &'a dyn Planner,
    plan: &'a Plan,
    corpus: &'a Corpus,
}
