//! `--profile FILE.json`, `--layers-per-stage a,b,...` and memory limits that may be bytes
//! (`--memory-limit 2GiB`): the options that cost a schedule from a measured profile.

use crate::error::Error;
use crate::memory_limit::MemoryLimit;
use crate::profile_costing::ProfileOptions;
use crate::request::ProfileSource;
use clap::Args;
use pipeweave_core::{parse_bytes, parse_number, NumberError};

/// Measured costs instead of typed ones (`plan`, `run`, `tune`).
#[derive(Clone, Debug, Args, Default)]
pub struct ProfileArgs {
    /// Measured layer costs (`train_gpt --profile FILE.json`, or any model's layers in the
    /// `pipeweave-profile` format): each rank's share costs the sum of its layers (seconds),
    /// comm is one activation's send, memory is counted in the heaviest share's activations of
    /// one microbatch (limits may then be given in bytes).
    /// Replaces `--costs` and `--activation-memory`.
    #[arg(long, value_name = "FILE.json")]
    pub profile: Option<String>,
    /// With --profile: blocks (the profile's free layers) per rank's share, in order (layers
    /// placed first, e.g. the embedding, on the first, those placed last, e.g. the head, on the
    /// last); default as even as the count allows (as `train_gpt` cuts).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "A,B,...",
        requires = "profile"
    )]
    pub layers_per_stage: Option<Vec<usize>>,
    /// With --profile: tokens per sequence of each microbatch (variable lengths), priced by the
    /// profile's per-token model: one cost per microbatch.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "T1,T2,...",
        requires = "profile"
    )]
    pub microbatch_tokens: Option<Vec<usize>>,
    /// With --profile: the cores the ranks share, where a CPU run has more ranks than cores
    /// (each rank computes with the profile's threads per rank); busy ranks beyond them
    /// time-share the cores. Default: every rank has its own.
    #[arg(long, value_name = "N", requires = "profile")]
    pub cores: Option<u32>,
}

impl ProfileArgs {
    /// Where a request's profile comes from: `--profile`'s file, or none.
    pub fn source(&self) -> ProfileSource {
        match &self.profile {
            Some(path) => ProfileSource::File(path.clone()),
            None => ProfileSource::None,
        }
    }

    /// The typed options: the cut, the tokens and the cores.
    pub fn options(&self) -> ProfileOptions {
        ProfileOptions {
            layers_per_stage: self.layers_per_stage.clone(),
            microbatch_tokens: self.microbatch_tokens.clone(),
            cores: self.cores,
        }
    }
}

/// Reads a memory limit as written: a plain number in the plan's memory units, or bytes with
/// a unit (`2GiB`, `512MiB`, `1.5GB`), which a profile's cut converts to units.
pub fn read_memory_limit(text: &str) -> Result<MemoryLimit, Error> {
    let bad = |message: String| Error::Option {
        option: "--memory-limit",
        message,
    };
    let must_be_positive = || bad(format!("{text} must be > 0"));
    match parse_bytes(text) {
        None => {
            let units = parse_number(text).map_err(|e| match e {
                NumberError::NotANumber => {
                    bad(format!("`{text}` is neither a number nor bytes like 2GiB"))
                }
                other => bad(other.describe(text)),
            })?;
            MemoryLimit::units(units).map_err(|_| must_be_positive())
        }
        Some(bytes) => {
            let bytes = bytes.map_err(bad)?;
            MemoryLimit::bytes(bytes, text).map_err(|_| must_be_positive())
        }
    }
}

/// A memory limit as written (or none) in units: bytes need the cut's `bytes_per_unit`.
pub fn parse_memory_limit(
    text: Option<&str>,
    bytes_per_unit: Option<f64>,
) -> Result<Option<f64>, Error> {
    text.map(|text| read_memory_limit(text)?.in_units(bytes_per_unit))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_units_or_bytes_with_a_profile() {
        assert_eq!(parse_memory_limit(None, None).unwrap(), None);
        assert_eq!(parse_memory_limit(Some("4"), None).unwrap(), Some(4.0));
        assert_eq!(
            parse_memory_limit(Some("2KiB"), Some(512.0)).unwrap(),
            Some(4.0)
        );
        let err = parse_memory_limit(Some("2GiB"), None).unwrap_err();
        assert!(err.to_string().contains("needs a profile"), "{err}");
        assert!(parse_memory_limit(Some("0"), None).is_err());
        assert!(parse_memory_limit(Some("lots"), None).is_err());
    }
}
