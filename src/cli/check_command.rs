//! `pipeweave check FILE`: import a schedule (PyTorch CSV, compute or lowered, or a reference JSON
//! file), verify it, project and check its communication, simulate it, and report.

use crate::cli::options::parse_costs;
use crate::cli::outputs::{check_and_emit, OutputArgs, Source};
use crate::error::Error;
use crate::reference::read_reference;
use clap::Args;
use pipeweave_core::formats::csv::import_csv;
use pipeweave_core::Sharing;
use std::io::Write;

/// Arguments of `pipeweave check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The schedule: a `.csv` in PyTorch's dialect, or a `.json` reference file.
    file: String,
    /// Durations of a rank's whole share: `F=1,I=1,W=1,B=..,FB=..,comm=0`.
    #[arg(long, default_value = "F=1,I=1,W=1,comm=0")]
    costs: String,
    #[command(flatten)]
    outputs: OutputArgs,
}

/// Runs `pipeweave check`.
pub fn run(args: &CheckArgs, stdout: &mut dyn Write) -> Result<(), Error> {
    let (costs, comm) = parse_costs(&args.costs)?;
    let text = std::fs::read_to_string(&args.file).map_err(|source| Error::Io {
        path: args.file.clone(),
        source,
    })?;
    let (plan, programs) = if args.file.ends_with(".json") {
        (read_reference(&args.file, &text, costs, comm)?, None)
    } else {
        let imported = import_csv(&text, costs, comm)?;
        (imported.plan, imported.programs)
    };
    let source = Source::Imported(plan, programs);
    check_and_emit(
        &args.file,
        source,
        &args.outputs,
        None,
        Sharing::default(),
        stdout,
    )
}
