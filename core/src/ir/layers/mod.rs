//! A model's layers as plain data: each layer's measured figures and where a cut may place it
//! ([`LayerCosts`]), and the validated list of them in order with the seconds of one activation's
//! send ([`LayerTable`]). What a cut of the table costs, per stage ([`CutCosts`]) and per
//! position of a problem a pass reshapes ([`LayerLayout`], which a [`crate::ir::cost::CostModel`]
//! carries), is computed beside it (`cut.rs`). Reading and writing the measured file is
//! [`crate::formats::profile`]'s; nothing here knows a file or a particular model.
//!
//! Every type here compares and hashes as data (each `f64` by its bits; validation turns `-0`
//! into `0`, so that is the same as comparing the numbers).

mod cut;
#[cfg(test)]
mod tests;

pub use cut::{CutCosts, LayerLayout, StageFigures};

use crate::error::CoreError;
use crate::ir::blocks::{even_cut, PinnedEnds};
use serde::{Deserialize, Serialize};
use std::hash::{Hash, Hasher};
use std::ops::Range;
use typed_builder::TypedBuilder;

/// Where a layer may go when the model is cut into stages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

impl PhaseTimes {
    fn bits(&self) -> [u64; 3] {
        [
            self.forward.to_bits(),
            self.input_grad.to_bits(),
            self.weight_grad.to_bits(),
        ]
    }
}

/// The errors of a layer table name the figures as the file they come from does: a profile.
fn bad(reason: impl Into<String>) -> CoreError {
    CoreError::InvalidModel {
        model: "profile",
        stage: "all".to_string(),
        reason: reason.into(),
    }
}

/// One layer's figures for one microbatch, as a producer measured them; validated by
/// [`LayerCostsSpec::validate`] (or [`LayerTable::new`]).
#[derive(Clone, Debug, TypedBuilder)]
pub struct LayerCostsSpec {
    /// The producer's name for it (`input`, `layer.K`, `output`), for messages.
    #[builder(setter(into))]
    name: String,
    /// Where it may go.
    #[builder(default)]
    placement: LayerPlacement,
    /// Forward seconds.
    forward: f64,
    /// Input-gradient seconds.
    input_grad: f64,
    /// Weight-gradient seconds.
    weight_grad: f64,
    /// Full (fused) backward seconds, where measured: what a schedule that does not split the
    /// backward pays, which a runtime may run cheaper or dearer than its split's I + W.
    #[builder(default, setter(strip_option(fallback = backward_opt)))]
    backward: Option<f64>,
    /// Bytes one microbatch's forward leaves for the backward.
    activation_bytes: u64,
    /// Bytes its input gradient leaves for the weight gradient.
    weight_grad_bytes: u64,
    /// The same phases' seconds at half the sequence length (the per-token model).
    #[builder(default, setter(strip_option(fallback = half_length_opt)))]
    half_length: Option<PhaseTimes>,
}

/// Validated figures of one layer: every time finite and non-negative.
#[derive(Clone, Debug)]
pub struct LayerCosts {
    name: String,
    placement: LayerPlacement,
    times: PhaseTimes,
    backward: Option<f64>,
    activation_bytes: u64,
    weight_grad_bytes: u64,
    half_length: Option<PhaseTimes>,
}

impl LayerCostsSpec {
    /// Checks that every time (the half-length ones too) is finite and non-negative.
    pub fn validate(self) -> Result<LayerCosts, CoreError> {
        let half = self
            .half_length
            .map_or([0.0; 3], |h| [h.forward, h.input_grad, h.weight_grad]);
        for (what, value) in [
            ("forward", self.forward),
            ("input_grad", self.input_grad),
            ("weight_grad", self.weight_grad),
            ("backward", self.backward.unwrap_or(0.0)),
            ("half_length forward", half[0]),
            ("half_length input_grad", half[1]),
            ("half_length weight_grad", half[2]),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(bad(format!(
                    "layer `{}`: {what} = {value} must be finite and >= 0",
                    self.name
                )));
            }
        }
        // `abs` turns a `-0` into `0` (every time is >= 0 here), so bits compare as numbers.
        let times = |t: PhaseTimes| PhaseTimes {
            forward: t.forward.abs(),
            input_grad: t.input_grad.abs(),
            weight_grad: t.weight_grad.abs(),
        };
        Ok(LayerCosts {
            name: self.name,
            placement: self.placement,
            times: times(PhaseTimes {
                forward: self.forward,
                input_grad: self.input_grad,
                weight_grad: self.weight_grad,
            }),
            backward: self.backward.map(f64::abs),
            activation_bytes: self.activation_bytes,
            weight_grad_bytes: self.weight_grad_bytes,
            half_length: self.half_length.map(times),
        })
    }
}

impl LayerCosts {
    /// The producer's name for the layer.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Where it may go.
    pub fn placement(&self) -> LayerPlacement {
        self.placement
    }
    /// Forward seconds.
    pub fn forward(&self) -> f64 {
        self.times.forward
    }
    /// Input-gradient seconds.
    pub fn input_grad(&self) -> f64 {
        self.times.input_grad
    }
    /// Weight-gradient seconds.
    pub fn weight_grad(&self) -> f64 {
        self.times.weight_grad
    }
    /// Full backward seconds: as measured, else the split's `input_grad + weight_grad`.
    pub fn full_backward(&self) -> f64 {
        self.backward
            .unwrap_or(self.times.input_grad + self.times.weight_grad)
    }
    /// Whether the full backward was measured (else it is the split's sum).
    pub fn backward_measured(&self) -> bool {
        self.backward.is_some()
    }
    /// Bytes one microbatch's forward leaves for the backward.
    pub fn activation_bytes(&self) -> u64 {
        self.activation_bytes
    }
    /// Bytes its input gradient leaves for the weight gradient.
    pub fn weight_grad_bytes(&self) -> u64 {
        self.weight_grad_bytes
    }
    /// The seconds at half the sequence length, where measured.
    pub fn half_length(&self) -> Option<PhaseTimes> {
        self.half_length
    }

    #[allow(clippy::type_complexity)]
    fn key(
        &self,
    ) -> (
        &str,
        LayerPlacement,
        [u64; 3],
        Option<u64>,
        [u64; 2],
        Option<[u64; 3]>,
    ) {
        (
            &self.name,
            self.placement,
            self.times.bits(),
            self.backward.map(f64::to_bits),
            [self.activation_bytes, self.weight_grad_bytes],
            self.half_length.as_ref().map(PhaseTimes::bits),
        )
    }
}

eq_and_hash_by_key!(LayerCosts);

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

/// What the layers of `placement` are called in a message: one by its name, several by their
/// count.
fn pinned_name<'a>(
    layers: impl Iterator<Item = (&'a str, LayerPlacement)>,
    placement: LayerPlacement,
) -> Option<String> {
    let pinned: Vec<&str> = layers
        .filter(|&(_, p)| p == placement)
        .map(|(name, _)| name)
        .collect();
    match pinned.as_slice() {
        [] => None,
        [one] => Some(format!("`{one}`")),
        several => Some(format!(
            "the {} layers placed {}",
            several.len(),
            placement.as_str()
        )),
    }
}

/// What the layers (by name and placement) placed first and last pin to the first and the last
/// stage, named for messages.
pub(crate) fn pinned_ends<'a>(
    layers: impl Iterator<Item = (&'a str, LayerPlacement)> + Clone,
) -> PinnedEnds {
    PinnedEnds {
        first: pinned_name(layers.clone(), LayerPlacement::First),
        last: pinned_name(layers, LayerPlacement::Last),
    }
}

/// A model's layers in order (those placed first, the free ones, those placed last; at least
/// one) and the seconds of one activation's send between ranks.
#[derive(Clone, Debug)]
pub struct LayerTable {
    layers: Vec<LayerCosts>,
    comm: f64,
    /// Seconds the runtime adds to every compute action (F, I, W, B) of a stage, beside its
    /// layers' own: the call, its bookkeeping (0 where not measured).
    action: f64,
}

impl LayerTable {
    /// Validates the layers (each by [`LayerCostsSpec::validate`]; at least one, those placed
    /// first opening the list and those placed last ending it) and `comm`, the seconds of one
    /// activation's send (finite, >= 0).
    pub fn new(layers: Vec<LayerCostsSpec>, comm: f64) -> Result<LayerTable, CoreError> {
        if layers.is_empty() {
            return Err(bad("no layers listed"));
        }
        let mut table: Vec<LayerCosts> = Vec::with_capacity(layers.len());
        // The first layer of the latest run of one placement.
        let mut previous: Option<usize> = None;
        for (i, spec) in layers.into_iter().enumerate() {
            if let Some(j) = previous {
                let before = &table[j];
                if spec.placement.rank() < before.placement.rank() {
                    return Err(bad(format!(
                        "layer {i} (`{}`) is placed `{}` after layer {j} (`{}`) placed `{}`: \
                         the layers placed `first` open the list and those placed `last` end it",
                        spec.name,
                        spec.placement.as_str(),
                        before.name,
                        before.placement.as_str()
                    )));
                }
            }
            if previous.is_none_or(|j| table[j].placement != spec.placement) {
                previous = Some(i);
            }
            table.push(spec.validate()?);
        }
        if !(comm.is_finite() && comm >= 0.0) {
            return Err(bad(format!(
                "send seconds = {comm} must be finite and >= 0"
            )));
        }
        Ok(LayerTable {
            layers: table,
            comm: comm.abs(),
            action: 0.0,
        })
    }

    /// The same table with `seconds` (finite, >= 0) added to every compute action of a stage:
    /// what the runtime's call of an action costs beside the layers' own work.
    pub fn with_action_seconds(mut self, seconds: f64) -> Result<LayerTable, CoreError> {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(bad(format!(
                "action seconds = {seconds} must be finite and >= 0"
            )));
        }
        self.action = seconds.abs();
        Ok(self)
    }

    /// Seconds the runtime adds to every compute action of a stage.
    pub fn action_seconds(&self) -> f64 {
        self.action
    }

    /// The layers in order.
    pub fn layers(&self) -> &[LayerCosts] {
        &self.layers
    }

    /// The seconds of one activation's send.
    pub fn comm(&self) -> f64 {
        self.comm
    }

    /// The layers a cut places (`placement` `any`): what `layers_per_stage` counts.
    pub fn free_layers(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.placement == LayerPlacement::Any)
            .count()
    }

    /// What the layers placed first and last pin to the first and the last stage, named for
    /// messages.
    pub fn pinned(&self) -> PinnedEnds {
        pinned_ends(self.layers.iter().map(|l| (l.name.as_str(), l.placement)))
    }

    /// The even cut of the free layers into `stages` stages ([`even_cut`]).
    pub fn even_cut(&self, stages: usize) -> Vec<usize> {
        even_cut(self.free_layers(), stages, &self.pinned())
    }

    /// The indices into [`LayerTable::layers`] of each stage's layers under `layers_per_stage`
    /// (free layers per stage): the first stage's begin with those placed first, the last
    /// stage's end with those placed last. An error where the counts are no cut
    /// ([`crate::ir::blocks::cut_violation`]).
    pub fn stage_layers(&self, layers_per_stage: &[usize]) -> Result<Vec<Range<usize>>, CoreError> {
        let stages = layers_per_stage.len();
        if stages == 0 {
            return Err(bad("--layers-per-stage needs one count per stage"));
        }
        if let Some(reason) =
            crate::ir::blocks::cut_violation(layers_per_stage, self.free_layers(), &self.pinned())
        {
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

    /// The cost of one microbatch whose sequences are `x` times the measured length, relative
    /// to one at that length (all layers, all phases): each phase of each layer costs
    /// `a·x + (1 - a)·x²` of its full-length time, `a` fitted from its half-length time (the
    /// linear part: matrix products; the quadratic: attention's scores); linear in `x` for
    /// layers measured at one length.
    pub fn length_scale(&self, x: f64) -> f64 {
        let mut full_total = 0.0;
        let mut scaled = 0.0;
        for layer in &self.layers {
            let full = [layer.forward(), layer.input_grad(), layer.weight_grad()];
            let half = layer
                .half_length
                .map(|h| [h.forward, h.input_grad, h.weight_grad]);
            for (k, f) in full.iter().enumerate() {
                let a = half.map_or(1.0, |h| linear_share(*f, h[k]));
                full_total += f;
                scaled += f * (a * x + (1.0 - a) * x * x);
            }
        }
        if full_total > 0.0 {
            scaled / full_total
        } else {
            x
        }
    }
}

impl PartialEq for LayerTable {
    fn eq(&self, other: &LayerTable) -> bool {
        self.layers == other.layers
            && self.comm.to_bits() == other.comm.to_bits()
            && self.action.to_bits() == other.action.to_bits()
    }
}

impl Eq for LayerTable {}

impl Hash for LayerTable {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.layers.hash(state);
        self.comm.to_bits().hash(state);
        self.action.to_bits().hash(state);
    }
}
