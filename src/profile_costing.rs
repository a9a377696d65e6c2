//! How a measured profile costs a configuration: the cut (blocks per rank's share), the
//! microbatches' tokens priced by the profile's per-token model, and the cores the ranks share.
//! The CLI's `--layers-per-stage`, `--microbatch-tokens` and `--cores` and Python's keyword
//! arguments of the same names are read into [`ProfileOptions`]; the library decides from it.

use crate::config::PipelineConfig;
use crate::error::Error;
use pipeweave_core::{CutCosts, Profile};

/// The typed options that say how a profile costs a configuration (every one optional).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileOptions {
    /// Blocks (the profile's free layers) per rank's share, in order; `None`: as even as the
    /// count allows (or, for `tune`, every candidate cut).
    pub layers_per_stage: Option<Vec<usize>>,
    /// Tokens per sequence of each microbatch (variable lengths): one cost factor each.
    pub microbatch_tokens: Option<Vec<usize>>,
    /// The cores the ranks share (a CPU run with more ranks than cores); `None`: one per rank.
    pub cores: Option<u32>,
}

/// Reads a profile file (`pipeweave-profile` JSON).
pub fn read_profile(path: &str) -> Result<Profile, Error> {
    let text = crate::files::read_text(path)?;
    Profile::from_json(&text).map_err(|e| Error::Json {
        path: path.to_string(),
        message: e.to_string(),
    })
}

impl ProfileOptions {
    /// `config` costed from `profile`: the microbatches' tokens priced by its per-token model,
    /// then the given (or even) cut's costs and memory, on the shared cores.
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

    /// `config` on `cores` cores shared by ranks that each compute with the profile's threads
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

    /// `config` with one cost factor per microbatch from the microbatches' tokens and the
    /// profile's per-token model ([`Profile::length_scale`]); unchanged without them.
    pub fn with_tokens(
        &self,
        config: PipelineConfig,
        profile: &Profile,
    ) -> Result<PipelineConfig, Error> {
        let Some(tokens) = &self.microbatch_tokens else {
            return Ok(config);
        };
        let bad = |message: String| Error::Option {
            option: "--microbatch-tokens",
            message,
        };
        let Some(seq_len) = profile.seq_len() else {
            return Err(bad(
                "the profile's model gives no seq_len (the tokens per sequence \
                            its layers were measured at), which pricing microbatches by their \
                            tokens needs"
                    .to_string(),
            ));
        };
        if let Some(&t) = tokens.iter().find(|&&t| t == 0 || t > seq_len) {
            return Err(bad(format!(
                "{t} tokens: a microbatch's sequences hold 1 to {seq_len} tokens (the profile's length)"
            )));
        }
        if tokens.len() != config.microbatches() as usize {
            return Err(bad(format!(
                "{} counts for {} microbatches: give one per microbatch",
                tokens.len(),
                config.microbatches()
            )));
        }
        let scales = tokens
            .iter()
            .map(|&t| profile.length_scale(t))
            .collect::<Result<Vec<f64>, _>>()?;
        config.with_microbatch_scales(scales)
    }
}
