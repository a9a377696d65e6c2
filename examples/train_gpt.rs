//! Trains a GPT on bytes through any pipeweave schedule (contract: ../shared/TRAIN.md).
//!
//! `cargo run --release --example train_gpt -- --schedule 'zero_bubble(f1b(gpipe))' --ranks 2`
//!
//! Every rank runs in its own thread over the checked per-rank programs of the plan, or, with
//! `--backend mpi` (cargo feature `mpi`), in its own process under
//! `mpirun -np RANKS·DP target/release/examples/train_gpt --backend mpi ...`; the model is cut
//! into the plan's stages; losses equal a single-rank run (bit for bit with `--deterministic`, on
//! either backend). Without `--data` it trains on the source files of this checkout. Under MPI,
//! world rank 0 prints, logs and writes the files; a failing rank reports and aborts the job.

use clap::{Parser, ValueEnum};
use pipeweave::cli::parse_memory_limit;
use pipeweave::variable_length::{plan_for_lengths, LengthCost};
use pipeweave::Plan;
use pipeweave::Profile;
use pipeweave::{build_plan, PipelineConfig};
use pipeweave_kernels::GptConfig;
use pipeweave_train::checkpoint::config_path;
use pipeweave_train::data::BatchShape;
#[cfg(feature = "mpi")]
use pipeweave_train::mpi::MpiCluster;
use pipeweave_train::{
    pipeline_overhead, step_timeline, Corpus, GptProfileModel, Injection, LossCurve, LrSchedule,
    Progress, StepLog, TrainError, TrainSettings, Trainer,
};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Where the ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// One thread per rank in this process.
    Threads,
    /// One MPI process per rank (cargo feature `mpi`).
    Mpi,
}

/// Train a GPT on bytes through a pipeline schedule.
#[derive(Debug, Parser)]
#[command(name = "train_gpt")]
struct Args {
    /// The schedule expression (../shared/CLI.md).
    #[arg(long, default_value = "f1b(gpipe)")]
    schedule: String,
    /// Pipeline ranks.
    #[arg(long, short = 'p', default_value_t = 2)]
    ranks: u32,
    /// Microbatches per step.
    #[arg(long, short = 'm', default_value_t = 8)]
    microbatches: u32,
    /// Data-parallel replicas of the whole pipeline.
    #[arg(long, default_value_t = 1)]
    dp: u32,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Tokens (bytes) per sequence.
    #[arg(long, default_value_t = 64)]
    seq_len: usize,
    /// Sequences per microbatch.
    #[arg(long, default_value_t = 4)]
    microbatch_size: usize,
    /// Optimizer steps (the total, when resuming); the learning-rate schedule spans them.
    #[arg(long, default_value_t = 120)]
    steps: u64,
    /// Stop after this step (saving with --save), as an interrupted run would; resume with the
    /// same --steps to continue on the same schedule.
    #[arg(long)]
    stop_after: Option<u64>,
    /// Peak learning rate (warm-up over the first tenth of the steps, cosine decay to a tenth).
    #[arg(long, default_value_t = 3e-3)]
    lr: f64,
    /// Seeds weights, data order and every other random choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A UTF-8 text file or a folder of them (default: this checkout's source files).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Accumulate weight gradients in microbatch order: bit-identical losses for every schedule.
    #[arg(long)]
    deterministic: bool,
    /// Keep only each stage's input after the forward; recompute the rest for the backward.
    #[arg(long)]
    recompute: bool,
    /// Blocks per model stage, in order (the embedding on the first, the head on the last);
    /// default: as even as the layer count allows.
    #[arg(long, value_delimiter = ',', value_name = "A,B,...")]
    layers_per_stage: Option<Vec<usize>>,
    /// Microbatches cut at document boundaries (a file of the default corpus, a
    /// blank-line-separated block of --data), each as long as its longest sequence up to
    /// --seq-len; every step's plan is built with one cost per microbatch (threads and MPI).
    #[arg(long)]
    variable_length: bool,
    /// Build the schedule from this profile's costs and memory (written by --profile; of this
    /// run's model), cut by --layers-per-stage (one count per rank) or evenly: the plan
    /// `pipeweave plan/tune --profile` simulated, for schedules whose order follows the costs
    /// (Zero Bubble's policies, `memory=` arguments). With --variable-length, microbatches are
    /// also priced by its per-token model (default: linear in the tokens, unit costs).
    #[arg(long, value_name = "FILE.json")]
    cost_profile: Option<PathBuf>,
    /// Build the schedule within this per-rank activation limit, as `pipeweave plan/tune
    /// --memory-limit` do (units of the heaviest rank share's activations of one microbatch;
    /// with --cost-profile also bytes, e.g. `24MiB`).
    #[arg(long, value_name = "L")]
    memory_limit: Option<String>,
    /// With --variable-length: keep one plan with uniform costs (for comparison).
    #[arg(long, requires = "variable_length")]
    uniform_plan: bool,
    /// Compute threads each rank may use (default: the machine's cores / ranks).
    #[arg(long)]
    threads_per_rank: Option<usize>,
    /// Where the ranks run.
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    backend: Backend,
    /// One JSON object per step.
    #[arg(long)]
    log: Option<PathBuf>,
    /// The loss curve (train and held-out) as SVG.
    #[arg(long)]
    curve: Option<PathBuf>,
    /// Evaluate on the held-out text every this many steps (and at the end).
    #[arg(long, default_value_t = 20)]
    eval_every: u64,
    /// Write the last step's measured timeline: PREFIX.measured.svg, PREFIX.simulated.svg (the
    /// simulator's prediction from the measured op costs) and PREFIX.trace.json (Perfetto).
    #[arg(long, value_name = "PREFIX")]
    timeline: Option<PathBuf>,
    /// After the run, measure every layer (median F, I, W seconds, activation bytes, the send
    /// time) and write the profile that `pipeweave plan/run/tune --profile` read.
    #[arg(long, value_name = "FILE.json")]
    profile: Option<PathBuf>,
    /// Write a checkpoint at the end.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Continue from a checkpoint.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// A rank waiting longer than this many seconds for a message stops the run with a report
    /// of who waits on whom.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Make rank R's stage fail in step S (`R@S`), for tests of failure handling.
    #[arg(long, value_name = "RANK@STEP")]
    fail: Option<String>,
    /// Make rank R stop responding in step S (`R@S`) for twice --timeout.
    #[arg(long, value_name = "RANK@STEP")]
    stall: Option<String>,
    /// With --resume: print the loss of the checkpoint on this text and exit.
    #[arg(long)]
    eval: Option<PathBuf>,
}

/// A failure with its exit status: 2 for bad input, 1 for a bug or a failed run (the kind the
/// error carries, as `pipeweave` decides its own).
struct Failure {
    status: u8,
    message: String,
}

impl From<TrainError> for Failure {
    fn from(e: TrainError) -> Failure {
        Failure {
            status: e.kind().exit_status(),
            message: e.to_string(),
        }
    }
}

impl From<pipeweave::Error> for Failure {
    fn from(e: pipeweave::Error) -> Failure {
        Failure {
            status: e.kind().exit_status(),
            message: e.to_string(),
        }
    }
}

fn bad(message: impl Into<String>) -> Failure {
    Failure {
        status: 2,
        message: message.into(),
    }
}

fn main() -> ExitCode {
    // Freed activations stay in the heap for the next microbatch (no page faults per op).
    pipeweave_train::allocator::keep_freed_memory();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {}", f.message.replace('\n', " "));
            ExitCode::from(f.status)
        }
    }
}

/// MPI, started once per process for `--backend mpi` (finalized when dropped).
#[cfg(feature = "mpi")]
type Mpi = Option<pipeweave_backends::mpi::rsmpi::environment::Universe>;
#[cfg(not(feature = "mpi"))]
type Mpi = Option<()>;

#[cfg(feature = "mpi")]
fn start_mpi(args: &Args) -> Result<Mpi, Failure> {
    if args.backend != Backend::Mpi {
        return Ok(None);
    }
    if args.timeline.is_some() {
        return Err(bad(
            "--timeline needs --backend threads (one process sees only its own rank's ops)",
        ));
    }
    pipeweave_backends::mpi::rsmpi::initialize()
        .map(Some)
        .ok_or_else(|| {
            bad("--backend mpi: MPI could not be initialised (is this run under mpirun?)")
        })
}

#[cfg(not(feature = "mpi"))]
fn start_mpi(args: &Args) -> Result<Mpi, Failure> {
    if args.backend == Backend::Mpi {
        return Err(bad(
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
        let cluster = MpiCluster::new(
            &universe.world(),
            plan,
            &settings.config,
            settings.replicas,
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

fn run(args: &Args) -> Result<(), Failure> {
    let mpi = start_mpi(args)?;
    if args.dp == 0 {
        return Err(bad(
            "--dp 0: there must be at least one data-parallel replica",
        ));
    }
    if args.eval.is_some() && args.resume.is_none() {
        return Err(bad("--eval needs --resume CHECKPOINT"));
    }
    let threads = args.threads_per_rank.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / (args.ranks * args.dp).max(1) as usize).max(1)
    });
    // candle's matrix products read the thread count of each call from this variable.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    let config = GptConfig::new(args.layers, args.d_model, args.heads, args.seq_len)
        .map_err(|e| bad(e.to_string()))?;
    // A schedule that does not parse or fit is bad input (2); a pass that breaks its plan is a
    // bug (1).
    let costing = Costing::of(args, threads)?;
    let plan = build_plan(&args.schedule, &costing.config)?;
    let corpus = match &args.data {
        Some(path) => Corpus::from_path(path)?,
        None => Corpus::default_sources()?,
    };
    let lr = LrSchedule::new(
        args.lr,
        args.lr / 10.0,
        (args.steps / 10).max(1),
        args.steps,
    )?;
    let settings = TrainSettings {
        config,
        shape: BatchShape::new(
            args.seq_len,
            args.microbatch_size,
            (args.microbatches * args.dp) as usize,
        )?,
        replicas: args.dp,
        lr,
        max_grad_norm: 1.0,
        seed: args.seed,
        deterministic: args.deterministic,
        recompute: args.recompute,
        dtype: candle_core::DType::F32,
        eval_sequences: 64,
        receive_timeout: timeout(args.timeout)?,
        injections: injections(args)?,
        layers_per_stage: args.layers_per_stage.clone(),
        variable_length: args.variable_length,
        fingerprint: format!(
            "{} ranks={} microbatches={} microbatch_size={} dp={}",
            args.schedule, args.ranks, args.microbatches, args.microbatch_size, args.dp
        ),
    };
    let mut trainer = make_trainer(&mpi, &plan, &corpus, settings)?;
    let result = resume_and_train(args, &costing, &plan, &mut trainer, &corpus);
    if let Err(failure) = &result {
        if failure.status == 1 {
            // Under MPI the other ranks must not wait for this one: report, then end the job.
            eprintln!("error: {}", failure.message.replace('\n', " "));
            trainer.abandon();
        }
    }
    result
}

fn resume_and_train(
    args: &Args,
    costing: &Costing,
    plan: &Plan,
    trainer: &mut Trainer,
    corpus: &Corpus,
) -> Result<(), Failure> {
    if let (Some(checkpoint), Some(text)) = (&args.resume, &args.eval) {
        trainer.load_weights(checkpoint)?;
        let corpus = Corpus::from_path(text)?;
        let (loss, tokens) = trainer.loss_and_tokens_on(corpus.bytes())?;
        if trainer.is_writer() {
            println!("{{\"eval_loss\": {loss}, \"tokens\": {tokens}}}");
        }
        return Ok(());
    }
    if let Some(checkpoint) = &args.resume {
        trainer.resume(checkpoint)?;
    }
    train(args, costing, plan, trainer, corpus)
}

fn train(
    args: &Args,
    costing: &Costing,
    plan: &Plan,
    trainer: &mut Trainer,
    corpus: &Corpus,
) -> Result<(), Failure> {
    let writer = trainer.is_writer();
    let mut log = match &args.log {
        Some(path) if writer => {
            Some(std::fs::File::create(path).map_err(|e| bad(format!("{}: {e}", path.display())))?)
        }
        _ => None,
    };
    let end = args.stop_after.map_or(args.steps, |k| k.min(args.steps));
    let progress = if writer {
        Progress::start(end)
    } else {
        Progress::with_visibility(end, false)
    };
    let mut train_curve = Vec::new();
    let mut eval_curve = Vec::new();
    let mut first: Option<StepLog> = None;
    let mut last = Vec::new();
    let first_step = trainer.steps_done();
    let mut current = plan.clone();
    let (mut replanned, mut reordered) = (0usize, 0usize);
    while trainer.steps_done() < end {
        if let Some(next) = step_plan(args, costing, &current, trainer, &mut reordered)? {
            trainer.set_plan(&next)?;
            current = next;
            replanned += 1;
        }
        let step = trainer.step()?;
        progress.update(
            step.step,
            step.loss,
            step.tokens as f64 / step.seconds.max(1e-9),
        );
        if let Some(file) = log.as_mut() {
            let line = serde_json::json!({
                "step": step.step,
                "loss": step.loss,
                "tokens": step.tokens,
                "seconds": step.seconds,
                "lr": step.lr,
                "grad_norm": step.grad_norm,
            });
            writeln!(file, "{line}").map_err(|e| bad(format!("--log: {e}")))?;
        }
        train_curve.push((step.step, step.loss));
        if step.step % args.eval_every.max(1) == 0 || step.step == end {
            eval_curve.push((step.step, trainer.evaluate()?));
        }
        last.push(step.loss);
        first.get_or_insert(step);
    }
    let tail = &last[last.len().saturating_sub(10)..];
    let mean_tail = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let summary = match (first, eval_curve.last()) {
        (Some(first), Some((_, eval))) => format!(
            "{} steps of {} on {} ranks{} ({} bytes of {}): loss {:.4} -> {:.4} (mean of the last {}), held-out {:.4}",
            end,
            args.schedule,
            args.ranks,
            if args.dp > 1 { format!(" x {} replicas", args.dp) } else { String::new() },
            corpus.bytes().len(),
            corpus.origin().display(),
            first.loss,
            mean_tail,
            tail.len(),
            eval
        ),
        _ => format!("nothing to do: the run is already at step {}", trainer.steps_done()),
    };
    if let Some(path) = &args.save {
        // Collective under MPI: every process takes part, world rank 0 writes.
        trainer.save(path)?;
    }
    if !writer {
        return Ok(());
    }
    progress.finish(&summary);
    if !trainer.peak_activation_bytes().is_empty() {
        eprintln!(
            "peak live activation bytes per rank (last step, measured): {:?}",
            trainer.peak_activation_bytes()
        );
    }
    if trainer.peak_host_bytes().iter().any(|&b| b > 0) {
        eprintln!(
            "peak offloaded bytes in host memory per rank (last step, measured): {:?}",
            trainer.peak_host_bytes()
        );
    }
    if let Some(path) = &args.curve {
        let svg = LossCurve::new(
            format!("{} — {}", args.schedule, corpus.origin().display()),
            train_curve,
            eval_curve,
        )
        .to_svg();
        std::fs::write(path, svg).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    }
    if !trainer.last_measured().is_empty() {
        let overhead = pipeline_overhead(&current, trainer.last_measured())?;
        eprintln!(
            "pipeline overhead (last step): measured {:.4} s, replayed from its measured op times {:.4} s (ratio {:.3})",
            overhead.measured_seconds,
            overhead.replayed_seconds,
            overhead.ratio()
        );
    }
    if args.variable_length && !args.uniform_plan {
        eprintln!(
            "variable-length plans (one cost per microbatch): {reordered} of {} steps put the cheapest microbatches where the fill and the drain wait, {replanned} changed the schedule's orders",
            end.saturating_sub(first_step)
        );
    }
    if let Some(prefix) = &args.timeline {
        write_timeline(prefix, &current, trainer, &args.schedule)?;
    }
    if let Some(path) = &args.profile {
        write_profile(trainer, path)?;
    }
    if let Some(path) = &args.save {
        eprintln!(
            "saved {} (config {})",
            path.display(),
            config_path(path).display()
        );
    }
    Ok(())
}

/// With `--variable-length` (and not `--uniform-plan`), the next step's plan from its
/// microbatches' lengths ([`plan_for_lengths`]), its data order set on the trainer; `None` when
/// the orders stay those of `current`.
fn step_plan(
    args: &Args,
    costing: &Costing,
    current: &Plan,
    trainer: &mut Trainer,
    reordered: &mut usize,
) -> Result<Option<Plan>, Failure> {
    if !args.variable_length || args.uniform_plan {
        return Ok(None);
    }
    let lengths = trainer.next_microbatch_lengths()?;
    let planned = plan_for_lengths(&args.schedule, &costing.config, &lengths, &costing.length)?;
    if planned.order.iter().enumerate().any(|(slot, &m)| slot != m) {
        *reordered += 1;
    }
    trainer.set_microbatch_order(planned.order)?;
    let next = planned.plan;
    Ok((next.orders() != current.orders()).then_some(next))
}

/// What the run's plans are built from, read once: the sizes, costs, memory and limit (unit
/// costs, or with `--cost-profile` the profile's for the run's cut, as `pipeweave plan --profile
/// --layers-per-stage` costs it; `--memory-limit`) and how `--variable-length` prices a
/// microbatch (the profile's per-token model, or linear in the tokens).
struct Costing {
    config: PipelineConfig,
    length: LengthCost,
}

impl Costing {
    /// Reads `--cost-profile` (of this run's model) and notes where it was measured with other
    /// compute threads (`threads` here) or another microbatch size.
    fn of(args: &Args, threads: usize) -> Result<Costing, Failure> {
        let config =
            PipelineConfig::new(args.ranks, args.microbatches).map_err(|e| bad(e.to_string()))?;
        let limit = |bytes_per_unit| {
            parse_memory_limit(args.memory_limit.as_deref(), bytes_per_unit)
                .map_err(|e| bad(e.to_string()))
        };
        let Some((profile, gpt)) = cost_profile(args)? else {
            return Ok(Costing {
                config: config.with_memory_limit(limit(None)?),
                length: LengthCost::Linear { full: args.seq_len },
            });
        };
        // The plan keeps the profile's seconds; say so where they were measured otherwise.
        if (profile.threads_per_rank, gpt.microbatch_size) != (threads, args.microbatch_size) {
            eprintln!(
                "note: the cost profile was measured with {} compute threads per rank and \
                 microbatches of {}; this run has {threads} and {} (the plan keeps its costs)",
                profile.threads_per_rank, gpt.microbatch_size, args.microbatch_size
            );
        }
        let shares = match &args.layers_per_stage {
            Some(counts) if counts.len() != args.ranks as usize => {
                return Err(bad(format!(
                    "--cost-profile costs one share per rank: give --layers-per-stage one count \
                     per rank ({} here, not {})",
                    args.ranks,
                    counts.len()
                )))
            }
            other => other.as_deref(),
        };
        let (config, cut) = config
            .with_profile(&profile, shares)
            .map_err(|e| bad(e.to_string()))?;
        Ok(Costing {
            config: config.with_memory_limit(limit(Some(cut.bytes_per_unit))?),
            length: LengthCost::Profiled(Box::new(profile)),
        })
    }
}

/// `--cost-profile`, read and checked to be of this run's model, with the model it describes.
fn cost_profile(args: &Args) -> Result<Option<(Profile, GptProfileModel)>, Failure> {
    let Some(path) = &args.cost_profile else {
        return Ok(None);
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let profile = Profile::from_json(&text).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let m = GptProfileModel::of(&profile).ok_or_else(|| {
        bad(format!(
            "{}: a profile of another model (not one of this trainer's GPT: its model needs the \
             name `{}` or none, `blocks`, `d_model`, `heads`, `vocab`, `seq_len` and \
             `microbatch_size`, and one free layer per block, as `--profile` writes)",
            path.display(),
            GptProfileModel::NAME
        ))
    })?;
    if (m.blocks, m.d_model, m.heads, m.seq_len)
        != (args.layers, args.d_model, args.heads, args.seq_len)
    {
        return Err(bad(format!(
            "{}: a profile of another model ({} blocks, width {}, {} heads, seq {}; this run: {}, {}, {}, {})",
            path.display(),
            m.blocks, m.d_model, m.heads, m.seq_len, args.layers, args.d_model, args.heads, args.seq_len
        )));
    }
    Ok(Some((profile, m)))
}

/// Measures every layer of the run's model on this thread, with the run's compute threads, and
/// scales the layers' times to the op times the run's last step measured at each stage.
fn write_profile(trainer: &Trainer, path: &std::path::Path) -> Result<(), Failure> {
    let profile = trainer.profile(5)?;
    std::fs::write(path, profile.to_json() + "\n")
        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
    let total =
        |f: fn(&pipeweave::LayerProfile) -> f64| -> f64 { profile.layers.iter().map(f).sum() };
    eprintln!(
        "wrote the profile {} ({} layers; the whole model per microbatch: F {:.4} s, I {:.4} s, W {:.4} s; one send {:.6} s)",
        path.display(),
        profile.layers.len(),
        total(|l| l.forward),
        total(|l| l.input_grad),
        total(|l| l.weight_grad),
        profile.send.seconds
    );
    Ok(())
}

/// The last step's measured timeline beside the simulator's prediction from measured op costs.
fn write_timeline(
    prefix: &std::path::Path,
    plan: &Plan,
    trainer: &Trainer,
    title: &str,
) -> Result<(), Failure> {
    if trainer.last_measured().is_empty() {
        return Ok(());
    }
    let timeline = step_timeline(plan, trainer.last_measured(), title)?;
    let file = |suffix: &str| {
        let mut name = prefix.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    for (suffix, contents) in [
        (".measured.svg", &timeline.measured_svg),
        (".simulated.svg", &timeline.simulated_svg),
        (".trace.json", &timeline.trace),
    ] {
        let path = file(suffix);
        std::fs::write(&path, contents).map_err(|e| bad(format!("{}: {e}", path.display())))?;
    }
    eprintln!(
        "wrote {}.measured.svg, .simulated.svg and .trace.json",
        prefix.display()
    );
    Ok(())
}

fn timeout(seconds: f64) -> Result<std::time::Duration, Failure> {
    if !(seconds.is_finite() && seconds > 0.0) {
        return Err(bad(format!(
            "--timeout {seconds}: must be a positive number of seconds"
        )));
    }
    Ok(std::time::Duration::from_secs_f64(seconds))
}

/// `--fail R@S` and `--stall R@S`.
fn injections(args: &Args) -> Result<Vec<(u32, u64, Injection)>, Failure> {
    let parse = |option: &str, text: &str| -> Result<(u32, u64), Failure> {
        let parsed = text
            .split_once('@')
            .and_then(|(r, s)| Some((r.trim().parse().ok()?, s.trim().parse().ok()?)));
        match parsed {
            Some((rank, step)) if rank < args.ranks * args.dp && step >= 1 => Ok((rank, step)),
            _ => Err(bad(format!(
                "{option} {text}: expected RANK@STEP with RANK below {} (ranks x dp) and STEP from 1",
                args.ranks * args.dp
            ))),
        }
    };
    let mut out = Vec::new();
    if let Some(text) = &args.fail {
        let (rank, step) = parse("--fail", text)?;
        out.push((rank, step, Injection::Fail));
    }
    if let Some(text) = &args.stall {
        let (rank, step) = parse("--stall", text)?;
        let pause = timeout(args.timeout)? * 2;
        out.push((rank, step, Injection::Stall(pause)));
    }
    Ok(out)
}
