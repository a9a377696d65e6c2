//! `pipeweave plan`: build, verify, simulate and report a schedule.

use crate::cli::options::{parse_activation_memory, parse_costs, read_stage_costs};
use crate::config::{build_plan, PipelineConfig};
use crate::error::Error;
use crate::report::PlanReport;
use clap::{Args, ValueEnum};
use pipeweave_core::simulate;
use std::io::Write;

/// The schedule `pipeweave plan` builds when no expression is given.
pub const DEFAULT_EXPRESSION: &str = "vpp(f1b(gpipe), chunks=2)";

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Grid and figures for humans.
    Text,
    /// One JSON document.
    Json,
}

/// Arguments of `pipeweave plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Schedule expression, e.g. `vpp(f1b(gpipe), chunks=2)`.
    #[arg(default_value = DEFAULT_EXPRESSION)]
    expression: String,
    /// Number of pipeline ranks.
    #[arg(long, short = 'p', default_value_t = 4)]
    ranks: u32,
    /// Number of microbatches.
    #[arg(long, short = 'm', default_value_t = 8)]
    microbatches: u32,
    /// Durations of a rank's whole share: `F=1,I=1,W=1,B=..,FB=..,comm=0`.
    #[arg(long, default_value = "F=1,I=1,W=1,comm=0")]
    costs: String,
    /// Per-rank costs from a JSON list (`[{"F":1,"I":1,"W":1}, ...]`), one entry per rank.
    #[arg(long, value_name = "FILE")]
    stage_costs: Option<String>,
    /// Activation memory of one microbatch on a rank's share: `total=1,weight_grad=1`.
    #[arg(long, default_value = "total=1")]
    activation_memory: String,
    /// Per-rank activation bound (units of `total`), verified after every pass.
    #[arg(long)]
    memory_limit: Option<f64>,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Also write the JSON report to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
}

/// Runs `pipeweave plan`.
pub fn run(args: &PlanArgs, stdout: &mut dyn Write) -> Result<(), Error> {
    let (costs, comm) = parse_costs(&args.costs)?;
    let memory = parse_activation_memory(&args.activation_memory)?;
    if let Some(limit) = args.memory_limit {
        if !(limit.is_finite() && limit > 0.0) {
            return Err(Error::Option {
                option: "--memory-limit",
                message: format!("{limit} must be > 0"),
            });
        }
    }
    let mut config = PipelineConfig::new(args.ranks, args.microbatches)?
        .with_costs(costs, comm)?
        .with_memory(memory)
        .with_memory_limit(args.memory_limit);
    if let Some(path) = &args.stage_costs {
        config = config.with_rank_costs(read_stage_costs(path)?)?;
    }
    let plan = build_plan(&args.expression, &config)?;
    let simulation = simulate(&plan)?;
    let report = PlanReport::new(&args.expression, &plan, &simulation);
    let json = serde_json::to_string_pretty(&report).expect("a report always serialises");
    if let Some(path) = &args.json {
        std::fs::write(path, &json).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
    }
    let text = match args.format {
        Format::Text => report.to_text(&plan, &simulation),
        Format::Json => json + "\n",
    };
    stdout
        .write_all(text.as_bytes())
        .map_err(|source| Error::Io {
            path: "<stdout>".to_string(),
            source,
        })
}
