//! `pipeweave tune`: search the schedules for the fastest that fits (contract: ../shared/CLI.md),
//! with a progress bar on a terminal.

use crate::cli::options::{count, LinkArgs};
use crate::cli::options::{
    parse_costs, parse_memory_options, DEFAULT_ACTIVATION_MEMORY, DEFAULT_COSTS,
};
use crate::cli::outputs::Format;
use crate::cli::profile_options::ProfileArgs;
use crate::error::Error;
use crate::frontier::frontier_svg;
use crate::request::ConfigRequest;
use crate::text_table::{Align, TextTable};
use clap::Args;
use pipeweave_core::{MAX_MICROBATCHES, MAX_RANKS};
use serde::Serialize;
use std::io::{IsTerminal, Write};

/// Arguments of `pipeweave tune`.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// Number of pipeline ranks.
    #[arg(long, short = 'p', default_value = "4", allow_negative_numbers = true,
          value_parser = count("--ranks", "ranks", MAX_RANKS.into()))]
    ranks: u32,
    /// Number of microbatches.
    #[arg(long, short = 'm', default_value = "8", allow_negative_numbers = true,
          value_parser = count("--microbatches", "microbatches", MAX_MICROBATCHES.into()))]
    microbatches: u32,
    /// Durations of a rank's whole share: `F=1,I=1,W=1,B=..,FB=..,comm=0`.
    #[arg(long, default_value = DEFAULT_COSTS)]
    costs: String,
    /// Activation memory of one microbatch on a rank's share: `total=1,weight_grad=1`
    /// (also `checkpoint=0`, what a recomputed forward keeps, and `experts=0`, the part a
    /// mixture's experts keep until their W).
    #[arg(long, default_value = DEFAULT_ACTIVATION_MEMORY)]
    activation_memory: String,
    /// Per-rank activation bound (units of `total`; with --profile also bytes, e.g. `2GiB`)
    /// every candidate must fit.
    #[arg(long)]
    memory_limit: Option<String>,
    /// Measured costs: `--profile` (then the cut is chosen too, unless
    /// `--layers-per-stage` fixes it).
    #[command(flatten)]
    profile: ProfileArgs,
    /// The host links: `--ranks-per-link`.
    #[command(flatten)]
    links: LinkArgs,
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

impl TuneArgs {
    /// The configuration these options ask for, as a request ([`ConfigRequest`]).
    pub fn request(&self) -> Result<ConfigRequest, Error> {
        let (costs, comm) = parse_costs(&self.costs)?;
        let (activation_memory, memory_limit) =
            parse_memory_options(&self.activation_memory, self.memory_limit.as_deref())?;
        Ok(ConfigRequest {
            costs,
            comm,
            activation_memory,
            memory_limit,
            profile: self.profile.source(),
            profile_options: self.profile.options(),
            ranks_per_link: self.links.ranks_per_link,
            ..ConfigRequest::new(self.ranks, self.microbatches)
        })
    }
}

/// Runs `pipeweave tune`.
pub fn run(args: &TuneArgs, stdout: &mut dyn Write) -> Result<(), Error> {
    let request = args.request()?;
    if args.frontier {
        return run_frontier(args, &request, stdout);
    }
    let mut report = with_progress("schedules", |progress| request.tune(progress))?;
    report.candidates.truncate(args.top.max(1));
    let text = formatted(args.format, &report, |report| {
        let mut out = format!(
            "best of {} schedules for {} ranks, {} microbatches{}:\n\n",
            report.evaluated,
            args.ranks,
            args.microbatches,
            args.memory_limit
                .as_ref()
                .map_or(String::new(), |l| format!(" within {l} per rank")),
        );
        let mut table = TextTable::new(&[
            ("rank", Align::Right, 4),
            ("expression", Align::Left, 52),
            ("makespan", Align::Right, 10),
            ("bubble", Align::Right, 8),
            ("peak", Align::Right, 6),
            ("", Align::Left, 0),
        ]);
        for (i, c) in report.candidates.iter().enumerate() {
            let cut = match (&c.layers_per_stage, c.peak_activation_bytes) {
                (Some(layers), Some(bytes)) => {
                    let shown: Vec<String> = layers.iter().map(usize::to_string).collect();
                    format!(
                        " --layers-per-stage {} ({:.1} MiB peak)",
                        shown.join(","),
                        bytes / (1024.0 * 1024.0)
                    )
                }
                _ => String::new(),
            };
            table.row(vec![
                (i + 1).to_string(),
                c.expression.clone(),
                format!("{:.3}", c.makespan),
                format!("{:.4}", c.bubble_rate),
                format!("{:.2}", c.peak_activations),
                cut,
            ]);
        }
        out.push_str(&table.render());
        if let (Some(bound), Some(gap)) = (report.lower_bound, report.optimality_gap) {
            out.push_str(&format!(
                "\nlower bound {bound:.3}: no schedule of the placements and kinds tried is faster \
                 (the best is {:.2}% above it)\n",
                100.0 * gap
            ));
        }
        out
    });
    write_out(stdout, &text)
}

/// Runs `search` (which reports how many schedules it built) under a counter labelled `what`, on
/// a terminal only (the searches learn how many they build as they go: cuts, ladders and relief
/// rungs).
fn with_progress<R>(what: &'static str, search: impl FnOnce(&(dyn Fn(usize) + Sync)) -> R) -> R {
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        if let Ok(style) = indicatif::ProgressStyle::with_template("{spinner} {msg}: {pos} built") {
            bar.set_style(style);
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_message(what);
    let found = search(&|done| bar.set_position(done as u64));
    bar.finish_and_clear();
    found
}

/// `value` as pretty JSON, or as `text` writes it.
fn formatted<T: Serialize>(format: Format, value: &T, text: impl FnOnce(&T) -> String) -> String {
    match format {
        Format::Json => {
            serde_json::to_string_pretty(value).expect("a tune result always serialises") + "\n"
        }
        Format::Text => text(value),
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
    request: &ConfigRequest,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    let found = with_progress("frontier", |progress| request.frontier(progress))?;
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
    let text = formatted(args.format, &found, |found| {
        let mut table = TextTable::new(&[
            ("memory limit", Align::Right, 12),
            ("expression", Align::Left, 10),
            ("makespan", Align::Right, 12),
        ]);
        for p in &found.frontier {
            table.row(vec![
                format!("{:.3}", p.memory_limit),
                p.expression.clone(),
                format!("{:.3}", p.makespan),
            ]);
        }
        let out = format!("{title}:\n\n{}", table.render());
        out
    });
    write_out(stdout, &text)
}
