//! The `pipeweave` command-line tool (contract: ../shared/CLI.md).
//!
//! - `pipeweave plan [EXPR] --ranks P --microbatches M [--costs ..] [--activation-memory ..]
//!   [--memory-limit L] [--stage-costs FILE] [outputs]`
//! - `pipeweave check FILE.csv|FILE.json [--costs ..] [outputs]`
//! - `pipeweave run [EXPR] --ranks P --microbatches M [--backend threads|mpi] [--time-scale MS]
//!   [--timeout S]` (`mpi` needs the cargo feature `mpi` and `mpirun -np P`)
//! - `pipeweave tune --ranks P --microbatches M [--costs ..] [--activation-memory ..]
//!   [--memory-limit L] [--top K] [--format text|json]`
//!
//! Outputs: `--format text|json`, `--json FILE`, `--svg FILE`, `--trace FILE`, `--csv FILE
//! [--lowered]`, `--programs FILE`, `--recv early|just-in-time`.
//!
//! Exit status: 0 on success; 2 on bad input (one line on stderr naming the constraint); 1 when a
//! pass produced an invalid plan (a bug, reported with the pass's name), when a run fails, or when
//! its gradients differ from the single-device computation.

mod check_command;
mod options;
mod outputs;
pub mod plan_command;
mod profile_options;
mod run_command;
mod staged;
#[cfg(feature = "train")]
pub mod train_command;
mod tune_command;

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::io::Write;

pub use options::{parse_activation_memory, parse_costs, DEFAULT_ACTIVATION_MEMORY, DEFAULT_COSTS};
pub use plan_command::PlanArgs;
pub use profile_options::{parse_memory_limit, read_memory_limit, ProfileArgs};

/// Command-line interface.
#[derive(Debug, Parser)]
#[command(
    name = "pipeweave",
    version,
    about = "Compose, verify and simulate pipeline-parallel schedules"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a schedule from an expression, verify it, simulate it and print the figures.
    Plan(PlanArgs),
    /// Import a schedule CSV (or reference JSON), verify it, check its communication, simulate it.
    Check(check_command::CheckArgs),
    /// Execute a plan on a backend with a numeric model; compare time and gradients.
    Run(run_command::RunArgs),
    /// Search the schedules and their arguments for the fastest that fits the memory limit.
    Tune(tune_command::TuneArgs),
    /// Train a GPT on bytes through a pipeline schedule (../shared/TRAIN.md).
    #[cfg(feature = "train")]
    Train(train_command::TrainOptions),
}

/// Runs the tool with `args` (including the program name); returns the exit status.
pub fn run<I, T>(args: I, stdout: &mut dyn Write, stderr: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if e.exit_code() == 0 => {
            // --help and --version.
            let _ = write!(stdout, "{}", e.render());
            return 0;
        }
        Err(e) => {
            let _ = writeln!(stderr, "error: {}", one_line(&e));
            return 2;
        }
    };
    let result = match cli.command {
        Command::Plan(args) => plan_command::run(&args, stdout).map(|()| true),
        Command::Check(args) => check_command::run(&args, stdout).map(|()| true),
        Command::Run(args) => run_command::run(&args, stdout),
        #[cfg(feature = "train")]
        Command::Train(args) => return i32::from(train_command::run(&args, stderr)),
        Command::Tune(args) => tune_command::run(&args, stdout).map(|()| true),
    };
    match result {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            let line = e.to_string().replace('\n', " ");
            let _ = writeln!(stderr, "error: {line}");
            exit_code(&e)
        }
    }
}

/// A command-line error as one line: a bad value as the library words it (so the CLI and Python
/// give the same line), anything else as clap words it, its tip kept, its usage dropped.
fn one_line(error: &clap::Error) -> String {
    use std::error::Error as _;
    if let Some(ours) = error
        .source()
        .and_then(|s| s.downcast_ref::<crate::Error>())
    {
        return ours.to_string().replace('\n', " ");
    }
    let rendered = error.render().to_string();
    let mut parts = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() || line.starts_with("Usage:") || line.starts_with("For more information")
        {
            continue;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line).to_string());
    }
    parts.join("; ")
}

/// 2 for everything the user can fix, 1 for a bug in a pass or a failed run
/// ([`crate::Error::kind`]).
fn exit_code(e: &crate::Error) -> i32 {
    i32::from(e.kind().exit_status())
}
