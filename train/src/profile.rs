//! Measuring a [`Profile`] of our GPT: every layer of the model's list
//! ([`pipeweave_kernels::model_layers`]: the embedding, placed first; each block, placed
//! anywhere; the head with the loss, placed last; each with the input and the placement its kind
//! declares, the loss after the model's last) run alone on this thread,
//! its forward, input-gradient and weight-gradient times taken over several repeats (the medians
//! are kept), its activation bytes read from what the forward saves and what the weight gradient
//! still needs, and the time to hand one activation to another thread (the threads backend's
//! send).
//!
//! The layers run as one-layer [`StageModel`]s on the same primitives, shapes and thread count as
//! the training run (`train_gpt --profile` measures after its steps, with its
//! `--threads-per-rank`), so the figures are what a stage of those layers costs in a pipeline
//! step, less what the pipeline adds (waits, transfers); `pipeweave plan --profile` sums them
//! for any cut ([`Profile::cut`]). The profile describes the model as [`GptProfileModel`] (the
//! name `gpt` and its sizes), which `train_gpt --cost-profile` checks a profile against.

use crate::batch::PAD_ID;
use crate::cut::ModelCut;
use crate::error::TrainError;
use crate::stage::MeasuredOp;
use candle_core::{DType, Device, Tensor};
use pipeweave_core::{
    LayerPlacement, LayerProfile, PhaseTimes, Profile, ProfiledModel, SendProfile, Task,
    PROFILE_FORMAT,
};
use pipeweave_kernels::{
    model_layers, CpuPrimitives, CrossEntropy, GptConfig, LayerId, LayerInput, Placement,
    Primitives, StageLayout, StageModel,
};
use std::sync::Arc;
use std::time::Instant;

/// Our GPT as a profile describes it: the model's `name` `gpt`, its `seq_len` and
/// `microbatch_size`, and the sizes as keys of its own (`blocks`, `d_model`, `heads`, `vocab`);
/// what `train_gpt --cost-profile` checks a profile against. Profiles of the former format
/// (`pipeweave-profile/1`) read the same, with no name and the blocks as `layers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptProfileModel {
    /// Transformer blocks (the profile's free layers).
    pub blocks: usize,
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub heads: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Sequences per microbatch.
    pub microbatch_size: usize,
    /// Experts of each block's mixture (0: GPT-2's MLPs).
    pub experts: usize,
    /// Experts per token (0 without a mixture).
    pub top_k: usize,
}

impl GptProfileModel {
    /// The model's `name` in profiles of our GPT.
    pub const NAME: &'static str = "gpt";

    /// The GPT `profile` was measured on, or `None` where it describes another model (another
    /// name, a size missing, or not one free layer per block).
    pub fn of(profile: &Profile) -> Option<GptProfileModel> {
        let model = &profile.model;
        if model.name.as_deref().is_some_and(|name| name != Self::NAME) {
            return None;
        }
        let size = |key: &str| {
            model
                .extra
                .get(key)
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
        };
        let gpt = GptProfileModel {
            // The former format named the blocks `layers`.
            blocks: size("blocks").or_else(|| size("layers"))?,
            d_model: size("d_model")?,
            heads: size("heads")?,
            vocab: size("vocab")?,
            seq_len: model.seq_len?,
            microbatch_size: model.microbatch_size?,
            experts: size("experts").unwrap_or(0),
            top_k: size("top_k").unwrap_or(0),
        };
        (profile.free_layers() == gpt.blocks).then_some(gpt)
    }

    /// The profile's description of this model, its elements of `dtype`.
    pub fn describe(&self, dtype: DType) -> ProfiledModel {
        let mut model = ProfiledModel {
            name: Some(Self::NAME.to_string()),
            seq_len: Some(self.seq_len),
            microbatch_size: Some(self.microbatch_size),
            dtype: Some(format!("{dtype:?}").to_lowercase()),
            extra: serde_json::Map::new(),
        };
        for (key, value) in [
            ("blocks", self.blocks),
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("vocab", self.vocab),
        ] {
            model.extra.insert(key.to_string(), value.into());
        }
        if self.experts > 0 {
            for (key, value) in [("experts", self.experts), ("top_k", self.top_k)] {
                model.extra.insert(key.to_string(), value.into());
            }
        }
        model
    }
}

/// What to measure: the model, one microbatch's shape, and how often.
#[derive(Clone, Copy, Debug)]
pub struct ProfileRequest {
    /// The model.
    pub config: GptConfig,
    /// Sequences per microbatch.
    pub microbatch_size: usize,
    /// Tokens per sequence.
    pub seq_len: usize,
    /// Element type.
    pub dtype: DType,
    /// Compute threads (recorded; the caller sets them, as `train_gpt` does).
    pub threads_per_rank: usize,
    /// Timed runs per figure, after one untimed warm-up.
    pub repeats: usize,
    /// Seeds the weights and the inputs.
    pub seed: u64,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => 0.0,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed().as_secs_f64())
}

fn candle(what: &'static str) -> impl Fn(candle_core::Error) -> TrainError {
    move |e| TrainError::invariant(format!("profiling: {what}: {e}"))
}

/// The inputs of a layer on `device`: token ids or hidden states, as the layer takes.
fn layer_input(
    request: &ProfileRequest,
    input: LayerInput,
    t: usize,
    device: &Device,
) -> Result<Tensor, TrainError> {
    let (b, d) = (request.microbatch_size, request.config.d_model());
    match input {
        LayerInput::TokenIds => {
            let ids: Vec<u32> = (0..b * t)
                .map(|i| ((i as u64 * 2_654_435_761 + request.seed) % 256) as u32)
                .collect();
            Tensor::from_vec(ids, (b, t), device).map_err(candle("token ids"))
        }
        LayerInput::Hidden => Tensor::randn(0f32, 1.0, (b, t, d), device)
            .and_then(|x| x.to_dtype(request.dtype))
            .map_err(candle("hidden states")),
    }
}

/// Layer `index` of the model's list measured alone (a one-layer stage on `ops`) at the
/// request's length and at half of it (the per-token model).
fn measure_layer(
    request: &ProfileRequest,
    ops: &Arc<dyn Primitives>,
    index: usize,
    layer: LayerId,
) -> Result<LayerProfile, TrainError> {
    let name = layer.label();
    let layout = StageLayout::new(&request.config, index..index + 1)
        .map_err(TrainError::kernel_config("a profiled layer's layout"))?;
    let model = StageModel::with_primitives(
        request.config,
        layout,
        request.seed,
        request.dtype,
        Arc::clone(ops),
    )
    .map_err(TrainError::kernel_config(format!(
        "the profiled layer {name}"
    )))?;
    let (full, activation_bytes, weight_grad_bytes) =
        time_phases(request, &model, &name, request.seq_len)?;
    let half_length = match request.seq_len / 2 {
        0 => None,
        half => Some(time_phases(request, &model, &name, half)?.0),
    };
    let placement = match layer.placement() {
        Placement::First => LayerPlacement::First,
        Placement::Any => LayerPlacement::Any,
        Placement::Last => LayerPlacement::Last,
    };
    Ok(LayerProfile {
        name,
        placement,
        forward: full.forward,
        input_grad: full.input_grad,
        weight_grad: full.weight_grad,
        // The trainer's backward is its split's I and W (train/src/stage): no fused one.
        backward: None,
        activation_bytes,
        weight_grad_bytes,
        half_length,
    })
}

/// `repeats` timed runs of a one-layer stage's F, I and W on sequences of `t` tokens (after a
/// warm-up): their medians, and the bytes the forward saves and the weight gradient still needs.
/// The inputs are made on the device the stage's primitives compute on.
fn time_phases(
    request: &ProfileRequest,
    model: &StageModel,
    name: &str,
    t: usize,
) -> Result<(PhaseTimes, u64, u64), TrainError> {
    let config = request.config;
    let layout = model.layout();
    let device = model.primitives().device();
    let input = layer_input(request, layout.input(), t, device)?;
    let b = request.microbatch_size;
    let targets: Vec<u32> = (0..b * t)
        .map(|i| ((i as u64 * 40_503 + request.seed) % 256) as u32)
        .collect();
    let targets = Tensor::from_vec(targets, (b, t), device).map_err(candle("targets"))?;
    let cross_entropy = CrossEntropy::new(Some(PAD_ID));
    let grad_hidden = Tensor::randn(0f32, 1.0, (b, t, config.d_model()), device)
        .and_then(|x| x.to_dtype(request.dtype))
        .map_err(candle("output gradient"))?;
    let kernel = |what: &str| TrainError::kernel(format!("profiling {name}: {what}"));
    let (mut f, mut i, mut w) = (Vec::new(), Vec::new(), Vec::new());
    let (mut activation_bytes, mut weight_grad_bytes) = (0, 0);
    for run in 0..=request.repeats {
        let (result, forward) = timed(|| {
            let (output, saved) = model.forward(&input).map_err(kernel("forward"))?;
            // The model's last layer (the head) includes the loss and its gradient, as a
            // pipeline's last stage computes them right after the forward.
            let grad = if layout.ends_model() {
                let normalizer = (b * t) as f64;
                cross_entropy
                    .loss_and_grad(model.primitives(), &output, &targets, normalizer)
                    .map_err(kernel("loss"))?
                    .grad_logits
            } else {
                grad_hidden.clone()
            };
            Ok::<_, TrainError>((output, saved, grad))
        });
        let (output, saved, grad) = result?;
        drop(output);
        let saved_bytes = saved.held_bytes();
        let (pending, input_grad) = timed(|| model.backward_input(saved, &grad));
        let (_, pending) = pending.map_err(kernel("input-gradient backward"))?;
        let pending_bytes = pending.held_bytes();
        let (grads, weight_grad) = timed(|| model.backward_weight(pending));
        drop(grads.map_err(kernel("weight-gradient backward"))?);
        if run > 0 {
            f.push(forward);
            i.push(input_grad);
            w.push(weight_grad);
        }
        activation_bytes = saved_bytes as u64;
        // What the input-gradient backward leaves for W (each product's input and output
        // gradient) can outweigh what the forward left: recorded as measured.
        weight_grad_bytes = pending_bytes as u64;
    }
    let times = PhaseTimes {
        forward: median(f),
        input_grad: median(i),
        weight_grad: median(w),
    };
    Ok((times, activation_bytes, weight_grad_bytes))
}

/// The time to hand one activation (`[B, T, d]`, on `device`) to another thread and get word
/// back, halved: one send of the threads backend.
fn measure_send(request: &ProfileRequest, device: &Device) -> Result<SendProfile, TrainError> {
    let activation = layer_input(request, LayerInput::Hidden, request.seq_len, device)?;
    let bytes = (activation.elem_count() * activation.dtype().size_in_bytes()) as u64;
    let (to_peer, peer_in) = std::sync::mpsc::channel::<Tensor>();
    let (to_back, back_in) = std::sync::mpsc::channel::<Tensor>();
    let peer = std::thread::spawn(move || {
        while let Ok(t) = peer_in.recv() {
            if to_back.send(t).is_err() {
                break;
            }
        }
    });
    let mut times = Vec::new();
    for _ in 0..=request.repeats.max(8) {
        let start = Instant::now();
        to_peer
            .send(activation.clone())
            .map_err(|_| TrainError::invariant("profiling the send: the peer thread stopped"))?;
        back_in
            .recv()
            .map_err(|_| TrainError::invariant("profiling the send: the peer thread stopped"))?;
        times.push(start.elapsed().as_secs_f64() / 2.0);
    }
    drop(to_peer);
    peer.join()
        .map_err(|_| TrainError::invariant("profiling the send: the peer thread panicked"))?;
    Ok(SendProfile {
        bytes,
        seconds: median(times[1..].to_vec()),
    })
}

/// Measures every layer of `request.config` and one send, on the kernels' CPU primitives (what
/// [`StageModel::new`] computes on, as the trainer's stages do).
pub fn measure_profile(request: &ProfileRequest) -> Result<Profile, TrainError> {
    measure_profile_on(request, Arc::new(CpuPrimitives::new()))
}

/// Measures every layer of `request.config` and one send on `ops`: the layers compute through
/// them and every input is made on their device.
pub fn measure_profile_on(
    request: &ProfileRequest,
    ops: Arc<dyn Primitives>,
) -> Result<Profile, TrainError> {
    if request.repeats == 0 {
        return Err(TrainError::invalid(
            "profile repeats",
            0,
            "at least one timed run per figure",
        ));
    }
    let config = request.config;
    let model = model_layers(&config);
    let layers = model
        .iter()
        .enumerate()
        .map(|(index, &layer)| measure_layer(request, &ops, index, layer))
        .collect::<Result<Vec<_>, _>>()?;
    let blocks = model
        .iter()
        .filter(|layer| layer.placement() == Placement::Any)
        .count();
    Ok(Profile {
        format: PROFILE_FORMAT.to_string(),
        model: GptProfileModel {
            blocks,
            d_model: config.d_model(),
            heads: config.n_head(),
            vocab: config.vocab_size(),
            seq_len: request.seq_len,
            microbatch_size: request.microbatch_size,
            experts: config.moe().map_or(0, |moe| moe.experts()),
            top_k: config.moe().map_or(0, |moe| moe.top_k()),
        }
        .describe(request.dtype),
        threads_per_rank: request.threads_per_rank,
        repeats: request.repeats,
        calibrated: false,
        layers,
        send: measure_send(request, ops.device())?,
        runtime: None,
        action_seconds: None,
    })
}

/// Scales `profile`'s layer times to what a training run measured: for every position of `cut`
/// and every op kind (F, I, W), the median measured duration of that kind at the position's
/// stages over the sum of the position's layers alone; each layer keeps its share. Positions
/// or kinds the run did not measure keep their figures. Marks the profile calibrated.
pub fn calibrate(
    profile: &mut Profile,
    cut: &ModelCut,
    measured: &[Vec<MeasuredOp>],
) -> Result<(), TrainError> {
    let counts = cut.layers_per_position();
    // The layer indices of each position: the embedding on the first, the head on the last.
    let members = profile.stage_layers(&counts).map_err(|e| {
        TrainError::invariant(format!(
            "calibrating a profile of {} blocks on a cut of {}: {e}",
            profile.free_layers(),
            counts.iter().sum::<usize>()
        ))
    })?;
    type Pick = fn(&mut LayerProfile) -> &mut f64;
    type HalfPick = fn(&mut PhaseTimes) -> &mut f64;
    type IsKind = fn(&Task) -> bool;
    let kinds: [(IsKind, Pick, HalfPick); 3] = [
        (
            |t| matches!(t, Task::Forward(_)),
            |l| &mut l.forward,
            |h| &mut h.forward,
        ),
        (
            |t| matches!(t, Task::InputGrad(_)),
            |l| &mut l.input_grad,
            |h| &mut h.input_grad,
        ),
        (
            |t| matches!(t, Task::WeightGrad(_)),
            |l| &mut l.weight_grad,
            |h| &mut h.weight_grad,
        ),
    ];
    for (k, layers) in members.iter().enumerate() {
        for (is_kind, pick, half_pick) in kinds {
            let durations: Vec<f64> = measured
                .iter()
                .flatten()
                .filter(|op| is_kind(&op.task) && cut.position(op.work.stage) == Some(k))
                .map(|op| op.end - op.start)
                .collect();
            if durations.is_empty() {
                continue;
            }
            let run = median(durations);
            let alone: f64 = layers.clone().map(|i| *pick(&mut profile.layers[i])).sum();
            if alone <= 0.0 {
                continue;
            }
            let factor = run / alone;
            for i in layers.clone() {
                let layer = &mut profile.layers[i];
                *pick(layer) *= factor;
                // The half-length time keeps its ratio to the full one.
                if let Some(half) = layer.half_length.as_mut() {
                    *half_pick(half) *= factor;
                }
            }
        }
    }
    profile.calibrated = true;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::TOLERANCE;

    /// A small model's request: `blocks` blocks of width 32, 2 sequences of 16 tokens.
    fn request(blocks: usize, repeats: usize) -> ProfileRequest {
        ProfileRequest {
            config: GptConfig::new(blocks, 32, 2, 16).unwrap(),
            microbatch_size: 2,
            seq_len: 16,
            dtype: DType::F32,
            threads_per_rank: 1,
            repeats,
            seed: 5,
        }
    }

    #[test]
    fn a_profile_lists_every_layer_with_positive_times_and_cuts_like_the_trainer() {
        let profile = measure_profile(&request(3, 3)).unwrap();
        profile.validate().unwrap();
        let names: Vec<&str> = profile.layers.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            ["embedding", "block.0", "block.1", "block.2", "head"]
        );
        for layer in &profile.layers {
            assert!(layer.forward > 0.0 && layer.weight_grad > 0.0, "{layer:?}");
            assert!(layer.weight_grad_bytes > 0, "{layer:?}");
        }
        // A block keeps more than its input; the embedding needs no input gradient.
        let block = &profile.layers[1];
        assert!(block.activation_bytes > 2 * 16 * 32 * 4, "{block:?}");
        assert!(block.input_grad > 0.0);
        assert_eq!(profile.send.bytes, 2 * 16 * 32 * 4);
        let text = profile.to_json();
        assert_eq!(Profile::from_json(&text).unwrap(), profile);
        // The embedding first, the blocks anywhere, the head last; the model described as ours.
        let placements: Vec<LayerPlacement> = profile.layers.iter().map(|l| l.placement).collect();
        use LayerPlacement::{Any, First, Last};
        assert_eq!(placements, [First, Any, Any, Any, Last]);
        assert_eq!(profile.free_layers(), 3);
        let gpt = GptProfileModel::of(&profile).unwrap();
        assert_eq!((gpt.blocks, gpt.d_model, gpt.heads), (3, 32, 2));
        assert_eq!((gpt.seq_len, gpt.microbatch_size), (16, 2));
        assert_eq!(profile.model.name.as_deref(), Some("gpt"));
        assert_eq!(profile.model.extra["blocks"], serde_json::json!(3));
        // Another model's profile, or one without the sizes, is not ours.
        let mut other = profile.clone();
        other.model.name = Some("resnet".into());
        assert_eq!(GptProfileModel::of(&other), None);
        let mut bare = profile.clone();
        bare.model.extra.remove("heads");
        assert_eq!(GptProfileModel::of(&bare), None);
        let mut short = profile.clone();
        short.layers.remove(1);
        assert_eq!(GptProfileModel::of(&short), None);
    }

    #[test]
    fn calibration_scales_each_position_to_the_run_and_keeps_the_split() {
        use pipeweave_core::{MicrobatchId, StageId, Work};
        let request = request(2, 1);
        let config = request.config;
        let mut profile = measure_profile(&request).unwrap();
        let alone = profile.clone();
        let problem = pipeweave_core::testing::problem(2, 2);
        let cut = ModelCut::with_layers(&config, &problem, Some(&[1, 1])).unwrap();
        let op = |task: fn(Work) -> Task, stage: u32, m: u32, seconds: f64| {
            let work = Work {
                stage: StageId::new(stage),
                microbatch: MicrobatchId::new(m),
            };
            MeasuredOp {
                task: task(work),
                work,
                start: 1.0,
                end: 1.0 + seconds,
            }
        };
        // Stage 0's forwards took 2 s (median of 1, 2, 3); nothing else was measured.
        let measured = vec![vec![
            op(Task::Forward, 0, 0, 1.0),
            op(Task::Forward, 0, 1, 2.0),
            op(Task::Forward, 0, 1, 3.0),
        ]];
        calibrate(&mut profile, &cut, &measured).unwrap();
        assert!(profile.calibrated);
        let stage0 = profile.layers[0].forward + profile.layers[1].forward;
        assert!((stage0 - 2.0).abs() < TOLERANCE, "{stage0}");
        let share = |p: &Profile| p.layers[1].forward / (p.layers[0].forward + p.layers[1].forward);
        assert!((share(&profile) - share(&alone)).abs() < TOLERANCE);
        // Unmeasured kinds and positions keep their figures.
        assert_eq!(profile.layers[1].input_grad, alone.layers[1].input_grad);
        assert_eq!(profile.layers[3].forward, alone.layers[3].forward);
    }
}
