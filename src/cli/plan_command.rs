//! `pipeweave plan`: build a schedule from an expression, verify it, project and check its
//! programs, simulate it, and report (text or JSON) and write the requested files.

use crate::cli::options::{parse_activation_memory, parse_costs, read_stage_costs};
use crate::cli::outputs::{check_and_emit, OutputArgs, Source};
use crate::cli::profile_options::{parse_memory_limit, ProfileArgs};
use crate::config::{build_and_simulate, PipelineConfig};
use crate::error::Error;
use clap::Args;
use pipeweave_core::CutCosts;
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
    #[arg(long, short = 'p', default_value_t = 4)]
    pub ranks: u32,
    /// Number of microbatches.
    #[arg(long, short = 'm', default_value_t = 8)]
    pub microbatches: u32,
    /// Durations of a rank's whole share: `F=1,I=1,W=1,B=..,FB=..,comm=0`.
    #[arg(long, default_value = "F=1,I=1,W=1,comm=0")]
    pub costs: String,
    /// Measured costs: `--profile`, `--layers-per-stage`.
    #[command(flatten)]
    pub profile: ProfileArgs,
}

impl ScheduleArgs {
    /// The sizes and uniform costs as a configuration, or the costs and memory of a profile's
    /// cut (with the cut).
    pub fn config(&self) -> Result<(PipelineConfig, Option<CutCosts>), Error> {
        let (costs, comm) = parse_costs(&self.costs)?;
        let config = PipelineConfig::new(self.ranks, self.microbatches)?.with_costs(costs, comm)?;
        self.profile.apply(config)
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
    /// Activation memory of one microbatch on a rank's share: `total=1,weight_grad=1`.
    #[arg(long, default_value = "total=1")]
    activation_memory: String,
    /// Per-rank activation bound (units of `total`; with --profile also bytes, e.g. `2GiB`),
    /// verified after every pass.
    #[arg(long)]
    memory_limit: Option<String>,
    #[command(flatten)]
    outputs: OutputArgs,
}

/// Runs `pipeweave plan`.
pub fn run(args: &PlanArgs, stdout: &mut dyn Write) -> Result<(), Error> {
    let memory = parse_activation_memory(&args.activation_memory)?;
    let (config, cut) = args.schedule.config()?;
    let memory_limit = parse_memory_limit(
        args.memory_limit.as_deref(),
        cut.as_ref().map(|c| c.bytes_per_unit),
    )?;
    let mut config = match &cut {
        // The profile's memory replaces --activation-memory.
        Some(_) => config,
        None => config.with_memory(memory),
    }
    .with_memory_limit(memory_limit);
    if let Some(path) = &args.stage_costs {
        config = config.with_rank_costs(read_stage_costs(path)?)?;
    }
    let (plan, simulation) = build_and_simulate(&args.schedule.expression, &config)?;
    check_and_emit(
        &args.schedule.expression,
        Source::Built(plan, simulation),
        &args.outputs,
        cut.as_ref(),
        stdout,
    )
}
