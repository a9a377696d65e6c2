//! A per-rank memory limit as a value: a number of the plan's memory units, or bytes that a
//! profile's cut converts to units. The text syntax (`8`, `2GiB`) is the front ends' to read
//! (the CLI's `--memory-limit`, Python's `memory_limit=`); the library takes this value.

use crate::error::Error;
use pipeweave_core::show_number;

/// A memory limit as given: units, or bytes (then a profile must say how many bytes a unit is).
#[derive(Clone, Debug, PartialEq)]
pub enum MemoryLimit {
    /// A limit in the plan's memory units (one microbatch's activations on the heaviest share).
    Units(f64),
    /// A limit in bytes, with the text the user wrote it as (for the errors that name it).
    Bytes {
        /// The limit in bytes.
        bytes: f64,
        /// As written, e.g. `2GiB`.
        written: String,
    },
}

impl MemoryLimit {
    /// A limit of `units` (finite and above 0).
    pub fn units(units: f64) -> Result<MemoryLimit, Error> {
        positive(&show_number(units), units)?;
        Ok(MemoryLimit::Units(units))
    }

    /// A limit of `bytes` (finite and above 0), written as `written`.
    pub fn bytes(bytes: f64, written: impl Into<String>) -> Result<MemoryLimit, Error> {
        let written = written.into();
        positive(&written, bytes)?;
        Ok(MemoryLimit::Bytes { bytes, written })
    }

    /// The limit in units: bytes divided by `bytes_per_unit`, which only a profile's cut gives.
    pub fn in_units(&self, bytes_per_unit: Option<f64>) -> Result<f64, Error> {
        match self {
            MemoryLimit::Units(units) => Ok(*units),
            MemoryLimit::Bytes { bytes, written } => {
                let per_unit = bytes_per_unit.ok_or_else(|| {
                    bad(format!(
                        "`{written}` is bytes; a limit in bytes needs a profile (`--profile`; \
                         train_gpt's `--cost-profile`), which says how many bytes one \
                         microbatch's activations take"
                    ))
                })?;
                let units = bytes / per_unit;
                positive(written, units)?;
                Ok(units)
            }
        }
    }
}

/// `value` (written `written`) as a limit: finite and above 0.
fn positive(written: &str, value: f64) -> Result<(), Error> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(bad(format!("{written} must be > 0")))
    }
}

fn bad(message: String) -> Error {
    Error::Option {
        option: "--memory-limit",
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_pass_through_and_bytes_need_a_profile() {
        assert_eq!(
            MemoryLimit::units(4.0).unwrap().in_units(None).unwrap(),
            4.0
        );
        let two_kib = MemoryLimit::bytes(2048.0, "2KiB").unwrap();
        assert_eq!(two_kib.in_units(Some(512.0)).unwrap(), 4.0);
        let err = two_kib.in_units(None).unwrap_err().to_string();
        assert!(
            err.contains("`2KiB` is bytes") && err.contains("needs a profile"),
            "{err}"
        );
    }

    #[test]
    fn limits_must_be_finite_and_positive() {
        for bad in [0.0, -1.0, f64::INFINITY, f64::NAN] {
            let err = MemoryLimit::units(bad).unwrap_err().to_string();
            assert!(err.contains("must be > 0"), "{err}");
        }
        assert!(MemoryLimit::bytes(0.0, "0GiB").is_err());
        // A byte count a tiny unit turns into infinitely many units.
        let huge = MemoryLimit::bytes(1e300, "1e300B").unwrap();
        assert!(huge.in_units(Some(1e-300)).is_err());
    }
}
