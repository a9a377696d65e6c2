//! What `plan` and `check` share: checking a plan end to end (verify, project, check the
//! communication, simulate) and writing the report and the files a plan can be written to.

use crate::error::Error;
use crate::report::PlanReport;
use clap::{Args, ValueEnum};
use pipeweave_core::formats::{csv, svg, trace};
use pipeweave_core::{
    check_programs, project, simulate, verify, CheckReport, Plan, ProgramSet, ProjectionOptions,
    RecvPolicy, Simulation,
};
use std::io::Write;

/// Output format on stdout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Grid and figures for humans.
    Text,
    /// One JSON document.
    Json,
}

/// Where receives go in the projected programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RecvArg {
    /// As soon as the message exists in the global order (completes under blocking semantics).
    Early,
    /// Right before the compute that needs it (fewest buffers; batched semantics).
    JustInTime,
}

/// Output options shared by `plan` and `check`.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Also write the JSON report to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<String>,
    /// Write an SVG timeline to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<String>,
    /// Write a Chrome/Perfetto trace to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<String>,
    /// Write PyTorch's schedule CSV to FILE (compute actions; see --lowered).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<String>,
    /// With --csv: write the projected programs with their communication actions.
    #[arg(long, requires = "csv")]
    pub lowered: bool,
    /// Write the projected per-rank programs as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub programs: Option<String>,
    /// Receive placement of the projected programs.
    #[arg(long, value_enum, default_value_t = RecvArg::Early)]
    pub recv: RecvArg,
}

/// A plan that passed every check, with its programs and simulation.
pub struct Checked {
    /// The plan.
    pub plan: Plan,
    /// Its programs (projected, or imported from a lowered file).
    pub programs: ProgramSet,
    /// What the communication check counted.
    pub counts: CheckReport,
    /// Its simulation.
    pub simulation: Simulation,
}

/// Verifies `plan`, projects it (unless `programs` came with it), checks the programs and
/// simulates.
pub fn check_plan(
    plan: Plan,
    programs: Option<ProgramSet>,
    recv: RecvArg,
) -> Result<Checked, Error> {
    verify(&plan)?;
    let programs = match programs {
        Some(p) => p,
        None => {
            let recv = match recv {
                RecvArg::Early => RecvPolicy::Early,
                RecvArg::JustInTime => RecvPolicy::JustInTime,
            };
            project(
                &plan,
                ProjectionOptions {
                    recv,
                    forward_only: false,
                },
            )?
        }
    };
    let counts = check_programs(plan.problem(), &programs)?;
    let simulation = simulate(&plan)?;
    for (what, value) in [
        ("makespan", simulation.makespan()),
        ("bubble rate", simulation.bubble_rate()),
    ] {
        if !value.is_finite() {
            return Err(Error::Overflow { what, value });
        }
    }
    Ok(Checked {
        plan,
        programs,
        counts,
        simulation,
    })
}

fn write_file(path: &str, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}

/// Writes the requested files and the report on stdout.
pub fn emit(
    title: &str,
    checked: &Checked,
    args: &OutputArgs,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    let report = PlanReport::new(title, &checked.plan, &checked.simulation)
        .with_programs(&checked.programs, &checked.counts);
    let json = serde_json::to_string_pretty(&report).expect("a report always serialises");
    if let Some(path) = &args.json {
        write_file(path, &json)?;
    }
    if let Some(path) = &args.svg {
        write_file(
            path,
            &svg::timeline_svg(&checked.plan, &checked.simulation, title),
        )?;
    }
    if let Some(path) = &args.trace {
        let value = trace::chrome_trace(&checked.plan, &checked.simulation, title);
        write_file(
            path,
            &serde_json::to_string(&value).expect("a trace always serialises"),
        )?;
    }
    if let Some(path) = &args.csv {
        let text = if args.lowered {
            csv::lowered_csv(&checked.programs)
        } else {
            csv::compute_csv(&checked.plan)
        };
        write_file(path, &text)?;
    }
    if let Some(path) = &args.programs {
        write_file(
            path,
            &serde_json::to_string_pretty(&checked.programs).expect("programs always serialise"),
        )?;
    }
    let text = match args.format {
        Format::Text => report.to_text(&checked.plan, &checked.simulation),
        Format::Json => json + "\n",
    };
    stdout
        .write_all(text.as_bytes())
        .map_err(|source| Error::Io {
            path: "<stdout>".to_string(),
            source,
        })
}
