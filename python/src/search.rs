//! `tune_json` and `frontier_json`: `pipeweave tune` and `tune --frontier` from Python, their
//! reports as the JSON the CLI prints with `--format json`.

use crate::errors::detached;
use crate::plan::RequestArgs;
use pyo3::prelude::*;

/// The ranked candidates (`tune --format json`), the best `top` kept.
#[pyfunction]
#[pyo3(signature = (args, top=5))]
pub fn tune_json(py: Python<'_>, args: RequestArgs, top: usize) -> PyResult<String> {
    detached(py, || {
        let mut report = args.request()?.tune(&|_| {})?;
        report.candidates.truncate(top.max(1));
        Ok(serde_json::to_string_pretty(&report).expect("a tune report always serialises"))
    })
}

/// The memory/time frontier (`tune --frontier --format json`); with `svg`, also drawn there.
#[pyfunction]
#[pyo3(signature = (args, svg=None))]
pub fn frontier_json(py: Python<'_>, args: RequestArgs, svg: Option<String>) -> PyResult<String> {
    detached(py, || {
        let found = args.request()?.frontier(&|_| {})?;
        if let Some(path) = &svg {
            let title = format!(
                "memory/time frontier, {} ranks, {} microbatches ({} schedules)",
                args.ranks(),
                args.microbatches(),
                found.expressions
            );
            std::fs::write(path, pipeweave::frontier::frontier_svg(&found, &title)).map_err(
                |source| pipeweave::Error::Io {
                    path: path.clone(),
                    source,
                },
            )?;
        }
        Ok(serde_json::to_string_pretty(&found).expect("a frontier always serialises"))
    })
}

/// The fields of a report kind (`plan`, `candidate` or `frontier_point`): `(name, Python type)`
/// each, from the Rust definitions ([`pipeweave::report_fields`]); `Plan`, `Candidate` and
/// `FrontierPoint` and their type stub are held against it.
#[pyfunction]
pub fn report_fields(py: Python<'_>, kind: &str) -> PyResult<Vec<(&'static str, String)>> {
    use pipeweave::report_fields::{candidate_fields, frontier_point_fields, plan_report_fields};
    let fields = match kind {
        "plan" => plan_report_fields(),
        "candidate" => candidate_fields(),
        "frontier_point" => frontier_point_fields(),
        other => {
            return Err(crate::errors::bad_input(
                py,
                format!("report_fields(): `{other}` is not a report kind: plan, candidate or frontier_point"),
            ))
        }
    };
    Ok(fields
        .into_iter()
        .map(|f| (f.name, f.python_type))
        .collect())
}
