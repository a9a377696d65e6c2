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
