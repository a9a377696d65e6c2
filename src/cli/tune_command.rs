//! `pipeweave tune`: search the schedules for the fastest that fits (contract: ../shared/CLI.md),
//! with a progress bar on a terminal.

use crate::cli::options::{parse_activation_memory, parse_costs};
use crate::cli::outputs::Format;
use crate::cli::profile_options::{parse_memory_limit, ProfileArgs};
use crate::config::PipelineConfig;
use crate::error::Error;
use crate::frontier::{frontier, frontier_expressions, frontier_svg};
use crate::tune::{candidate_cuts, candidate_expressions, tune, tune_cuts, TuneReport};
use clap::Args;
use std::io::{IsTerminal, Write};

/// Arguments of `pipeweave tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Number of pipeline ranks.
    #[arg(long, short = 'p', default_value_t = 4)]
    ranks: u32,
    /// Number of microbatches.
    #[arg(long, short = 'm', default_value_t = 8)]
    microbatches: u32,
    /// Durations of a rank's whole share: `F=1,I=1,W=1,B=..,FB=..,comm=0`.
    #[arg(long, default_value = "F=1,I=1,W=1,comm=0")]
    costs: String,
    /// Activation memory of one microbatch on a rank's share: `total=1,weight_grad=1`.
    #[arg(long, default_value = "total=1")]
    activation_memory: String,
    /// Per-rank activation bound (units of `total`; with --profile also bytes, e.g. `2GiB`)
    /// every candidate must fit.
    #[arg(long)]
    memory_limit: Option<String>,
    /// Measured costs: `--profile` (then the cut is chosen too, unless
    /// `--layers-per-stage` fixes it).
    #[command(flatten)]
    profile: ProfileArgs,
    /// How many of the best to print.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Print the memory/time frontier: for each memory limit, the fastest schedule found.
    #[arg(long)]
    frontier: bool,
    /// With --frontier: draw it (makespan against memory) as an SVG picture to FILE.
    #[arg(long, value_name = "FILE", requires = "frontier")]
    svg: Option<String>,
}

/// Runs `pipeweave tune`.
pub fn run(args: &TuneArgs, stdout: &mut dyn Write) -> Result<(), Error> {
    let (costs, comm) = parse_costs(&args.costs)?;
    let base = PipelineConfig::new(args.ranks, args.microbatches)?
        .with_costs(costs, comm)?
        .with_memory(parse_activation_memory(&args.activation_memory)?);
    let profile = args.profile.read()?;
    if args.frontier {
        // One cut: the given one or the even one.
        let (config, cut) = match &profile {
            Some(p) => {
                let (config, cut) = args.profile.costed(base, p)?;
                (config, Some(cut))
            }
            None => (base, None),
        };
        let limit = parse_memory_limit(
            args.memory_limit.as_deref(),
            cut.as_ref().map(|c| c.bytes_per_unit),
        )?;
        return run_frontier(args, &config.with_memory_limit(limit), limit, stdout);
    }
    let mut report = match &profile {
        None => {
            let limit = parse_memory_limit(args.memory_limit.as_deref(), None)?;
            search(args, &base.with_memory_limit(limit), limit)
        }
        Some(p) => {
            let cuts = match &args.profile.layers_per_stage {
                Some(cut) => vec![cut.clone()],
                None => candidate_cuts(p.model.layers, args.ranks as usize, 64),
            };
            let base = args
                .profile
                .with_cores(args.profile.with_tokens(base, p)?, p)?;
            tune_cuts(&base, p, &cuts, &mut |config, cut| {
                let limit =
                    parse_memory_limit(args.memory_limit.as_deref(), Some(cut.bytes_per_unit))?;
                Ok(search(
                    args,
                    &config.clone().with_memory_limit(limit),
                    limit,
                ))
            })?
        }
    };
    if report.candidates.is_empty() {
        return Err(Error::Option {
            option: "--memory-limit",
            message: format!(
                "no schedule fits in {} per rank ({} tried)",
                args.memory_limit
                    .as_deref()
                    .unwrap_or("unlimited activations"),
                report.evaluated
            ),
        });
    }
    report.candidates.truncate(args.top.max(1));
    let text = match args.format {
        Format::Json => {
            serde_json::to_string_pretty(&report).expect("a tune report always serialises") + "\n"
        }
        Format::Text => {
            // The expression column is as wide as the longest expression shown (52 at least).
            let width = report
                .candidates
                .iter()
                .map(|c| c.expression.len())
                .max()
                .unwrap_or(0)
                .max(52);
            let mut out = format!(
                "best of {} schedules for {} ranks, {} microbatches{}:\n\n{:>4}  {:<width$} {:>10} {:>8} {:>6}\n",
                report.evaluated,
                args.ranks,
                args.microbatches,
                args.memory_limit
                    .as_ref()
                    .map_or(String::new(), |l| format!(" within {l} per rank")),
                "rank",
                "expression",
                "makespan",
                "bubble",
                "peak"
            );
            for (i, c) in report.candidates.iter().enumerate() {
                out.push_str(&format!(
                    "{:>4}  {:<width$} {:>10.3} {:>8.4} {:>6.2}",
                    i + 1,
                    c.expression,
                    c.makespan,
                    c.bubble_rate,
                    c.peak_activations
                ));
                if let (Some(layers), Some(bytes)) = (&c.layers_per_stage, c.peak_activation_bytes)
                {
                    let shown: Vec<String> = layers.iter().map(usize::to_string).collect();
                    out.push_str(&format!(
                        "  --layers-per-stage {} ({:.1} MiB peak)",
                        shown.join(","),
                        bytes / (1024.0 * 1024.0)
                    ));
                }
                out.push('\n');
            }
            out
        }
    };
    write_out(stdout, &text)
}

/// The ranked schedules of one configuration: with a limit, the frontier's search (`auto` at
/// every rung of its ladder up to the limit, then recompute and offload); without, every
/// candidate expression.
fn search(args: &TuneArgs, config: &PipelineConfig, limit: Option<f64>) -> TuneReport {
    match limit {
        Some(_) => {
            let bar = progress_bar(frontier_expressions(config).len());
            bar.set_message("schedules");
            let found = frontier(config, &|done| bar.set_position(done as u64));
            bar.finish_and_clear();
            found.ranked()
        }
        None => {
            let expressions = candidate_expressions(args.ranks, None);
            let bar = progress_bar(expressions.len());
            bar.set_message("schedules");
            let report = tune(config, &expressions, &|done| bar.set_position(done as u64));
            bar.finish_and_clear();
            report
        }
    }
}

fn progress_bar(len: usize) -> indicatif::ProgressBar {
    if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(len as u64)
    } else {
        indicatif::ProgressBar::hidden()
    }
}

fn write_out(stdout: &mut dyn Write, text: &str) -> Result<(), Error> {
    stdout
        .write_all(text.as_bytes())
        .map_err(|source| Error::Io {
            path: "<stdout>".to_string(),
            source,
        })
}

/// `tune --frontier`.
fn run_frontier(
    args: &TuneArgs,
    config: &PipelineConfig,
    limit: Option<f64>,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    let bar = progress_bar(frontier_expressions(config).len());
    bar.set_message("frontier");
    let found = frontier(config, &|done| bar.set_position(done as u64));
    bar.finish_and_clear();
    if found.frontier.is_empty() {
        return Err(Error::Option {
            option: "--memory-limit",
            message: format!(
                "no schedule fits in {} activations per rank ({} tried)",
                limit.unwrap_or(f64::INFINITY),
                found.expressions
            ),
        });
    }
    let title = format!(
        "memory/time frontier, {} ranks, {} microbatches ({} schedules)",
        args.ranks, args.microbatches, found.expressions
    );
    if let Some(path) = &args.svg {
        std::fs::write(path, frontier_svg(&found, &title)).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        })?;
    }
    let text = match args.format {
        Format::Json => {
            serde_json::to_string_pretty(&found).expect("a frontier always serialises") + "\n"
        }
        Format::Text => {
            let width = found
                .frontier
                .iter()
                .map(|p| p.expression.len())
                .max()
                .unwrap_or(0)
                .max(10);
            let mut out = format!(
                "{title}:\n\n{:>12}  {:<width$} {:>12}\n",
                "memory limit", "expression", "makespan"
            );
            for p in &found.frontier {
                out.push_str(&format!(
                    "{:>12.3}  {:<width$} {:>12.3}\n",
                    p.memory_limit, p.expression, p.makespan
                ));
            }
            out
        }
    };
    write_out(stdout, &text)
}
