//! `pipeweave check FILE`: import a schedule (PyTorch CSV, compute or lowered, or a reference JSON
//! file), verify it, project and check its communication, simulate it, and report.

use crate::cli::options::{parse_costs, DEFAULT_COSTS};
use crate::cli::outputs::{check_and_emit, OutputArgs, ReportContext, Source};
use crate::error::Error;
use crate::request::import_schedule;
use clap::Args;
use std::io::Write;

/// Arguments of `pipeweave check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The schedule: a `.csv` in PyTorch's dialect, or a `.json` reference file.
    file: String,
    /// Durations of a rank's whole share: `F=1,I=1,W=1,B=..,FB=..,comm=0` (default: unit costs,
    /// `F=1,I=1,W=1,comm=0`).
    #[arg(long)]
    costs: Option<String>,
    #[command(flatten)]
    outputs: OutputArgs,
}

/// Runs `pipeweave check`.
pub fn run(args: &CheckArgs, stdout: &mut dyn Write) -> Result<(), Error> {
    let costs = args.costs.as_deref().unwrap_or(DEFAULT_COSTS);
    let (costs_parsed, comm) = parse_costs(costs)?;
    let (plan, programs) = import_schedule(&args.file, costs_parsed, comm)?;
    let source = Source::Imported(plan, programs);
    let context = ReportContext {
        costs: Some((costs, args.costs.is_none())),
        ..ReportContext::default()
    };
    check_and_emit(&args.file, source, &args.outputs, &context, stdout)
}
