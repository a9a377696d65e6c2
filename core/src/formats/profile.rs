//! Measured layer costs: the profile a producer writes (`train_gpt --profile FILE.json` for our
//! GPT; any tool that times a model's layers, e.g. PyTorch's) and `pipeweave plan`, `run` and
//! `tune --profile` read, and what a cut of the model into stages costs by it.
//!
//! A profile lists the model's layers in order, each with its median forward (F),
//! input-gradient (I) and weight-gradient (W) seconds for one microbatch, the activation bytes
//! one microbatch's forward leaves (`activation_bytes`) and those its input gradient leaves for W
//! (`weight_grad_bytes`, which may be the larger: W needs each product's output gradient), and
//! where the layer may go (`placement`): `first` layers (an input embedding) always go on the
//! first stage, `last` layers (an output head with the loss) on the last, `any` layers (the
//! default; a transformer's blocks, or every layer of a plain list) wherever the cut puts them.
//! The `first` layers open the list and the `last` ones end it. It also gives the seconds to send
//! one activation between ranks. A cut (`layers_per_stage`: the `any` layers per stage, in order)
//! then gives each stage the sums of its layers: [`Profile::cut`]; a stage that holds no pinned
//! layer needs at least one of its own. Each layer's times at half the sequence length
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
//!  "send": {"bytes": 1048576, "seconds": 0.0002}}
//! ```
//!
//! Files of the former format `pipeweave-profile/1` are read too and converted
//! ([`Profile::from_json`]): its layers' `kind` gives the placement (the embedding first, the
//! head last, a block anywhere) and its model's other keys are kept in `extra`. Profiles are
//! always written in the current format.

use crate::error::CoreError;
use crate::ir::blocks::{cut_violation, even_cut, spread_shares, PinnedEnds};
use crate::ir::cost::{LayoutFigures, StageCosts, StageCostsSpec, StageFigures};
use crate::ir::memory::{StageMemory, StageMemorySpec};
use crate::ir::problem::Problem;
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

/// Where a layer may go when the model is cut into stages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerPlacement {
    /// On the first stage (the list's first layers, e.g. an input embedding).
    First,
    /// On the last stage (the list's last layers, e.g. an output head with the loss).
    Last,
    /// Wherever the cut puts it (a free layer: `layers_per_stage` counts these).
    #[default]
    Any,
}

impl LayerPlacement {
    /// The placement as the file writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            LayerPlacement::First => "first",
            LayerPlacement::Last => "last",
            LayerPlacement::Any => "any",
        }
    }

    /// Where in the list the placement goes: the `first` layers, then the free ones, then the
    /// `last` ones.
    fn rank(self) -> u8 {
        match self {
            LayerPlacement::First => 0,
            LayerPlacement::Any => 1,
            LayerPlacement::Last => 2,
        }
    }
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

/// A layer's median seconds per phase.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseTimes {
    /// Forward.
    pub forward: f64,
    /// Input gradient.
    pub input_grad: f64,
    /// Weight gradient.
    pub weight_grad: f64,
}

/// The share of a phase's cost that grows linearly with the tokens, from its time at the full
/// length `full` and at half of it `half`: with `cost(x) = full · (a·x + (1 - a)·x²)` at
/// `x = tokens / seq_len`, `half / full = a/2 + (1 - a)/4`, so `a = 4·half/full - 1` (clamped
/// to 0..=1: measurement noise can put it outside).
fn linear_share(full: f64, half: f64) -> f64 {
    if full > 0.0 {
        (4.0 * half / full - 1.0).clamp(0.0, 1.0)
    } else {
        1.0
    }
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
}

/// Each stage's costs and activation memory under a cut, from a [`Profile`].
#[derive(Clone, Debug, PartialEq)]
pub struct CutCosts {
    /// Free layers per stage.
    pub layers_per_stage: Vec<usize>,
    /// Seconds per stage.
    pub costs: Vec<StageCosts>,
    /// The seconds of one activation's send.
    pub comm: f64,
    /// Activation memory per stage, in units of `bytes_per_unit` bytes: `total` is the larger
    /// of what the stage's forward and its input gradient leave, `weight_grad` what the input
    /// gradient leaves.
    pub memory: Vec<StageMemory>,
    /// Bytes of one memory unit: the heaviest stage's activations of one microbatch, so a
    /// schedule's `memory=N` still counts microbatches (of the heaviest stage).
    pub bytes_per_unit: f64,
}

fn bad(reason: impl Into<String>) -> CoreError {
    CoreError::InvalidModel {
        model: "profile",
        stage: "all".to_string(),
        reason: reason.into(),
    }
}

/// A `pipeweave-profile/1` file as it was: its model a map of numbers and the element type,
/// its layers with a `kind`.
#[derive(Deserialize)]
struct ProfileV1 {
    model: Map<String, Value>,
    threads_per_rank: usize,
    repeats: usize,
    #[serde(default)]
    calibrated: bool,
    layers: Vec<LayerV1>,
    send: SendProfile,
}

#[derive(Deserialize)]
struct LayerV1 {
    name: String,
    kind: KindV1,
    forward: f64,
    input_grad: f64,
    weight_grad: f64,
    activation_bytes: u64,
    weight_grad_bytes: u64,
    #[serde(default)]
    half_length: Option<PhaseTimes>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum KindV1 {
    Embedding,
    Block,
    Head,
}

/// A `pipeweave-profile/1` document in the current format: the embedding placed first, the
/// head last, the blocks anywhere; the model's `seq_len`, `microbatch_size` and `dtype` read,
/// its other keys (the blocks as `layers` and the sizes) kept in `extra` as they are. The v1
/// rules are checked on the way: one embedding, the model's count of blocks, one head.
fn from_v1(document: Value) -> Result<Profile, CoreError> {
    let v1: ProfileV1 = serde_json::from_value(document)
        .map_err(|e| bad(format!("not a {PROFILE_FORMAT_V1} profile: {e}")))?;
    let mut extra = v1.model;
    let count = |extra: &Map<String, Value>, key: &str| -> Result<usize, CoreError> {
        extra
            .get(key)
            .and_then(Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| {
                bad(format!(
                    "not a {PROFILE_FORMAT_V1} profile: its model needs a count `{key}`"
                ))
            })
    };
    let blocks = count(&extra, "layers")?;
    let seq_len = count(&extra, "seq_len")?;
    let microbatch_size = count(&extra, "microbatch_size")?;
    let dtype = match extra.remove("dtype") {
        Some(Value::String(dtype)) => dtype,
        _ => {
            return Err(bad(format!(
                "not a {PROFILE_FORMAT_V1} profile: its model needs a `dtype` string"
            )))
        }
    };
    extra.remove("seq_len");
    extra.remove("microbatch_size");
    if v1.layers.len() != blocks + 2 {
        return Err(bad(format!(
            "{} layers listed; a model of {blocks} blocks needs {} (the embedding, the blocks, \
             the head)",
            v1.layers.len(),
            blocks + 2
        )));
    }
    let mut layers = Vec::with_capacity(v1.layers.len());
    for (i, layer) in v1.layers.into_iter().enumerate() {
        let expected = if i == 0 {
            KindV1::Embedding
        } else if i == blocks + 1 {
            KindV1::Head
        } else {
            KindV1::Block
        };
        if layer.kind != expected {
            return Err(bad(format!(
                "layer {i} (`{}`) is a {:?}; expected a {expected:?} there",
                layer.name, layer.kind
            )));
        }
        let placement = match layer.kind {
            KindV1::Embedding => LayerPlacement::First,
            KindV1::Block => LayerPlacement::Any,
            KindV1::Head => LayerPlacement::Last,
        };
        layers.push(LayerProfile {
            name: layer.name,
            placement,
            forward: layer.forward,
            input_grad: layer.input_grad,
            weight_grad: layer.weight_grad,
            activation_bytes: layer.activation_bytes,
            weight_grad_bytes: layer.weight_grad_bytes,
            half_length: layer.half_length,
        });
    }
    Ok(Profile {
        format: PROFILE_FORMAT.to_string(),
        model: ProfiledModel {
            name: None,
            seq_len: Some(seq_len),
            microbatch_size: Some(microbatch_size),
            dtype: Some(dtype),
            extra,
        },
        threads_per_rank: v1.threads_per_rank,
        repeats: v1.repeats,
        calibrated: v1.calibrated,
        layers,
        send: v1.send,
    })
}

/// What the layers of `placement` are called in a message: one by its name, several by their
/// count.
fn pinned_name(layers: &[LayerProfile], placement: LayerPlacement) -> Option<String> {
    let pinned: Vec<&LayerProfile> = layers.iter().filter(|l| l.placement == placement).collect();
    match pinned.as_slice() {
        [] => None,
        [one] => Some(format!("`{}`", one.name)),
        several => Some(format!(
            "the {} layers placed {}",
            several.len(),
            placement.as_str()
        )),
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
            Some(PROFILE_FORMAT_V1) => from_v1(document)?,
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

    /// Checks the format tag, the layer list (at least one layer; those placed first open it,
    /// those placed last end it), the model's sizes (positive where given) and that every
    /// figure is finite and non-negative.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.format != PROFILE_FORMAT {
            return Err(bad(format!(
                "format `{}` is not `{PROFILE_FORMAT}`",
                self.format
            )));
        }
        if self.layers.is_empty() {
            return Err(bad("no layers listed"));
        }
        for (what, size) in [
            ("seq_len", self.model.seq_len),
            ("microbatch_size", self.model.microbatch_size),
        ] {
            if size == Some(0) {
                return Err(bad(format!("model {what} = 0 must be > 0")));
            }
        }
        let mut previous: Option<(usize, &LayerProfile)> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some((j, before)) = previous {
                if layer.placement.rank() < before.placement.rank() {
                    return Err(bad(format!(
                        "layer {i} (`{}`) is placed `{}` after layer {j} (`{}`) placed `{}`: \
                         the layers placed `first` open the list and those placed `last` end it",
                        layer.name,
                        layer.placement.as_str(),
                        before.name,
                        before.placement.as_str()
                    )));
                }
            }
            if previous.is_none_or(|(_, b)| b.placement != layer.placement) {
                previous = Some((i, layer));
            }
            let half = layer
                .half_length
                .map_or([0.0; 3], |h| [h.forward, h.input_grad, h.weight_grad]);
            for (what, value) in [
                ("forward", layer.forward),
                ("input_grad", layer.input_grad),
                ("weight_grad", layer.weight_grad),
                ("half_length forward", half[0]),
                ("half_length input_grad", half[1]),
                ("half_length weight_grad", half[2]),
            ] {
                if !(value.is_finite() && value >= 0.0) {
                    return Err(bad(format!(
                        "layer `{}`: {what} = {value} must be finite and >= 0",
                        layer.name
                    )));
                }
            }
        }
        if !(self.send.seconds.is_finite() && self.send.seconds >= 0.0) {
            return Err(bad(format!(
                "send seconds = {} must be finite and >= 0",
                self.send.seconds
            )));
        }
        Ok(())
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
        PinnedEnds {
            first: pinned_name(&self.layers, LayerPlacement::First),
            last: pinned_name(&self.layers, LayerPlacement::Last),
        }
    }

    /// The cost of one microbatch whose sequences have `tokens` tokens, relative to one at the
    /// profiled length (all layers, all phases): each phase of each layer costs
    /// `a·x + (1 - a)·x²` of its full-length time at `x = tokens / seq_len`, `a` fitted from its
    /// half-length time (the linear part: matrix products; the quadratic: attention's scores);
    /// linear in the tokens for layers measured at one length. An error where the model gives
    /// no `seq_len`.
    pub fn length_scale(&self, tokens: usize) -> Result<f64, CoreError> {
        let seq_len = self.seq_len().ok_or_else(|| {
            bad(
                "the profile's model gives no seq_len: pricing microbatches by their tokens needs \
                 the length the layers were measured at",
            )
        })?;
        let x = tokens as f64 / seq_len.max(1) as f64;
        let mut full_total = 0.0;
        let mut scaled = 0.0;
        for layer in &self.layers {
            let full = [layer.forward, layer.input_grad, layer.weight_grad];
            let half = layer
                .half_length
                .map(|h| [h.forward, h.input_grad, h.weight_grad]);
            for (k, f) in full.iter().enumerate() {
                let a = half.map_or(1.0, |h| linear_share(*f, h[k]));
                full_total += f;
                scaled += f * (a * x + (1.0 - a) * x * x);
            }
        }
        Ok(if full_total > 0.0 {
            scaled / full_total
        } else {
            x
        })
    }

    /// The even cut of the free layers into `stages` stages (stage `k` holds free layers
    /// `⌊kL/S⌋ .. ⌊(k+1)L/S⌋`, as the trainer cuts by default; mirrored where only the last
    /// stage holds pinned layers: [`even_cut`]).
    pub fn even_cut(&self, stages: usize) -> Vec<usize> {
        even_cut(self.free_layers(), stages, &self.pinned())
    }

    /// The indices into [`Profile::layers`] of each stage's layers under `layers_per_stage`
    /// (free layers per stage): the first stage's begin with those placed first, the last
    /// stage's end with those placed last. An error where the counts are no cut
    /// ([`cut_violation`]).
    pub fn stage_layers(&self, layers_per_stage: &[usize]) -> Result<Vec<Range<usize>>, CoreError> {
        let stages = layers_per_stage.len();
        if stages == 0 {
            return Err(bad("--layers-per-stage needs one count per stage"));
        }
        if let Some(reason) = cut_violation(layers_per_stage, self.free_layers(), &self.pinned()) {
            return Err(bad(reason));
        }
        let mut at = self
            .layers
            .iter()
            .take_while(|l| l.placement == LayerPlacement::First)
            .count();
        let mut ranges = Vec::with_capacity(stages);
        for (k, &count) in layers_per_stage.iter().enumerate() {
            let begin = if k == 0 { 0 } else { at };
            at += count;
            let end = if k + 1 == stages {
                self.layers.len()
            } else {
                at
            };
            ranges.push(begin..end);
        }
        Ok(ranges)
    }

    /// Each stage's summed costs and memory under `layers_per_stage` (one count of free layers
    /// per stage, summing to the free layers; a stage without a pinned layer needs one).
    pub fn cut(&self, layers_per_stage: &[usize]) -> Result<CutCosts, CoreError> {
        let ranges = self.stage_layers(layers_per_stage)?;
        let mut sums = Vec::with_capacity(ranges.len());
        for range in ranges {
            let members = &self.layers[range];
            let f: f64 = members.iter().map(|l| l.forward).sum();
            let i: f64 = members.iter().map(|l| l.input_grad).sum();
            let w: f64 = members.iter().map(|l| l.weight_grad).sum();
            let left: u64 = members.iter().map(|l| l.activation_bytes).sum();
            let held: u64 = members.iter().map(|l| l.weight_grad_bytes).sum();
            // The memory model holds a forward's figure until I and a part of it until W, so
            // where I leaves more than F did, the forward is charged that from its start: a
            // peak is never under-counted (over-counted by the difference only between F and
            // I).
            sums.push((f, i, w, left.max(held), held));
        }
        let heaviest = sums.iter().map(|s| s.3).max().unwrap_or(0).max(1) as f64;
        let costs = sums
            .iter()
            .map(|&(f, i, w, _, _)| {
                StageCostsSpec::builder()
                    .forward(f)
                    .input_grad(i)
                    .weight_grad(w)
                    .build()
                    .validate()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let memory = sums
            .iter()
            .map(|&(_, _, _, total, held)| {
                StageMemorySpec::builder()
                    .total(total as f64 / heaviest)
                    .weight_grad(held as f64 / heaviest)
                    .build()
                    .validate()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CutCosts {
            layers_per_stage: layers_per_stage.to_vec(),
            costs,
            comm: self.send.seconds,
            memory,
            bytes_per_unit: heaviest,
        })
    }
}

/// A profiled model cut by one count of free layers per rank (or evenly), as the figures of any
/// layout a pass builds from it: every stage gets the costs and memory of the layers at its
/// position, as the trainer places them (a rank's count spread over its positions by
/// [`spread_shares`]; without counts, the free layers even over the positions), rather than an even
/// part of its rank's share. Memory is in units of `bytes_per_unit` bytes, the cut's.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfiledLayout {
    profile: Profile,
    shares: Option<Vec<usize>>,
    bytes_per_unit: f64,
}

impl ProfiledLayout {
    /// `profile` cut by `shares` (one count per rank; `None`: even over each layout's
    /// positions), memory counted in units of `bytes_per_unit` bytes (positive).
    pub fn new(profile: Profile, shares: Option<Vec<usize>>, bytes_per_unit: f64) -> Self {
        ProfiledLayout {
            profile,
            shares,
            bytes_per_unit: bytes_per_unit.max(f64::MIN_POSITIVE),
        }
    }

    /// Free layers per position of `problem`'s routes, or `None` where it has no route or a stage
    /// has no rank.
    pub fn positions_of(&self, problem: &Problem) -> Option<Vec<usize>> {
        let route = problem.routes().first()?;
        let owners = route
            .stages()
            .iter()
            .map(|&s| problem.rank_of(s).map(|r| r.index()))
            .collect::<Option<Vec<usize>>>()?;
        Some(match &self.shares {
            Some(shares) if shares.len() == problem.ranks() as usize => {
                spread_shares(&owners, shares)
            }
            _ => self.profile.even_cut(owners.len()),
        })
    }
}

impl LayoutFigures for ProfiledLayout {
    fn stages_of(&self, problem: &Problem) -> Result<Option<StageFigures>, CoreError> {
        let Some(counts) = self.positions_of(problem) else {
            return Ok(None);
        };
        let shown = |c: &[usize]| c.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let (free, pinned) = (self.profile.free_layers(), self.profile.pinned());
        if let Some(reason) = cut_violation(&counts, free, &pinned) {
            return Err(bad(match &self.shares {
                Some(shares) => format!(
                    "--layers-per-stage {} (one count per rank) spread over the {} positions \
                     of this layout is {}: {reason}",
                    shown(shares),
                    counts.len(),
                    shown(&counts)
                ),
                None => reason,
            }));
        }
        let cut = self.profile.cut(&counts)?;
        let mut position = vec![None; problem.stages() as usize];
        for route in problem.routes() {
            if route.stages().len() != counts.len() {
                return Ok(None);
            }
            for (k, stage) in route.stages().iter().enumerate() {
                if let Some(slot) = position.get_mut(stage.index()) {
                    *slot = Some(k);
                }
            }
        }
        let rescale = cut.bytes_per_unit / self.bytes_per_unit;
        let mut costs = Vec::with_capacity(position.len());
        let mut memory = Vec::with_capacity(position.len());
        for k in position {
            let Some(k) = k else {
                return Ok(None);
            };
            costs.push(cut.costs[k]);
            let m = cut.memory[k];
            memory.push(
                StageMemorySpec::builder()
                    .total(m.total() * rescale)
                    .weight_grad(m.weight_grad() * rescale)
                    .checkpoint(m.checkpoint() * rescale)
                    .build()
                    .validate()?,
            );
        }
        Ok(Some((costs, memory)))
    }
}

/// Parses a byte count: a plain number of bytes, or one with a unit `B`, `KiB`, `MiB`, `GiB`,
/// `TiB` (powers of 1024) or `KB`, `MB`, `GB`, `TB` (powers of 1000): `2GiB`, `512 MiB`, `1.5GB`.
/// `None` when `text` has no unit (a plain number is then the caller's to read).
pub fn parse_bytes(text: &str) -> Option<Result<f64, String>> {
    let text = text.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = (text[..split].trim(), text[split..].trim());
    if unit.is_empty() {
        return None;
    }
    let factor = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => {
            return Some(Err(format!(
                "unknown unit `{unit}` in `{text}` (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            )))
        }
    };
    Some(match number.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 => Ok(n * factor),
        _ => Err(format!("`{number}` in `{text}` is not a positive number")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn layer(name: &str, placement: LayerPlacement, f: f64, bytes: u64) -> LayerProfile {
        LayerProfile {
            name: name.to_string(),
            placement,
            forward: f,
            input_grad: f,
            weight_grad: f / 2.0,
            activation_bytes: bytes,
            weight_grad_bytes: bytes / 2,
            half_length: None,
        }
    }

    /// `input` placed first, four free layers, `output` placed last.
    fn profile() -> Profile {
        let mut layers = vec![layer("input", LayerPlacement::First, 0.5, 100)];
        for k in 0..4 {
            layers.push(layer(&format!("layer.{k}"), LayerPlacement::Any, 1.0, 1000));
        }
        layers.push(layer("output", LayerPlacement::Last, 3.0, 2000));
        let mut extra = Map::new();
        extra.insert("width".into(), json!(64));
        Profile {
            format: PROFILE_FORMAT.to_string(),
            model: ProfiledModel {
                name: Some("toy".to_string()),
                seq_len: Some(32),
                microbatch_size: Some(2),
                dtype: Some("f32".to_string()),
                extra,
            },
            threads_per_rank: 1,
            repeats: 3,
            calibrated: false,
            layers,
            send: SendProfile {
                bytes: 64,
                seconds: 0.01,
            },
        }
    }

    /// `n` free layers of forward `k + 1` seconds, nothing pinned, no model described.
    fn plain(n: usize) -> Profile {
        Profile {
            format: PROFILE_FORMAT.to_string(),
            model: ProfiledModel::default(),
            threads_per_rank: 1,
            repeats: 1,
            calibrated: false,
            layers: (0..n)
                .map(|k| layer(&format!("{k}"), LayerPlacement::Any, (k + 1) as f64, 10))
                .collect(),
            send: SendProfile {
                bytes: 8,
                seconds: 0.0,
            },
        }
    }

    #[test]
    fn a_cut_sums_its_layers_and_counts_memory_in_the_heaviest_stage() {
        let p = profile();
        assert_eq!(p.free_layers(), 4);
        let cut = p.cut(&[3, 1]).unwrap();
        // Stage 0: the first-placed layer and three free ones; stage 1: one and the last.
        assert_eq!(cut.costs[0].forward(), 3.5);
        assert_eq!(cut.costs[1].forward(), 4.0);
        assert_eq!(cut.costs[1].weight_grad(), 2.0);
        assert_eq!(cut.bytes_per_unit, 3100.0);
        assert_eq!(cut.memory[0].total(), 1.0);
        assert_eq!(cut.memory[1].total(), 3000.0 / 3100.0);
        assert_eq!(cut.comm, 0.01);
        assert_eq!(p.even_cut(3), [1, 1, 2]);
        assert_eq!(p.stage_layers(&[3, 1]).unwrap(), [0..4, 4..6]);
        assert_eq!(p.stage_layers(&[0, 4, 0]).unwrap(), [0..1, 1..5, 5..6]);
        assert_eq!(p.stage_layers(&[4]).unwrap(), vec![0..6]);
    }

    #[test]
    fn a_stage_is_charged_the_larger_of_what_its_forward_and_its_input_gradient_leave() {
        let mut p = profile();
        // The last layer's input gradient leaves more for W than its forward left.
        p.layers[5].weight_grad_bytes = 2500;
        let cut = p.cut(&[3, 1]).unwrap();
        // Stage 1: one free layer (1000, 500 for W) and the last (2000, 2500 for W).
        assert_eq!(cut.bytes_per_unit, 3100.0);
        assert_eq!(cut.memory[1].total(), 3000.0 / 3100.0);
        assert_eq!(cut.memory[1].weight_grad(), 3000.0 / 3100.0);
        p.layers[5].weight_grad_bytes = 3000;
        let cut = p.cut(&[3, 1]).unwrap();
        assert_eq!(cut.bytes_per_unit, 3500.0);
        assert_eq!(cut.memory[1].total(), 1.0);
        assert_eq!(cut.memory[1].weight_grad(), 1.0);
        assert_eq!(Profile::from_json(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn a_layout_gives_every_position_its_own_layers() {
        use crate::ir::problem::ProblemSpec;
        let p = profile();
        // The V placement on 2 ranks: rank 0 holds positions 0 and 3, rank 1 positions 1 and 2.
        let v = ProblemSpec::builder()
            .ranks(2)
            .microbatches(4)
            .stage_to_rank(vec![0, 1, 1, 0])
            .build()
            .validate()
            .unwrap();
        let shares = ProfiledLayout::new(p.clone(), Some(vec![1, 3]), 3100.0);
        assert_eq!(shares.positions_of(&v), Some(vec![1, 2, 1, 0]));
        let (costs, memory) = shares.stages_of(&v).unwrap().unwrap();
        // Position 0: the first-placed layer and a free one; 1: two; 2: one; 3: the last alone.
        let forwards: Vec<f64> = costs.iter().map(|c| c.forward()).collect();
        assert_eq!(forwards, [1.5, 2.0, 1.0, 3.0]);
        assert_eq!(memory[3].total(), 2000.0 / 3100.0);
        assert_eq!(memory[0].total(), 1100.0 / 3100.0);
        // Without counts, the free layers even over the positions (as the trainer cuts them).
        let even = ProfiledLayout::new(p.clone(), None, 3100.0);
        assert_eq!(even.positions_of(&v), Some(vec![1, 1, 1, 1]));
        // Interleaved: rank 0 holds positions 0 and 2, so one free layer for it leaves
        // position 2 (between the first and the last) empty.
        let interleaved = ProblemSpec::builder()
            .ranks(2)
            .microbatches(4)
            .stage_to_rank(vec![0, 1, 0, 1])
            .build()
            .validate()
            .unwrap();
        let err = shares.stages_of(&interleaved).unwrap_err().to_string();
        assert!(
            err.contains("spread over the 4 positions of this layout is 1,2,0,1"),
            "{err}"
        );
        // Nothing pinned: every position needs a layer of its own.
        let plain = ProfiledLayout::new(plain(6), Some(vec![0, 6]), 1.0);
        let err = plain.stages_of(&v).unwrap_err().to_string();
        assert!(err.contains("leaves stage 0 empty"), "{err}");
        let plain = ProfiledLayout::new(self::plain(6), None, 1.0);
        assert_eq!(plain.positions_of(&v), Some(vec![1, 2, 1, 2]));
        assert!(plain.stages_of(&v).unwrap().is_some());
    }

    #[test]
    fn a_profile_round_trips_and_bad_ones_say_why() {
        let p = profile();
        assert_eq!(Profile::from_json(&p.to_json()).unwrap(), p);
        // The model's other keys are kept as they are.
        let written: Value = serde_json::from_str(&p.to_json()).unwrap();
        assert_eq!(written["model"]["width"], json!(64));
        assert_eq!(written["model"]["name"], json!("toy"));
        assert_eq!(written["layers"][0]["placement"], json!("first"));
        assert_eq!(written["format"], json!(PROFILE_FORMAT));
        let mut other = profile();
        other.format = "something/2".into();
        let err = Profile::from_json(&other.to_json())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("format `something/2` is not `pipeweave-profile/2`"),
            "{err}"
        );
        let mut untagged: Value = serde_json::from_str(&p.to_json()).unwrap();
        untagged.as_object_mut().unwrap().remove("format");
        let err = Profile::from_json(&untagged.to_string()).unwrap_err();
        assert!(err.to_string().contains("no `format` tag"), "{err}");
        let err = p.cut(&[2, 1]).unwrap_err();
        assert!(err.to_string().contains("sums to 3"), "{err}");
        let err = p.cut(&[2, 0, 2]).unwrap_err();
        assert!(err.to_string().contains("leaves stage 1 empty"), "{err}");
        assert!(
            err.to_string()
                .contains("only the first holds `input` and only the last `output`"),
            "{err}"
        );
        assert!(Profile::from_json("{}").is_err());
        assert!(Profile::from_json("[1, 2]").is_err());
        let mut empty = plain(0);
        assert!(empty
            .validate()
            .unwrap_err()
            .to_string()
            .contains("no layers"));
        empty = plain(1);
        empty.model.seq_len = Some(0);
        assert!(empty.validate().is_err());
    }

    #[test]
    fn pinned_layers_open_and_end_the_list() {
        let mut p = profile();
        // A layer placed last in the middle.
        p.layers[2].placement = LayerPlacement::Last;
        let err = p.validate().unwrap_err().to_string();
        assert!(
            err.contains(
                "layer 3 (`layer.2`) is placed `any` after layer 2 (`layer.1`) placed `last`"
            ),
            "{err}"
        );
        // A layer placed first after a free one.
        let mut p = profile();
        p.layers[3].placement = LayerPlacement::First;
        let err = p.validate().unwrap_err().to_string();
        assert!(
            err.contains("layer 3 (`layer.2`) is placed `first`"),
            "{err}"
        );
        // Several layers pinned to an end are named by their count.
        let mut p = profile();
        p.layers[1].placement = LayerPlacement::First;
        p.validate().unwrap();
        assert_eq!(p.free_layers(), 3);
        assert_eq!(p.stage_layers(&[1, 2]).unwrap(), [0..3, 3..6]);
        let err = p.cut(&[2, 0, 1]).unwrap_err().to_string();
        assert!(err.contains("the 2 layers placed first"), "{err}");
        // Only the last pinned: the first stage needs a free layer, the last may have none.
        let mut p = profile();
        p.layers[0].placement = LayerPlacement::Any;
        assert_eq!(p.free_layers(), 5);
        assert!(p.cut(&[5, 0]).is_ok());
        let err = p.cut(&[0, 5]).unwrap_err().to_string();
        assert!(err.contains("leaves stage 0 empty"), "{err}");
        assert_eq!(p.even_cut(2), [3, 2]);
        // An unknown placement is refused when read; a missing one is `any`.
        let mut text: Value = serde_json::from_str(&profile().to_json()).unwrap();
        text["layers"][2]["placement"] = json!("middle");
        let err = Profile::from_json(&text.to_string())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown variant `middle`"), "{err}");
        text["layers"][2]
            .as_object_mut()
            .unwrap()
            .remove("placement");
        assert_eq!(Profile::from_json(&text.to_string()).unwrap(), profile());
    }

    #[test]
    fn a_plain_layer_list_is_cut_over_all_its_layers() {
        let p = Profile::from_json(&plain(6).to_json()).unwrap();
        assert_eq!(p.free_layers(), 6);
        assert_eq!(p.seq_len(), None);
        assert_eq!(p.pinned(), PinnedEnds::none());
        assert_eq!(p.even_cut(2), [3, 3]);
        assert_eq!(p.even_cut(4), [1, 2, 1, 2]);
        let cut = p.cut(&[2, 4]).unwrap();
        // Stage 0: layers of 1 and 2 seconds; stage 1: 3 + 4 + 5 + 6.
        assert_eq!(cut.costs[0].forward(), 3.0);
        assert_eq!(cut.costs[1].forward(), 18.0);
        assert_eq!(cut.bytes_per_unit, 40.0);
        let err = p.cut(&[0, 6]).unwrap_err().to_string();
        assert!(err.contains("leaves stage 0 empty"), "{err}");
        let err = p.cut(&[6, 0]).unwrap_err().to_string();
        assert!(err.contains("leaves stage 1 empty"), "{err}");
        assert!(err.contains("every stage needs a layer"), "{err}");
        let err = p.cut(&[2, 2]).unwrap_err().to_string();
        assert!(err.contains("sums to 4; the model has 6 layers"), "{err}");
        // No length: no per-token model.
        let err = p.length_scale(16).unwrap_err().to_string();
        assert!(err.contains("no seq_len"), "{err}");
        // The model may be left out altogether.
        let mut text: Value = serde_json::from_str(&p.to_json()).unwrap();
        text.as_object_mut().unwrap().remove("model");
        assert_eq!(Profile::from_json(&text.to_string()).unwrap(), p);
    }

    /// [`profile`] as the former format wrote it.
    fn v1_text() -> String {
        let layers: Vec<Value> = profile()
            .layers
            .iter()
            .map(|l| {
                let kind = match l.placement {
                    LayerPlacement::First => "embedding",
                    LayerPlacement::Any => "block",
                    LayerPlacement::Last => "head",
                };
                let mut v = serde_json::to_value(l).unwrap();
                let object = v.as_object_mut().unwrap();
                object.remove("placement");
                object.insert("kind".into(), json!(kind));
                v
            })
            .collect();
        json!({
            "format": PROFILE_FORMAT_V1,
            "model": {"layers": 4, "width": 64, "heads": 4, "seq_len": 32,
                      "microbatch_size": 2, "dtype": "f32"},
            "threads_per_rank": 1, "repeats": 3,
            "layers": layers,
            "send": {"bytes": 64, "seconds": 0.01},
        })
        .to_string()
    }

    #[test]
    fn a_former_profile_reads_as_the_current_format() {
        let read = Profile::from_json(&v1_text()).unwrap();
        let mut expected = profile();
        expected.model.name = None;
        expected.model.extra.insert("layers".into(), json!(4));
        expected.model.extra.insert("heads".into(), json!(4));
        assert_eq!(read, expected);
        assert_eq!(read.format, PROFILE_FORMAT);
        // Written back, it is the current format, and reads the same.
        assert!(read.to_json().contains(PROFILE_FORMAT));
        assert_eq!(Profile::from_json(&read.to_json()).unwrap(), read);
        assert_eq!(read.cut(&[3, 1]).unwrap(), profile().cut(&[3, 1]).unwrap());
        // The former rules still hold for former files.
        let mut missing: Value = serde_json::from_str(&v1_text()).unwrap();
        missing["layers"].as_array_mut().unwrap().remove(2);
        let err = Profile::from_json(&missing.to_string()).unwrap_err();
        assert!(err.to_string().contains("5 layers listed"), "{err}");
        let mut swapped: Value = serde_json::from_str(&v1_text()).unwrap();
        swapped["layers"][1]["kind"] = json!("head");
        let err = Profile::from_json(&swapped.to_string()).unwrap_err();
        assert!(err.to_string().contains("expected a Block there"), "{err}");
        let mut no_length: Value = serde_json::from_str(&v1_text()).unwrap();
        no_length["model"]
            .as_object_mut()
            .unwrap()
            .remove("seq_len");
        let err = Profile::from_json(&no_length.to_string()).unwrap_err();
        assert!(err.to_string().contains("a count `seq_len`"), "{err}");
    }

    #[test]
    fn the_per_token_model_fits_each_phase_from_its_half_length_time() {
        let mut p = profile();
        // Without half-length times: linear in the tokens.
        assert!((p.length_scale(16).unwrap() - 0.5).abs() < 1e-12);
        // Every phase at half length a quarter of its time: all quadratic.
        for layer in &mut p.layers {
            layer.half_length = Some(PhaseTimes {
                forward: layer.forward / 4.0,
                input_grad: layer.input_grad / 4.0,
                weight_grad: layer.weight_grad / 4.0,
            });
        }
        assert!((p.length_scale(16).unwrap() - 0.25).abs() < 1e-12);
        assert!((p.length_scale(32).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(linear_share(2.0, 1.0), 1.0);
        assert_eq!(linear_share(2.0, 0.75), 0.5);
        assert_eq!(Profile::from_json(&p.to_json()).unwrap(), p);
    }

    #[test]
    fn byte_counts_parse_with_units() {
        assert_eq!(
            parse_bytes("2GiB"),
            Some(Ok(2.0 * 1024.0 * 1024.0 * 1024.0))
        );
        assert_eq!(parse_bytes("1.5 MB"), Some(Ok(1.5e6)));
        assert_eq!(parse_bytes("8"), None);
        assert!(matches!(parse_bytes("2XB"), Some(Err(_))));
        assert!(matches!(parse_bytes("-1GiB"), Some(Err(_))));
    }
}
