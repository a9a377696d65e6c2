//! The former profile format, `pipeweave-profile/1`: its document read and converted to the
//! current one ([`from_v1`]), with the former rules checked on the way. Profiles are never
//! written in it.

use super::{
    bad, LayerProfile, Profile, ProfiledModel, SendProfile, PROFILE_FORMAT, PROFILE_FORMAT_V1,
};
use crate::error::CoreError;
use crate::ir::layers::{LayerPlacement, PhaseTimes};
use serde::Deserialize;
use serde_json::{Map, Value};

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
pub(super) fn from_v1(document: Value) -> Result<Profile, CoreError> {
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
            backward: None,
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
        runtime: None,
        action_seconds: None,
    })
}
