//! `pipeweave._native`: the Rust side of the Python package. Python's `pipeweave` module wraps
//! these functions in typed objects (`Plan`, `Candidate`, `Profile`); everything here calls the
//! library code the CLI calls (the compile entry [`pipeweave::compile`], the requests of
//! [`pipeweave::request`]), so a plan built from Python has the figures, files and error lines of
//! `pipeweave plan`.
//!
//! Errors become `pipeweave.Error` (bad input) or `pipeweave.PassBug` (a pass's bug) carrying the
//! CLI's message; a panic anywhere below is caught and raised as `pipeweave.Error` naming it an
//! internal error, never unwinding into the interpreter.

mod errors;
mod passes;
mod plan;
mod profile;
mod search;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<plan::NativePlan>()?;
    m.add_function(wrap_pyfunction!(plan::compile_plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::check_file, m)?)?;
    m.add_function(wrap_pyfunction!(search::tune_json, m)?)?;
    m.add_function(wrap_pyfunction!(search::frontier_json, m)?)?;
    m.add_function(wrap_pyfunction!(search::report_fields, m)?)?;
    m.add_function(wrap_pyfunction!(profile::profile_normalize, m)?)?;
    m.add_function(wrap_pyfunction!(passes::builtin_passes, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
