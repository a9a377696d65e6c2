//! `pipeweave plan`: build a schedule from an expression, verify it, project and check its
//! programs, simulate it, and report (text or JSON) and write the requested files.

use crate::cli::options::{count, read_stage_costs, LinkArgs};
use crate::cli::options::{
    parse_costs, parse_memory_options, DEFAULT_ACTIVATION_MEMORY, DEFAULT_COSTS,
};
use crate::cli::outputs::{check_and_emit, OutputArgs, ReportContext, Source};
use crate::cli::profile_options::ProfileArgs;
use crate::compile::run_passes;
use crate::config::PipelineConfig;
use crate::error::Error;
use crate::request::ConfigRequest;
use clap::Args;
use pipeweave_core::{CutCosts, MAX_MICROBATCHES, MAX_RANKS};
use pipeweave_transforms::Registry;
use std::io::Write;

/// The schedule `pipeweave plan` builds when no expression is given.
pub const DEFAULT_EXPRESSION: &str = "vpp(f1b(gpipe), chunks=2)";

/// What `plan` and `run` share: the expression, the sizes and the costs.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// Schedule expression, e.g. `vpp(f1b(gpipe), chunks=2)`.
    #[arg(default_value = DEFAULT_EXPRESSION)]
    pub expression: String,
    /// Number of pipeline ranks.
    #[arg(long, short = 'p', default_value = "4", allow_negative_numbers = true,
          value_parser = count("--ranks", "ranks", MAX_RANKS.into()))]
    pub ranks: u32,
    /// Number of microbatches.
    #[arg(long, short = 'm', default_value = "8", allow_negative_numbers = true,
          value_parser = count("--microbatches", "microbatches", MAX_MICROBATCHES.into()))]
    pub microbatches: u32,
    /// Durations of a rank's whole share: `F=1,I=1,W=1,B=..,FB=..,comm=0`.
    #[arg(long, default_value = DEFAULT_COSTS)]
    pub costs: String,
    /// Measured costs: `--profile`, `--layers-per-stage`.
    #[command(flatten)]
    pub profile: ProfileArgs,
    /// The host links: `--ranks-per-link`.
    #[command(flatten)]
    pub links: LinkArgs,
}

impl ScheduleArgs {
    /// The sizes and uniform costs as a configuration, or the costs and memory of a profile's
    /// cut (with the cut).
    pub fn config(&self) -> Result<(PipelineConfig, Option<CutCosts>), Error> {
        self.request()?.config()
    }

    /// The sizes, costs and profile as a request (unit activations, no limit).
    pub fn request(&self) -> Result<ConfigRequest, Error> {
        let (costs, comm) = parse_costs(&self.costs)?;
        Ok(ConfigRequest {
            costs,
            comm,
            profile: self.profile.source(),
            profile_options: self.profile.options(),
            ranks_per_link: self.links.ranks_per_link,
            ..ConfigRequest::new(self.ranks, self.microbatches)
        })
    }
}

/// Arguments of `pipeweave plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    schedule: ScheduleArgs,
    /// Per-stage costs from a JSON list (`[{"F":1,"I":1,"W":1}, ...]`), one entry per model stage
    /// (stage s is rank s's share before `vpp` splits it; `dual`'s mirror of stage s costs what
    /// stage s does).
    #[arg(long, value_name = "FILE")]
    stage_costs: Option<String>,
    /// Activation memory of one microbatch on a rank's share: `total=1,weight_grad=1`
    /// (also `checkpoint=0`, what a recomputed forward keeps, and `experts=0`, the part a
    /// mixture's experts keep until their W).
    #[arg(long, default_value = DEFAULT_ACTIVATION_MEMORY)]
    activation_memory: String,
    /// Per-rank activation bound (units of `total`; with --profile also bytes, e.g. `2GiB`),
    /// verified after every pass.
    #[arg(long)]
    memory_limit: Option<String>,
    #[command(flatten)]
    outputs: OutputArgs,
}

impl PlanArgs {
    /// The configuration these options ask for, as a request ([`ConfigRequest`]).
    pub fn request(&self) -> Result<ConfigRequest, Error> {
        let (activation_memory, memory_limit) =
            parse_memory_options(&self.activation_memory, self.memory_limit.as_deref())?;
        Ok(ConfigRequest {
            activation_memory,
            memory_limit,
            ..self.schedule.request()?
        })
    }
}

/// Runs `pipeweave plan`.
pub fn run(args: &PlanArgs, stdout: &mut dyn Write) -> Result<(), Error> {
    let (mut config, cut) = args.request()?.config()?;
    if let Some(path) = &args.stage_costs {
        config = config.with_rank_costs(read_stage_costs(path)?)?;
    }
    let expression = &args.schedule.expression;
    let (plan, simulation) = run_passes(&Registry::builtin(), expression, &config)?;
    let context = ReportContext {
        cut: cut.as_ref(),
        sharing: config.sharing(),
        costs: None,
    };
    check_and_emit(
        expression,
        Source::Built(plan, simulation),
        &args.outputs,
        &context,
        stdout,
    )
}
