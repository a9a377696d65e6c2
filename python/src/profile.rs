//! `profile_normalize`: a profile's JSON checked by the library and written back in the current
//! format (older formats converted), the one validation `pipeweave.Profile` relies on.

use crate::errors::detached;
use pipeweave_core::Profile;
use pyo3::prelude::*;

/// The profile `text` holds, checked, as the JSON the library writes.
#[pyfunction]
pub fn profile_normalize(py: Python<'_>, text: &str) -> PyResult<String> {
    detached(py, || Ok(Profile::from_json(text)?.to_json()))
}
