//! From the library's errors to Python's exceptions: `pipeweave.Error` (a `ValueError`) for what
//! the user can fix, `pipeweave.PassBug` for a pass that broke a plan, each with the line the
//! CLI prints (without its `error: ` tag); panics caught at the boundary.

use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The Python exception class `pipeweave._errors.<name>`.
fn exception(py: Python<'_>, name: &str, message: String) -> PyErr {
    match py
        .import("pipeweave._errors")
        .and_then(|m| m.getattr(name))
        .and_then(|class| class.call1((message,)))
    {
        Ok(instance) => PyErr::from_value(instance),
        Err(e) => e,
    }
}

/// `pipeweave.Error` with `message`.
pub fn bad_input(py: Python<'_>, message: impl Into<String>) -> PyErr {
    exception(py, "Error", message.into())
}

/// The exception of a library error: `PassBug` where a pass is to blame, `Error` otherwise; the
/// message is the CLI's line.
pub fn to_py(py: Python<'_>, error: &pipeweave::Error) -> PyErr {
    let line = error.to_string().replace('\n', " ");
    let is_bug = matches!(error, pipeweave::Error::Transform(e) if e.is_pass_bug());
    exception(py, if is_bug { "PassBug" } else { "Error" }, line)
}

/// Runs `work` without the GIL (other Python threads go on; a pass written in Python takes the
/// GIL back for its call), turning its error and any panic into Python exceptions.
pub fn detached<T: Send>(
    py: Python<'_>,
    work: impl FnOnce() -> Result<T, pipeweave::Error> + Send,
) -> PyResult<T> {
    let result = py.detach(|| catch_unwind(AssertUnwindSafe(work)));
    match result {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(to_py(py, &error)),
        Err(panic) => Err(internal(py, &panic)),
    }
}

/// `pipeweave.Error` for a panic caught at the boundary (a bug in pipeweave, reported as such).
pub fn internal(py: Python<'_>, panic: &Box<dyn std::any::Any + Send>) -> PyErr {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    bad_input(
        py,
        format!("internal error (a bug in pipeweave, please report it): {what}"),
    )
}
