//! Measured layer costs: the profile a producer writes (`train_gpt --profile FILE.json` for our
//! GPT; any tool that times a model's layers, e.g. PyTorch's) and `pipeweave plan`, `run` and
//! `tune --profile` read. This module reads and writes the file; its layers become a
//! [`LayerTable`] ([`Profile::table`]), the IR's plain data, where the arithmetic of a cut lives
//! (the methods here that cost a cut hand it the table).
//!
//! A profile lists the model's layers in order, each with its median forward (F),
//! input-gradient (I) and weight-gradient (W) seconds for one microbatch (and, where measured,
//! its full backward's, `backward`: a runtime's split may cost more or less than it), the activation bytes
//! one microbatch's forward leaves (`activation_bytes`) and those its input gradient leaves for W
//! (`weight_grad_bytes`, which may be the larger: W needs each product's output gradient), and
//! where the layer may go (`placement`): `first` layers (an input embedding) always go on the
//! first stage, `last` layers (an output head with the loss) on the last, `any` layers (the
//! default; a transformer's blocks, or every layer of a plain list) wherever the cut puts them.
//! The `first` layers open the list and the `last` ones end it. It also gives the seconds to send
//! one activation between ranks, and, where the producer measured them for a runtime (`runtime`,
//! e.g. `pytorch`), the seconds that runtime adds to every compute action of a stage
//! (`action_seconds`: each stage's F, I, W and B pay it once). A cut (`layers_per_stage`: the `any` layers per stage, in order)
//! then gives each stage the sums of its layers: [`Profile::cut`] ([`LayerTable::cut`]); a stage
//! that holds no pinned layer needs at least one of its own. Each layer's times at half the sequence length
//! (`half_length`) give the per-token model of variable-length microbatches:
//! [`Profile::length_scale`].
//!
//! The model is described by its producer: `name`, `seq_len` (tokens per sequence, which the
//! per-token model needs), `microbatch_size` and `dtype`, each optional (`null`), and any other
//! keys, kept as they are ([`ProfiledModel::extra`]: what a producer checks a profile against).
//!
//! The file (format `pipeweave-profile/2`, JSON):
//!
//! ```json
//! {"format": "pipeweave-profile/2",
//!  "model": {"name": "toy", "seq_len": 128, "microbatch_size": 4, "dtype": "f32", "width": 512},
//!  "threads_per_rank": 1, "repeats": 5, "calibrated": false,
//!  "layers": [{"name": "input", "placement": "first", "forward": 0.001, "input_grad": 0.0,
//!              "weight_grad": 0.002, "activation_bytes": 8192, "weight_grad_bytes": 1048576,
//!              "half_length": {"forward": 0.0005, "input_grad": 0.0, "weight_grad": 0.001}},
//!             {"name": "layer.0", "placement": "any", ...},
//!             ...,
//!             {"name": "output", "placement": "last", ...}],
//!  "send": {"bytes": 1048576, "seconds": 0.0002},
//!  "runtime": "pytorch", "action_seconds": 0.00003}
//! ```
//!
//! Files of the former format `pipeweave-profile/1` are read too and converted
//! ([`Profile::from_json`]): its layers' `kind` gives the placement (the embedding first, the
//! head last, a block anywhere) and its model's other keys are kept in `extra`. Profiles are
//! always written in the current format.

mod bytes;
#[cfg(test)]
mod tests;
mod v1;

pub use crate::ir::layers::{CutCosts, LayerPlacement, PhaseTimes};
pub use bytes::parse_bytes;

use crate::error::CoreError;
use crate::ir::blocks::{even_cut, PinnedEnds};
use crate::ir::layers::{pinned_ends, LayerCostsSpec, LayerTable};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::ops::Range;

/// The format tag a profile file carries (and every profile written carries).
pub const PROFILE_FORMAT: &str = "pipeweave-profile/2";

/// The former format's tag: still read, converted to the current one.
pub const PROFILE_FORMAT_V1: &str = "pipeweave-profile/1";

/// The model a profile was measured on, as its producer describes it: every field optional,
/// the keys besides the known ones kept as they are.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProfiledModel {
    /// What the model is (`toy`), where the producer says.
    #[serde(default)]
    pub name: Option<String>,
    /// Tokens per sequence the layers were measured at (the per-token model needs it).
    #[serde(default)]
    pub seq_len: Option<usize>,
    /// Sequences per microbatch.
    #[serde(default)]
    pub microbatch_size: Option<usize>,
    /// Element type (`f32`, `f64`).
    #[serde(default)]
    pub dtype: Option<String>,
    /// Every other key of the model's description, as the producer wrote it.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One layer's measured costs for one microbatch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// The producer's name for it (`input`, `layer.K`, `output`).
    pub name: String,
    /// Where it may go (`any` when the file does not say).
    #[serde(default)]
    pub placement: LayerPlacement,
    /// Median forward seconds.
    pub forward: f64,
    /// Median input-gradient seconds.
    pub input_grad: f64,
    /// Median weight-gradient seconds.
    pub weight_grad: f64,
    /// Median full (fused) backward seconds, where measured (else the split's I + W): a runtime
    /// may run its split dearer or cheaper than the full backward, and a schedule that does not
    /// split pays this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backward: Option<f64>,
    /// Bytes one microbatch's forward leaves for the backward.
    pub activation_bytes: u64,
    /// Bytes its input-gradient backward leaves for the weight gradient (each product's input
    /// and output gradient): more than `activation_bytes` where the output gradients outweigh
    /// what the input gradient freed.
    pub weight_grad_bytes: u64,
    /// The same layer's median seconds at half the sequence length (the per-token model:
    /// [`Profile::length_scale`]); absent in profiles that measured one length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_length: Option<PhaseTimes>,
}

/// The time to send one activation (one microbatch's hidden states) between ranks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SendProfile {
    /// Bytes of the activation sent.
    pub bytes: u64,
    /// Median seconds from send to receipt.
    pub seconds: f64,
}

/// A measured profile (see the module docs for the file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// [`PROFILE_FORMAT`].
    pub format: String,
    /// The model measured.
    #[serde(default)]
    pub model: ProfiledModel,
    /// Compute threads of the measuring rank.
    pub threads_per_rank: usize,
    /// Measurements per figure (the figures are their medians).
    pub repeats: usize,
    /// Whether the layers' times were scaled to the op times a training run measured at each
    /// stage (each layer alone gives the split within a stage; the run gives the stage's time
    /// with the pipeline's memory traffic and neighbours).
    #[serde(default)]
    pub calibrated: bool,
    /// The layers in order: those placed first, the free ones, those placed last.
    pub layers: Vec<LayerProfile>,
    /// One activation's send.
    pub send: SendProfile,
    /// The runtime the layers were measured for, where the producer says (`pytorch`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Seconds the runtime adds to every compute action of a stage (the call of F, I, W or B and
    /// its bookkeeping) beside the layers' own, where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_seconds: Option<f64>,
}

fn bad(reason: impl Into<String>) -> CoreError {
    CoreError::InvalidModel {
        model: "profile",
        stage: "all".to_string(),
        reason: reason.into(),
    }
}

impl Profile {
    /// Parses and checks a profile's JSON text: the current format, or the former
    /// ([`PROFILE_FORMAT_V1`]) converted to it.
    pub fn from_json(text: &str) -> Result<Profile, CoreError> {
        let document: Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not a profile: {e}")))?;
        let profile = match document.get("format").and_then(Value::as_str) {
            Some(PROFILE_FORMAT) => serde_json::from_str::<Profile>(text)
                .map_err(|e| bad(format!("not a {PROFILE_FORMAT} profile: {e}")))?,
            Some(PROFILE_FORMAT_V1) => v1::from_v1(document)?,
            Some(other) => {
                return Err(bad(format!(
                    "format `{other}` is not `{PROFILE_FORMAT}` (nor the former \
                     `{PROFILE_FORMAT_V1}`, which is converted)"
                )))
            }
            None => {
                return Err(bad(format!(
                    "not a profile: no `format` tag (`{PROFILE_FORMAT}`)"
                )))
            }
        };
        profile.validate()?;
        Ok(profile)
    }

    /// The profile as pretty JSON (always the current format).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a profile of numbers and strings serialises")
    }

    /// Checks the format tag, the model's sizes (positive where given) and the layers and send
    /// as a [`LayerTable`] takes them ([`LayerTable::new`]: at least one layer, those placed
    /// first opening the list and those placed last ending it, every figure finite and
    /// non-negative).
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.format != PROFILE_FORMAT {
            return Err(bad(format!(
                "format `{}` is not `{PROFILE_FORMAT}`",
                self.format
            )));
        }
        for (what, size) in [
            ("seq_len", self.model.seq_len),
            ("microbatch_size", self.model.microbatch_size),
        ] {
            if size == Some(0) {
                return Err(bad(format!("model {what} = 0 must be > 0")));
            }
        }
        self.table().map(|_| ())
    }

    /// The layers and the send as the IR's plain data, checked ([`LayerTable::new`]).
    pub fn table(&self) -> Result<LayerTable, CoreError> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                LayerCostsSpec::builder()
                    .name(l.name.clone())
                    .placement(l.placement)
                    .forward(l.forward)
                    .input_grad(l.input_grad)
                    .weight_grad(l.weight_grad)
                    .backward_opt(l.backward)
                    .activation_bytes(l.activation_bytes)
                    .weight_grad_bytes(l.weight_grad_bytes)
                    .half_length_opt(l.half_length)
                    .build()
            })
            .collect();
        LayerTable::new(layers, self.send.seconds)?
            .with_action_seconds(self.action_seconds.unwrap_or(0.0))
    }

    /// The layers a cut places (`placement` `any`): what `layers_per_stage` counts.
    pub fn free_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.placement == LayerPlacement::Any)
            .count()
    }

    /// Tokens per sequence the layers were measured at, where the model says.
    pub fn seq_len(&self) -> Option<usize> {
        self.model.seq_len
    }

    /// What the layers placed first and last pin to the first and the last stage, named for
    /// messages.
    pub fn pinned(&self) -> PinnedEnds {
        pinned_ends(self.layers.iter().map(|l| (l.name.as_str(), l.placement)))
    }

    /// The cost of one microbatch whose sequences have `tokens` tokens, relative to one at the
    /// profiled length ([`LayerTable::length_scale`] at `tokens / seq_len`: each phase of each
    /// layer fitted from its half-length time, linear in the tokens for layers measured at one
    /// length). An error where the model gives no `seq_len` or the layers are not valid.
    pub fn length_scale(&self, tokens: usize) -> Result<f64, CoreError> {
        let seq_len = self.seq_len().ok_or_else(|| {
            bad(
                "the profile's model gives no seq_len: pricing microbatches by their tokens needs \
                 the length the layers were measured at",
            )
        })?;
        let x = tokens as f64 / seq_len.max(1) as f64;
        Ok(self.table()?.length_scale(x))
    }

    /// The even cut of the free layers into `stages` stages (stage `k` holds free layers
    /// `⌊kL/S⌋ .. ⌊(k+1)L/S⌋`, as the trainer cuts by default; mirrored where only the last
    /// stage holds pinned layers: [`even_cut`]).
    pub fn even_cut(&self, stages: usize) -> Vec<usize> {
        even_cut(self.free_layers(), stages, &self.pinned())
    }

    /// The indices into [`Profile::layers`] of each stage's layers under `layers_per_stage`
    /// ([`LayerTable::stage_layers`]). An error where the counts are no cut or the layers are
    /// not valid.
    pub fn stage_layers(&self, layers_per_stage: &[usize]) -> Result<Vec<Range<usize>>, CoreError> {
        self.table()?.stage_layers(layers_per_stage)
    }

    /// Each stage's summed costs and memory under `layers_per_stage` ([`LayerTable::cut`]: one
    /// count of free layers per stage, summing to the free layers; a stage without a pinned
    /// layer needs one). An error where the counts are no cut or the layers are not valid.
    pub fn cut(&self, layers_per_stage: &[usize]) -> Result<CutCosts, CoreError> {
        self.table()?.cut(layers_per_stage)
    }
}
