//! Measured layer costs: the profile `train_gpt --profile FILE.json` writes and `pipeweave plan`,
//! `run` and `tune --profile` read, and what a cut of the model into stages costs by it.
//!
//! A profile lists the model's layers in order (the embedding, every transformer block, the head
//! with the loss), each with its median forward (F), input-gradient (I) and weight-gradient (W)
//! seconds for one microbatch, the activation bytes one microbatch's forward leaves
//! (`activation_bytes`) and those its input gradient leaves for W (`weight_grad_bytes`, which may
//! be the larger: W needs each product's output gradient). It also gives the seconds to send one activation
//! between ranks. A cut (`layers_per_stage`: blocks per stage, the embedding on the first stage
//! and the head on the last) then gives each stage the sums of its layers: [`Profile::cut`].
//! Each layer's times at half the sequence length (`half_length`) give the per-token model of
//! variable-length microbatches: [`Profile::length_scale`].
//!
//! The file (format `pipeweave-profile/1`, JSON):
//!
//! ```json
//! {"format": "pipeweave-profile/1",
//!  "model": {"layers": 4, "d_model": 512, "heads": 8, "seq_len": 128, "microbatch_size": 4,
//!            "vocab": 256, "dtype": "f32"},
//!  "threads_per_rank": 1, "repeats": 5,
//!  "layers": [{"name": "embedding", "kind": "embedding", "forward": 0.001, "input_grad": 0.0,
//!              "weight_grad": 0.002, "activation_bytes": 8192, "weight_grad_bytes": 1048576,
//!              "half_length": {"forward": 0.0005, "input_grad": 0.0, "weight_grad": 0.001}},
//!             ...],
//!  "send": {"bytes": 1048576, "seconds": 0.0002}}
//! ```

use crate::error::CoreError;
use crate::ir::blocks::{cut_violation, even_blocks, spread_shares};
use crate::ir::cost::{LayoutFigures, StageCosts, StageCostsSpec, StageFigures};
use crate::ir::memory::{StageMemory, StageMemorySpec};
use crate::ir::problem::Problem;
use serde::{Deserialize, Serialize};

/// The format tag a profile file carries.
pub const PROFILE_FORMAT: &str = "pipeweave-profile/1";

/// The model a profile was measured on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfiledModel {
    /// Transformer blocks.
    pub layers: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Sequences per microbatch.
    pub microbatch_size: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Element type (`f32`, `f64`).
    pub dtype: String,
}

/// What a layer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// The token and position embedding (on the first stage).
    Embedding,
    /// A transformer block.
    Block,
    /// The final norm, the output projection and the loss (on the last stage).
    Head,
}

/// One layer's measured costs for one microbatch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerProfile {
    /// `embedding`, `block.K` or `head`.
    pub name: String,
    /// What the layer is.
    pub kind: LayerKind,
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
    /// The layers in order: the embedding, the blocks, the head.
    pub layers: Vec<LayerProfile>,
    /// One activation's send.
    pub send: SendProfile,
}

/// Each stage's costs and activation memory under a cut, from a [`Profile`].
#[derive(Clone, Debug, PartialEq)]
pub struct CutCosts {
    /// Blocks per stage.
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

impl Profile {
    /// Parses and checks a profile's JSON text.
    pub fn from_json(text: &str) -> Result<Profile, CoreError> {
        let profile: Profile =
            serde_json::from_str(text).map_err(|e| bad(format!("not a profile: {e}")))?;
        profile.validate()?;
        Ok(profile)
    }

    /// The profile as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a profile of numbers and strings serialises")
    }

    /// Checks the format tag, the layer list (embedding, `model.layers` blocks, head, in that
    /// order) and that every figure is finite and non-negative.
    pub fn validate(&self) -> Result<(), CoreError> {
        if self.format != PROFILE_FORMAT {
            return Err(bad(format!(
                "format `{}` is not `{PROFILE_FORMAT}`",
                self.format
            )));
        }
        let blocks = self.model.layers;
        if self.layers.len() != blocks + 2 {
            return Err(bad(format!(
                "{} layers listed; a model of {blocks} blocks needs {} (the embedding, the \
                 blocks, the head)",
                self.layers.len(),
                blocks + 2
            )));
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let expected = if i == 0 {
                LayerKind::Embedding
            } else if i == blocks + 1 {
                LayerKind::Head
            } else {
                LayerKind::Block
            };
            if layer.kind != expected {
                return Err(bad(format!(
                    "layer {i} (`{}`) is a {:?}; expected a {expected:?} there",
                    layer.name, layer.kind
                )));
            }
            for (what, value) in [
                ("forward", layer.forward),
                ("input_grad", layer.input_grad),
                ("weight_grad", layer.weight_grad),
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

    /// The cost of one microbatch whose sequences have `tokens` tokens, relative to one at the
    /// profiled length (all layers, all phases): each phase of each layer costs
    /// `a·x + (1 - a)·x²` of its full-length time at `x = tokens / seq_len`, `a` fitted from its
    /// half-length time (the linear part: matrix products; the quadratic: attention's scores);
    /// linear in the tokens for layers measured at one length.
    pub fn length_scale(&self, tokens: usize) -> f64 {
        let x = tokens as f64 / self.model.seq_len.max(1) as f64;
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
        if full_total > 0.0 {
            scaled / full_total
        } else {
            x
        }
    }

    /// The even cut of the blocks into `stages` stages (stage `k` holds blocks
    /// `⌊kL/S⌋ .. ⌊(k+1)L/S⌋`, as the trainer cuts by default).
    pub fn even_cut(&self, stages: usize) -> Vec<usize> {
        even_blocks(self.model.layers, stages)
    }

    /// Each stage's summed costs and memory under `layers_per_stage` (one count per stage, summing
    /// to the blocks; a stage between the first and the last needs a block).
    pub fn cut(&self, layers_per_stage: &[usize]) -> Result<CutCosts, CoreError> {
        let stages = layers_per_stage.len();
        let blocks = self.model.layers;
        if stages == 0 {
            return Err(bad("--layers-per-stage needs one count per stage"));
        }
        if let Some(reason) = cut_violation(layers_per_stage, blocks) {
            return Err(bad(reason));
        }
        let mut start = 1; // layer 0 is the embedding
        let mut sums = Vec::with_capacity(stages);
        for (k, &count) in layers_per_stage.iter().enumerate() {
            let mut members: Vec<&LayerProfile> =
                self.layers[start..start + count].iter().collect();
            start += count;
            if k == 0 {
                members.insert(0, &self.layers[0]);
            }
            if k + 1 == stages {
                members.push(&self.layers[blocks + 1]);
            }
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

/// A profiled model cut by one block count per rank (or evenly), as the figures of any layout
/// a pass builds from it: every stage gets the costs and memory of the layers at its position,
/// as the trainer places them (a rank's count spread over its positions by
/// [`spread_shares`]; without counts, the blocks even over the positions), rather than an even
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

    /// Blocks per position of `problem`'s routes, or `None` where it has no route or a stage
    /// has no rank.
    pub fn positions_of(&self, problem: &Problem) -> Option<Vec<usize>> {
        let route = problem.routes().first()?;
        let owners = route
            .stages()
            .iter()
            .map(|&s| problem.rank_of(s).map(|r| r.index()))
            .collect::<Option<Vec<usize>>>()?;
        let blocks = self.profile.model.layers;
        Some(match &self.shares {
            Some(shares) if shares.len() == problem.ranks() as usize => {
                spread_shares(&owners, shares)
            }
            _ => even_blocks(blocks, owners.len()),
        })
    }
}

impl LayoutFigures for ProfiledLayout {
    fn stages_of(&self, problem: &Problem) -> Result<Option<StageFigures>, CoreError> {
        let Some(counts) = self.positions_of(problem) else {
            return Ok(None);
        };
        let shown = |c: &[usize]| c.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        if let Some(reason) = cut_violation(&counts, self.profile.model.layers) {
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

    fn layer(name: &str, kind: LayerKind, f: f64, bytes: u64) -> LayerProfile {
        LayerProfile {
            name: name.to_string(),
            kind,
            forward: f,
            input_grad: f,
            weight_grad: f / 2.0,
            activation_bytes: bytes,
            weight_grad_bytes: bytes / 2,
            half_length: None,
        }
    }

    fn profile() -> Profile {
        let mut layers = vec![layer("embedding", LayerKind::Embedding, 0.5, 100)];
        for k in 0..4 {
            layers.push(layer(&format!("block.{k}"), LayerKind::Block, 1.0, 1000));
        }
        layers.push(layer("head", LayerKind::Head, 3.0, 2000));
        Profile {
            format: PROFILE_FORMAT.to_string(),
            model: ProfiledModel {
                layers: 4,
                d_model: 64,
                heads: 4,
                seq_len: 32,
                microbatch_size: 2,
                vocab: 256,
                dtype: "f32".to_string(),
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

    #[test]
    fn a_cut_sums_its_layers_and_counts_memory_in_the_heaviest_stage() {
        let p = profile();
        let cut = p.cut(&[3, 1]).unwrap();
        // Stage 0: the embedding and three blocks; stage 1: one block and the head.
        assert_eq!(cut.costs[0].forward(), 3.5);
        assert_eq!(cut.costs[1].forward(), 4.0);
        assert_eq!(cut.costs[1].weight_grad(), 2.0);
        assert_eq!(cut.bytes_per_unit, 3100.0);
        assert_eq!(cut.memory[0].total(), 1.0);
        assert_eq!(cut.memory[1].total(), 3000.0 / 3100.0);
        assert_eq!(cut.comm, 0.01);
        assert_eq!(p.even_cut(3), [1, 1, 2]);
    }

    #[test]
    fn a_stage_is_charged_the_larger_of_what_its_forward_and_its_input_gradient_leave() {
        let mut p = profile();
        // The head's input gradient leaves more for W than its forward left.
        p.layers[5].weight_grad_bytes = 2500;
        let cut = p.cut(&[3, 1]).unwrap();
        // Stage 1: one block (1000, 500 for W) and the head (2000, 2500 for W).
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
        // Position 0: the embedding and a block; 1: two blocks; 2: one; 3: the head alone.
        let forwards: Vec<f64> = costs.iter().map(|c| c.forward()).collect();
        assert_eq!(forwards, [1.5, 2.0, 1.0, 3.0]);
        assert_eq!(memory[3].total(), 2000.0 / 3100.0);
        assert_eq!(memory[0].total(), 1100.0 / 3100.0);
        // Without counts, the blocks even over the positions (as the trainer cuts them).
        let even = ProfiledLayout::new(p.clone(), None, 3100.0);
        assert_eq!(even.positions_of(&v), Some(vec![1, 1, 1, 1]));
        // Interleaved: rank 0 holds positions 0 and 2, so one block for it leaves position 2
        // (between the first and the last) empty.
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
    }

    #[test]
    fn a_profile_round_trips_and_bad_ones_say_why() {
        let p = profile();
        assert_eq!(Profile::from_json(&p.to_json()).unwrap(), p);
        let mut missing = profile();
        missing.layers.remove(2);
        let err = Profile::from_json(&missing.to_json()).unwrap_err();
        assert!(err.to_string().contains("5 layers listed"), "{err}");
        let mut other = profile();
        other.format = "something/2".into();
        assert!(Profile::from_json(&other.to_json()).is_err());
        let err = p.cut(&[2, 1]).unwrap_err();
        assert!(err.to_string().contains("sums to 3"), "{err}");
        let err = p.cut(&[2, 0, 2]).unwrap_err();
        assert!(err.to_string().contains("leaves stage 1 empty"), "{err}");
        assert!(Profile::from_json("{}").is_err());
    }

    #[test]
    fn the_per_token_model_fits_each_phase_from_its_half_length_time() {
        let mut p = profile();
        // Without half-length times: linear in the tokens.
        assert!((p.length_scale(16) - 0.5).abs() < 1e-12);
        // Every phase at half length a quarter of its time: all quadratic.
        for layer in &mut p.layers {
            layer.half_length = Some(PhaseTimes {
                forward: layer.forward / 4.0,
                input_grad: layer.input_grad / 4.0,
                weight_grad: layer.weight_grad / 4.0,
            });
        }
        assert!((p.length_scale(16) - 0.25).abs() < 1e-12);
        assert!((p.length_scale(32) - 1.0).abs() < 1e-12);
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
