//! `compile_plan` and `check_file`: an expression or a schedule file to a [`NativePlan`], the
//! compiled plan with its report (the JSON `plan --format json` prints) and its files.

use crate::errors::{bad_input, detached};
use crate::passes::{registry_with, PythonPass};
use pipeweave::cli::{parse_activation_memory, parse_costs, read_memory_limit, DEFAULT_COSTS};
use pipeweave::compile::{compile, compile_imported, Compiled};
use pipeweave::request::{import_schedule, ConfigRequest, ProfileSource};
use pipeweave::Error;
use pipeweave::ProfileOptions;
use pipeweave_core::formats::{csv, svg, trace};
use pipeweave_core::{
    checked_size, CutCosts, Profile, RecvPolicy, Sharing, MAX_MICROBATCHES, MAX_RANKS,
};
use pyo3::prelude::*;

/// A compiled plan: verified, simulated, its programs checked.
#[pyclass(module = "pipeweave._native", frozen)]
pub struct NativePlan {
    compiled: Compiled,
    title: String,
    cut: Option<CutCosts>,
    /// What the ranks share (host links), for the report's link figures.
    sharing: Sharing,
    /// An imported plan's costs (`--costs` syntax) and whether they are the default.
    costs: Option<(String, bool)>,
}

fn write(path: &str, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::Io {
        path: path.to_string(),
        source,
    })
}

#[pymethods]
impl NativePlan {
    /// The report, as `pipeweave plan --format json` prints it.
    fn report_json(&self) -> String {
        let mut report = self
            .compiled
            .report(&self.title, self.cut.as_ref())
            .with_links(self.sharing, &self.compiled.simulation);
        if let Some((text, default)) = &self.costs {
            report = report.with_costs(text, *default);
        }
        serde_json::to_string_pretty(&report).expect("a report always serialises")
    }

    /// Writes PyTorch's schedule CSV (`lowered`: the checked programs with their communication);
    /// returns the note `plan --csv` prints on what the file leaves out, if any.
    fn write_csv(&self, py: Python<'_>, path: &str, lowered: bool) -> PyResult<Option<String>> {
        detached(py, || {
            let plan = &self.compiled.plan;
            csv::pytorch_expressible(plan.problem())?;
            let text = if lowered {
                csv::lowered_csv(self.compiled.programs.programs())
            } else {
                csv::compute_csv(plan)
            };
            write(path, &text)?;
            Ok(csv::residency_left_out(plan))
        })
    }

    /// Writes the SVG timeline (`plan --svg`).
    fn write_svg(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        detached(py, || {
            let c = &self.compiled;
            write(
                path,
                &svg::timeline_svg(&c.plan, &c.simulation, &self.title),
            )
        })
    }

    /// Writes the Chrome/Perfetto trace (`plan --trace`).
    fn write_trace(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        detached(py, || {
            let c = &self.compiled;
            let value = trace::chrome_trace(&c.plan, &c.simulation, &self.title);
            write(
                path,
                &serde_json::to_string(&value).expect("a trace always serialises"),
            )
        })
    }

    /// The checked per-rank programs as JSON (`plan --programs`).
    fn programs_json(&self) -> String {
        serde_json::to_string_pretty(self.compiled.programs.programs())
            .expect("programs always serialise")
    }
}

fn recv_policy(py: Python<'_>, recv: &str) -> PyResult<RecvPolicy> {
    match recv {
        "early" => Ok(RecvPolicy::Early),
        "just-in-time" | "just_in_time" => Ok(RecvPolicy::JustInTime),
        other => Err(bad_input(
            py,
            format!("option --recv: `{other}` is not `early` or `just-in-time`"),
        )),
    }
}

/// The request the keyword arguments of `pipeweave.plan`/`tune`/`frontier` make: the CLI's
/// option texts (already rendered in its syntax by the Python side) and a profile as JSON or a
/// path.
#[derive(FromPyObject)]
#[pyo3(from_item_all)]
pub struct RequestArgs {
    /// As the user gave them (any whole number): the library checks their range, as the CLI's.
    ranks: i128,
    microbatches: i128,
    costs: Option<String>,
    activation_memory: Option<String>,
    memory_limit: Option<String>,
    profile_json: Option<String>,
    profile_path: Option<String>,
    layers_per_stage: Option<Vec<usize>>,
    microbatch_tokens: Option<Vec<usize>>,
    cores: Option<u32>,
    ranks_per_link: Option<u32>,
}

impl RequestArgs {
    /// Pipeline ranks, as given.
    pub fn ranks(&self) -> i128 {
        self.ranks
    }

    /// Microbatches, as given.
    pub fn microbatches(&self) -> i128 {
        self.microbatches
    }

    /// The library's request, the profile parsed and checked.
    pub fn request(&self) -> Result<ConfigRequest, Error> {
        let mut request = ConfigRequest::new(
            checked_size("ranks", self.ranks, MAX_RANKS.into())?,
            checked_size("microbatches", self.microbatches, MAX_MICROBATCHES.into())?,
        );
        if let Some(costs) = &self.costs {
            (request.costs, request.comm) = parse_costs(costs)?;
        }
        if let Some(memory) = &self.activation_memory {
            request.activation_memory = parse_activation_memory(memory)?;
        }
        request.memory_limit = self
            .memory_limit
            .as_deref()
            .map(read_memory_limit)
            .transpose()?;
        request.profile = match (&self.profile_json, &self.profile_path) {
            (Some(text), _) => ProfileSource::Loaded(Box::new(Profile::from_json(text)?)),
            (None, Some(path)) => ProfileSource::File(path.clone()),
            (None, None) => ProfileSource::None,
        };
        request.profile_options = ProfileOptions {
            layers_per_stage: self.layers_per_stage.clone(),
            microbatch_tokens: self.microbatch_tokens.clone(),
            cores: self.cores,
        };
        request.ranks_per_link = self.ranks_per_link.unwrap_or(1);
        for (given, option) in [
            (self.layers_per_stage.is_some(), "layers_per_stage"),
            (self.microbatch_tokens.is_some(), "microbatch_tokens"),
            (self.cores.is_some(), "cores"),
        ] {
            if given && matches!(request.profile, ProfileSource::None) {
                return Err(Error::Option {
                    option: "--profile",
                    message: format!("`{option}` needs a profile"),
                });
            }
        }
        Ok(request)
    }
}

/// Compiles `expression` on the configuration `args` describes, with the Python passes
/// `passes` registered beside the built-ins.
#[pyfunction]
#[pyo3(signature = (expression, args, recv="early", passes=Vec::new()))]
pub fn compile_plan(
    py: Python<'_>,
    expression: &str,
    args: RequestArgs,
    recv: &str,
    passes: Vec<PythonPass>,
) -> PyResult<NativePlan> {
    let recv = recv_policy(py, recv)?;
    let registry = registry_with(py, passes)?;
    detached(py, || {
        let (config, cut) = args.request()?.config()?;
        let compiled = compile(&registry, expression, &config, recv)?;
        Ok(NativePlan {
            compiled,
            title: expression.to_string(),
            cut,
            sharing: config.sharing(),
            costs: None,
        })
    })
}

/// Imports a schedule file as `pipeweave check` does (a PyTorch CSV, compute-only or lowered, or
/// a reference JSON file), costed by `costs` (the CLI's syntax).
#[pyfunction]
#[pyo3(signature = (path, costs=None, recv="early"))]
pub fn check_file(
    py: Python<'_>,
    path: &str,
    costs: Option<String>,
    recv: &str,
) -> PyResult<NativePlan> {
    let recv = recv_policy(py, recv)?;
    let default = costs.is_none();
    let costs = costs.unwrap_or_else(|| DEFAULT_COSTS.to_string());
    detached(py, || {
        let (stage_costs, comm) = parse_costs(&costs)?;
        let (plan, programs) = import_schedule(path, stage_costs, comm)?;
        Ok(NativePlan {
            compiled: compile_imported(plan, programs, recv)?,
            title: path.to_string(),
            cut: None,
            sharing: Sharing::default(),
            costs: Some((costs.clone(), default)),
        })
    })
}
