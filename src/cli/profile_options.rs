//! `--profile FILE.json`, `--layers-per-stage a,b,...` and memory limits that may be bytes
//! (`--memory-limit 2GiB`): the options that cost a schedule from a measured profile.

use crate::config::PipelineConfig;
use crate::error::Error;
use crate::request::ProfileSource;
use clap::Args;
use pipeweave_core::{parse_bytes, parse_number, CutCosts, NumberError, Profile};

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

    /// The profile, when one is given.
    pub fn read(&self) -> Result<Option<Profile>, Error> {
        let Some(path) = &self.profile else {
            return Ok(None);
        };
        let text = crate::files::read_text(path)?;
        Profile::from_json(&text)
            .map(Some)
            .map_err(|e| Error::Json {
                path: path.clone(),
                message: e.to_string(),
            })
    }

    /// `config` costed from the profile under the given (or even) cut; `config` unchanged and
    /// no cut without a profile.
    pub fn apply(
        &self,
        config: PipelineConfig,
    ) -> Result<(PipelineConfig, Option<CutCosts>), Error> {
        match self.read()? {
            None => Ok((config, None)),
            Some(profile) => {
                let (config, cut) = self.costed(config, &profile)?;
                Ok((config, Some(cut)))
            }
        }
    }

    /// `config` costed from `profile`: `--microbatch-tokens` priced by its per-token model,
    /// then the given (or even) cut's costs and memory, on `--cores` shared cores.
    pub fn costed(
        &self,
        config: PipelineConfig,
        profile: &Profile,
    ) -> Result<(PipelineConfig, CutCosts), Error> {
        let (config, cut) = self
            .with_tokens(config, profile)?
            .with_profile(profile, self.layers_per_stage.as_deref())?;
        Ok((self.with_cores(config, profile)?, cut))
    }

    /// `config` on `--cores` cores shared by ranks that each compute with the profile's threads
    /// ([`PipelineConfig::with_shared_cores`]); unchanged without the option.
    pub fn with_cores(
        &self,
        config: PipelineConfig,
        profile: &Profile,
    ) -> Result<PipelineConfig, Error> {
        let slots = self
            .cores
            .map(|cores| f64::from(cores) / profile.threads_per_rank.max(1) as f64);
        config.with_shared_cores(slots)
    }

    /// `config` with one cost factor per microbatch from `--microbatch-tokens` and the profile's
    /// per-token model ([`Profile::length_scale`]); unchanged without the option.
    pub fn with_tokens(
        &self,
        config: PipelineConfig,
        profile: &Profile,
    ) -> Result<PipelineConfig, Error> {
        let Some(tokens) = &self.microbatch_tokens else {
            return Ok(config);
        };
        let Some(seq_len) = profile.seq_len() else {
            return Err(Error::Option {
                option: "--microbatch-tokens",
                message: "the profile's model gives no seq_len (the tokens per sequence its \
                          layers were measured at), which pricing microbatches by their tokens \
                          needs"
                    .to_string(),
            });
        };
        if let Some(&t) = tokens.iter().find(|&&t| t == 0 || t > seq_len) {
            return Err(Error::Option {
                option: "--microbatch-tokens",
                message: format!(
                    "{t} tokens: a microbatch's sequences hold 1 to {seq_len} tokens (the profile's length)"
                ),
            });
        }
        if tokens.len() != config.microbatches() as usize {
            return Err(Error::Option {
                option: "--microbatch-tokens",
                message: format!(
                    "{} counts for {} microbatches: give one per microbatch",
                    tokens.len(),
                    config.microbatches()
                ),
            });
        }
        let scales = tokens
            .iter()
            .map(|&t| profile.length_scale(t))
            .collect::<Result<Vec<f64>, _>>()?;
        config.with_microbatch_scales(scales)
    }
}

/// A memory limit: a plain number in the plan's memory units, or bytes with a unit (`2GiB`,
/// `512MiB`, `1.5GB`) when a profile says how many bytes a unit is.
pub fn parse_memory_limit(
    text: Option<&str>,
    bytes_per_unit: Option<f64>,
) -> Result<Option<f64>, Error> {
    let Some(text) = text else {
        return Ok(None);
    };
    let bad = |message: String| Error::Option {
        option: "--memory-limit",
        message,
    };
    let units = match parse_bytes(text) {
        None => parse_number(text).map_err(|e| match e {
            NumberError::NotANumber => {
                bad(format!("`{text}` is neither a number nor bytes like 2GiB"))
            }
            other => bad(other.describe(text)),
        })?,
        Some(bytes) => {
            let bytes = bytes.map_err(bad)?;
            let per_unit = bytes_per_unit.ok_or_else(|| {
                bad(format!(
                    "`{text}` is bytes; a limit in bytes needs a profile (`--profile`; \
                     train_gpt's `--cost-profile`), which says how many bytes one microbatch's \
                     activations take"
                ))
            })?;
            bytes / per_unit
        }
    };
    if !(units.is_finite() && units > 0.0) {
        return Err(bad(format!("{text} must be > 0")));
    }
    Ok(Some(units))
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
