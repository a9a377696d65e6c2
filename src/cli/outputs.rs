//! What `plan` and `check` share: the compile entry's last steps ([`crate::compile::finish_beside`]:
//! verify, simulate, project, check the communication) and writing the report and the files a
//! plan can be written to.
//!
//! A large plan keeps a second core busy: the communication check runs beside the rendering and
//! staging of the files ([`crate::cli::staged`]: written under temporary names, put in place only
//! once every check has passed, in the order they always were), and the JSON report is written
//! while the text report is formatted.

use crate::cli::staged::Staged;
pub use crate::compile::Source;
use crate::compile::{finish_beside, finish_source, Compiled};
use crate::error::Error;
use crate::report::PlanReport;
use clap::{Args, ValueEnum};
use pipeweave_core::formats::{csv, svg, trace};
use pipeweave_core::{CutCosts, Plan, ProgramSet, RecvPolicy, Sharing, Simulation};
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

impl RecvArg {
    /// The projection's receive policy.
    pub fn policy(self) -> RecvPolicy {
        match self {
            RecvArg::Early => RecvPolicy::Early,
            RecvArg::JustInTime => RecvPolicy::JustInTime,
        }
    }
}

/// Verifies and simulates an imported plan, projects the plan along its simulated timeline
/// (unless programs came with it) and checks the programs, once, by the compile entry
/// ([`crate::compile`]): the backends run them as they are.
pub fn check_plan(source: Source, recv: RecvArg) -> Result<Compiled, Error> {
    finish_source(source, recv.policy())
}

/// What a report says beyond the plan and its simulation.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReportContext<'a> {
    /// The profile's cut, where the costs came from a profile.
    pub cut: Option<&'a CutCosts>,
    /// The ranks' shared host links.
    pub sharing: Sharing,
    /// The costs an imported plan is under (in `--costs` syntax) and whether they are the
    /// default.
    pub costs: Option<(&'a str, bool)>,
}

/// [`check_plan`], then the report and the files: the communication check runs on a thread of its
/// own while the files are rendered and staged (none is put in place before every check passed).
pub fn check_and_emit(
    title: &str,
    source: Source,
    args: &OutputArgs,
    context: &ReportContext,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    if args.csv.is_some() {
        // Refused before anything is rendered: no file is left.
        csv::pytorch_expressible(source.plan().problem())?;
    }
    let left_out = args
        .csv
        .as_ref()
        .and_then(|_| csv::residency_left_out(source.plan()));
    let (checked, files) =
        finish_beside(source, args.recv.policy(), |plan, programs, simulation| {
            Files::render(title, plan, programs, simulation, args, context)
        })?;
    files.write(&checked, args, stdout)?;
    if let Some(note) = left_out {
        eprintln!("note: {note}");
    }
    leave_to_exit(checked);
    Ok(())
}

/// Leaves `values` to the end of the process instead of freeing them: the command ends here,
/// and freeing a large plan's programs and report one allocation at a time costs more than
/// writing them (the operating system takes the memory back at once).
fn leave_to_exit<T>(values: T) {
    std::mem::forget(values);
}

fn write_file(path: &str, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}

/// What the output options ask for, rendered and staged ([`Staged`]) while the programs' check
/// runs: everything but what needs its counts (the report's text and JSON).
struct Files {
    report: PlanReport,
    svg: Option<Staged>,
    trace: Option<Staged>,
    csv: Option<Staged>,
    programs: Option<Staged>,
}

impl Files {
    fn render(
        title: &str,
        plan: &Plan,
        programs: &ProgramSet,
        simulation: &Simulation,
        args: &OutputArgs,
        context: &ReportContext,
    ) -> Files {
        let svg = |path: &String| Staged::new(path, svg::timeline_svg(plan, simulation, title));
        let trace = |path: &String| {
            let value = trace::chrome_trace(plan, simulation, title);
            let text = serde_json::to_string(&value).expect("a trace always serialises");
            Staged::new(path, text)
        };
        let csv = |path: &String| {
            let text = if args.lowered {
                csv::lowered_csv(programs)
            } else {
                csv::compute_csv(plan)
            };
            Staged::new(path, text)
        };
        let programs_json = |path: &String| {
            let text = serde_json::to_string_pretty(programs).expect("programs always serialise");
            Staged::new(path, text)
        };
        let mut report = PlanReport::new(title, plan, simulation)
            .with_cut(context.cut)
            .with_links(context.sharing, simulation);
        if let Some((text, default)) = context.costs {
            report = report.with_costs(text, default);
        }
        Files {
            report,
            svg: args.svg.as_ref().map(svg),
            trace: args.trace.as_ref().map(trace),
            csv: args.csv.as_ref().map(csv),
            programs: args.programs.as_ref().map(programs_json),
        }
    }

    /// Writes the JSON report, puts the staged files in place and writes the report on stdout.
    fn write(
        self,
        checked: &Compiled,
        args: &OutputArgs,
        stdout: &mut dyn Write,
    ) -> Result<(), Error> {
        let report = self
            .report
            .with_programs(checked.programs.programs(), checked.programs.report());
        let json = (args.json.is_some() || args.format == Format::Json)
            .then(|| serde_json::to_string_pretty(&report).expect("a report always serialises"));
        let staged = [self.svg, self.trace, self.csv, self.programs];
        // The files are written and put in place, in order, while the text report is formatted.
        let (written, text) = std::thread::scope(|scope| {
            let writer = scope.spawn(|| {
                if let (Some(path), Some(json)) = (&args.json, &json) {
                    write_file(path, json)?;
                }
                staged.into_iter().flatten().try_for_each(Staged::commit)
            });
            let text = (args.format == Format::Text)
                .then(|| report.to_text(&checked.plan, &checked.simulation));
            let written = writer
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (written, text)
        });
        written?;
        let text = match (text, json) {
            (Some(text), _) => text,
            (None, json) => json.expect("a JSON report is rendered for --format json") + "\n",
        };
        stdout
            .write_all(text.as_bytes())
            .map_err(|source| Error::Io {
                path: "<stdout>".to_string(),
                source,
            })?;
        leave_to_exit(report);
        Ok(())
    }
}
