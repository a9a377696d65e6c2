//! The trainer's options (TRAIN.md), as `train_gpt` and `pipeweave train` read them, and the
//! checks of the ones clap cannot make alone.

use super::{Backend, Failure};
use crate::stage::Injection;
use clap::Args;
use pipeweave_kernels::MoeConfig;
use std::path::PathBuf;
use std::time::Duration;

/// The load-balancing loss's coefficient without `--aux-coefficient` (Switch Transformer's).
pub const DEFAULT_AUX_COEFFICIENT: f64 = 0.01;

/// The options of a training run (`pipeweave train`, `examples/train_gpt.rs`; TRAIN.md).
#[derive(Clone, Debug, Args)]
pub struct TrainOptions {
    /// The schedule expression (../shared/CLI.md).
    #[arg(long, default_value = "f1b(gpipe)")]
    pub schedule: String,
    /// Pipeline ranks.
    #[arg(long, short = 'p', default_value_t = 2)]
    pub ranks: u32,
    /// Microbatches per step.
    #[arg(long, short = 'm', default_value_t = 8)]
    pub microbatches: u32,
    /// Data-parallel replicas of the whole pipeline.
    #[arg(long, default_value_t = 1)]
    pub dp: u32,
    /// Transformer blocks.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    pub d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Experts per block: the blocks' MLPs become routed mixtures of E experts (each an MLP of
    /// the model's MLP width), each token to its --top-k.
    #[arg(long, value_name = "E")]
    pub experts: Option<usize>,
    /// Experts each token goes to (with --experts; default 2, or E where E < 2).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Expert ranks per pipeline rank (with --experts; must divide E; world D x P x X): each
    /// holds and runs E/X experts of every block, the ranks of a stage exchanging expert rows.
    #[arg(long, value_name = "X")]
    pub expert_parallel: Option<u32>,
    /// Run each overlapped F&B pair's halves one after the other (with --expert-parallel; by
    /// default they run overlapped, each all-to-all under the other half's compute).
    #[arg(long)]
    pub sequential_pairs: bool,
    /// Make every expert exchange last at least S seconds from its issue (with
    /// --expert-parallel): an emulated interconnect, to measure what the overlapped pairs hide
    /// where the all-to-all costs time. 0 (the default): the exchanges take what they take.
    #[arg(long, value_name = "S", default_value_t = 0.0)]
    pub exchange_latency: f64,
    /// The scale of the mixture's load-balancing loss (with --experts), added to the training
    /// loss as its mean over microbatches summed over blocks (the logged loss stays the LM loss).
    #[arg(long, value_name = "C")]
    pub aux_coefficient: Option<f64>,
    /// Tokens (bytes) per sequence.
    #[arg(long, default_value_t = 64)]
    pub seq_len: usize,
    /// Sequences per microbatch.
    #[arg(long, default_value_t = 4)]
    pub microbatch_size: usize,
    /// Optimizer steps (the total, when resuming); the learning-rate schedule spans them.
    #[arg(long, default_value_t = 120)]
    pub steps: u64,
    /// Stop after this step (saving with --save), as an interrupted run would; resume with the
    /// same --steps to continue on the same schedule.
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// Peak learning rate (warm-up over the first tenth of the steps, cosine decay to a tenth).
    #[arg(long, default_value_t = 3e-3)]
    pub lr: f64,
    /// Seeds weights, data order and every other random choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A UTF-8 text file or a folder of them (default: this checkout's source files).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Accumulate weight gradients in microbatch order: bit-identical losses for every schedule.
    #[arg(long)]
    pub deterministic: bool,
    /// Keep only each stage's input after the forward; recompute the rest for the backward.
    #[arg(long)]
    pub recompute: bool,
    /// Blocks per model stage, in order (the embedding on the first, the head on the last);
    /// default: as even as the layer count allows.
    #[arg(long, value_delimiter = ',', value_name = "A,B,...")]
    pub layers_per_stage: Option<Vec<usize>>,
    /// Microbatches cut at document boundaries (a file of the default corpus, a
    /// blank-line-separated block of --data), each as long as its longest sequence up to
    /// --seq-len; every step's plan is built with one cost per microbatch (threads and MPI).
    #[arg(long)]
    pub variable_length: bool,
    /// Build the schedule from this profile's costs and memory (written by --profile; of this
    /// run's model), cut by --layers-per-stage (one count per rank) or evenly: the plan
    /// `pipeweave plan/tune --profile` simulated, for schedules whose order follows the costs
    /// (Zero Bubble's policies, `memory=` arguments). With --variable-length, microbatches are
    /// also priced by its per-token model (default: linear in the tokens, unit costs).
    #[arg(long, value_name = "FILE.json")]
    pub cost_profile: Option<PathBuf>,
    /// Build the schedule within this per-rank activation limit, as `pipeweave plan/tune
    /// --memory-limit` do (units of the heaviest rank share's activations of one microbatch;
    /// with --cost-profile also bytes, e.g. `24MiB`).
    #[arg(long, value_name = "L")]
    pub memory_limit: Option<String>,
    /// With --variable-length: keep one plan with uniform costs (for comparison).
    #[arg(long, requires = "variable_length")]
    pub uniform_plan: bool,
    /// Compute threads each rank may use (default: the machine's cores / ranks).
    #[arg(long)]
    pub threads_per_rank: Option<usize>,
    /// Where the ranks run.
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    pub backend: Backend,
    /// One JSON object per step.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// The loss curve (train and held-out) as SVG.
    #[arg(long)]
    pub curve: Option<PathBuf>,
    /// Evaluate on the held-out text every this many steps (and at the end).
    #[arg(long, default_value_t = 20)]
    pub eval_every: u64,
    /// Write the last step's measured timeline: PREFIX.measured.svg, PREFIX.simulated.svg (the
    /// simulator's prediction from the measured op costs) and PREFIX.trace.json (Perfetto).
    #[arg(long, value_name = "PREFIX")]
    pub timeline: Option<PathBuf>,
    /// After the run, measure every layer (median F, I, W seconds, activation bytes, the send
    /// time) and write the profile that `pipeweave plan/run/tune --profile` read.
    #[arg(long, value_name = "FILE.json")]
    pub profile: Option<PathBuf>,
    /// Write a checkpoint at the end.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Continue from a checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// A rank waiting longer than this many seconds for a message stops the run with a report
    /// of who waits on whom.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Make rank R's stage fail in step S (`R@S`), for tests of failure handling.
    #[arg(long, value_name = "RANK@STEP")]
    pub fail: Option<String>,
    /// Make rank R stop responding in step S (`R@S`) for twice --timeout.
    #[arg(long, value_name = "RANK@STEP")]
    pub stall: Option<String>,
    /// With --resume: print the loss of the checkpoint on this text and exit.
    #[arg(long)]
    pub eval: Option<PathBuf>,
}

impl TrainOptions {
    /// `--threads-per-rank`, or the machine's cores shared by every rank of every replica (and
    /// every expert rank).
    pub fn threads(&self) -> usize {
        self.threads_per_rank.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores / self.world().max(1) as usize).max(1)
        })
    }

    /// The ranks of the run: ranks x dp x expert ranks.
    pub fn world(&self) -> u32 {
        self.ranks * self.dp * self.expert_parallel.unwrap_or(1).max(1)
    }

    /// The mixture of experts of `--experts`, `--top-k` and `--aux-coefficient` for a model of
    /// MLP width `hidden`, and `--expert-parallel` (expert ranks per pipeline rank, 1 without):
    /// `None` without `--experts`; bad input where they do not fit together.
    pub fn mixture(&self, hidden: usize) -> Result<Option<(MoeConfig, u32)>, Failure> {
        let Some(experts) = self.experts else {
            let given = [
                ("--top-k", self.top_k.is_some()),
                ("--expert-parallel", self.expert_parallel.is_some()),
                ("--aux-coefficient", self.aux_coefficient.is_some()),
                ("--sequential-pairs", self.sequential_pairs),
                ("--exchange-latency", self.exchange_latency != 0.0),
            ];
            return match given.iter().find(|(_, given)| *given) {
                Some((option, _)) => Err(Failure::bad(format!(
                    "{option} needs --experts E (a mixture of experts)"
                ))),
                None => Ok(None),
            };
        };
        if experts == 0 {
            return Err(Failure::bad(
                "--experts 0: a mixture needs at least one expert",
            ));
        }
        let top_k = self.top_k.unwrap_or(experts.min(2));
        if top_k == 0 {
            return Err(Failure::bad(
                "--top-k 0: each token must go to at least one expert",
            ));
        }
        if top_k > experts {
            return Err(Failure::bad(format!(
                "--top-k {top_k} is above --experts {experts}: a token goes to distinct experts"
            )));
        }
        let ranks = self.expert_parallel.unwrap_or(1);
        if ranks == 0 {
            return Err(Failure::bad(
                "--expert-parallel 0: there must be at least one expert rank",
            ));
        }
        if experts % ranks as usize != 0 {
            return Err(Failure::bad(format!(
                "--expert-parallel {ranks} does not divide --experts {experts}: each expert rank holds E/X experts"
            )));
        }
        let coefficient = self.aux_coefficient.unwrap_or(DEFAULT_AUX_COEFFICIENT);
        let config = MoeConfig::new(experts, top_k, hidden, coefficient)
            .map_err(|e| Failure::bad(format!("--aux-coefficient {coefficient}: {e}")))?;
        Ok(Some((config, ranks)))
    }

    /// `--exchange-latency` as a duration.
    pub fn exchange_latency(&self) -> Result<Duration, Failure> {
        let s = self.exchange_latency;
        if !(s.is_finite() && (0.0..=10.0).contains(&s)) {
            return Err(Failure::bad(format!(
                "--exchange-latency {s}: must be between 0 and 10 seconds"
            )));
        }
        Ok(Duration::from_secs_f64(s))
    }

    /// `--timeout` as a duration.
    pub fn receive_timeout(&self) -> Result<Duration, Failure> {
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            return Err(Failure::bad(format!(
                "--timeout {}: must be a positive number of seconds",
                self.timeout
            )));
        }
        Ok(Duration::from_secs_f64(self.timeout))
    }

    /// `--fail R@S` and `--stall R@S`.
    pub fn injections(&self) -> Result<Vec<(u32, u64, Injection)>, Failure> {
        let world = self.world();
        let parse = |option: &str, text: &str| -> Result<(u32, u64), Failure> {
            let parsed = text
                .split_once('@')
                .and_then(|(r, s)| Some((r.trim().parse().ok()?, s.trim().parse().ok()?)));
            match parsed {
                Some((rank, step)) if rank < world && step >= 1 => Ok((rank, step)),
                _ => Err(Failure::bad(format!(
                    "{option} {text}: expected RANK@STEP with RANK below {world} (ranks x dp x expert ranks) and STEP from 1"
                ))),
            }
        };
        let mut out = Vec::new();
        if let Some(text) = &self.fail {
            let (rank, step) = parse("--fail", text)?;
            out.push((rank, step, Injection::Fail));
        }
        if let Some(text) = &self.stall {
            let (rank, step) = parse("--stall", text)?;
            let pause = self.receive_timeout()? * 2;
            out.push((rank, step, Injection::Stall(pause)));
        }
        Ok(out)
    }

    /// The checkpoint's fingerprint of the run's schedule and sizes.
    pub fn fingerprint(&self) -> String {
        format!(
            "{} ranks={} microbatches={} microbatch_size={} dp={}",
            self.schedule, self.ranks, self.microbatches, self.microbatch_size, self.dp
        )
    }
}
