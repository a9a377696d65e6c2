//! The profile's tests: reading and writing the file (both formats), its checks, and the
//! figures of cuts and layouts it gives through its layer table.

use super::*;
use crate::ir::facts::tests::placed;
use crate::ir::layers::LayerLayout;
use serde_json::json;

fn layer(name: &str, placement: LayerPlacement, f: f64, bytes: u64) -> LayerProfile {
    LayerProfile {
        name: name.to_string(),
        placement,
        forward: f,
        input_grad: f,
        weight_grad: f / 2.0,
        backward: None,
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
    let model = ProfiledModel {
        name: Some("toy".to_string()),
        seq_len: Some(32),
        microbatch_size: Some(2),
        dtype: Some("f32".to_string()),
        extra,
    };
    let send = SendProfile {
        bytes: 64,
        seconds: 0.01,
    };
    Profile {
        model,
        repeats: 3,
        layers,
        send,
        ..plain(0)
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
        runtime: None,
        action_seconds: None,
    }
}

/// Why [`profile`] with layer `k` placed `placement` is refused.
fn refusal_with(k: usize, placement: LayerPlacement) -> String {
    let mut p = profile();
    p.layers[k].placement = placement;
    p.validate().unwrap_err().to_string()
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
    let p = profile();
    // The V placement on 2 ranks: rank 0 holds positions 0 and 3, rank 1 positions 1 and 2.
    let v = placed(2, vec![0, 1, 1, 0]);
    let shares = LayerLayout::new(p.table().unwrap(), Some(vec![1, 3]), 3100.0).unwrap();
    assert_eq!(shares.positions_of(&v), Some(vec![1, 2, 1, 0]));
    let (costs, memory) = shares.stages_of(&v).unwrap().unwrap();
    // Position 0: the first-placed layer and a free one; 1: two; 2: one; 3: the last alone.
    let forwards: Vec<f64> = costs.iter().map(|c| c.forward()).collect();
    assert_eq!(forwards, [1.5, 2.0, 1.0, 3.0]);
    assert_eq!(memory[3].total(), 2000.0 / 3100.0);
    assert_eq!(memory[0].total(), 1100.0 / 3100.0);
    // Without counts, the free layers even over the positions (as the trainer cuts them).
    let even = LayerLayout::new(p.table().unwrap(), None, 3100.0).unwrap();
    assert_eq!(even.positions_of(&v), Some(vec![1, 1, 1, 1]));
    // Interleaved: rank 0 holds positions 0 and 2, so one free layer for it leaves
    // position 2 (between the first and the last) empty.
    let interleaved = placed(2, vec![0, 1, 0, 1]);
    let err = shares.stages_of(&interleaved).unwrap_err().to_string();
    assert!(
        err.contains("spread over the 4 positions of this layout is 1,2,0,1"),
        "{err}"
    );
    // Nothing pinned: every position needs a layer of its own.
    let plain = LayerLayout::new(plain(6).table().unwrap(), Some(vec![0, 6]), 1.0).unwrap();
    let err = plain.stages_of(&v).unwrap_err().to_string();
    assert!(err.contains("leaves stage 0 empty"), "{err}");
    let plain = LayerLayout::new(self::plain(6).table().unwrap(), None, 1.0).unwrap();
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
    // A layer placed last in the middle.
    let err = refusal_with(2, LayerPlacement::Last);
    assert!(
        err.contains("layer 3 (`layer.2`) is placed `any` after layer 2 (`layer.1`) placed `last`"),
        "{err}"
    );
    // A layer placed first after a free one.
    let err = refusal_with(3, LayerPlacement::First);
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

#[test]
fn a_measured_full_backward_and_the_runtimes_action_cost_price_each_stage() {
    let mut p = plain(4);
    for layer in &mut p.layers {
        layer.backward = Some(layer.input_grad * 1.25);
    }
    p.runtime = Some("pytorch".to_string());
    p.action_seconds = Some(0.5);
    let back = Profile::from_json(&p.to_json()).unwrap();
    assert_eq!(back, p);
    let cut = p.cut(&[1, 3]).unwrap();
    // Layer k: F = I = k + 1, W = (k + 1) / 2, B = 1.25 (k + 1); each action + 0.5.
    let first = cut.costs[0];
    assert_eq!(
        (
            first.forward(),
            first.input_grad(),
            first.weight_grad(),
            first.full_backward()
        ),
        (1.5, 1.5, 1.0, 1.75)
    );
    let second = cut.costs[1];
    assert_eq!(second.full_backward(), 1.25 * 9.0 + 0.5);
    // Without a measured backward for every layer of a stage, B is the split's I + W.
    p.layers[0].backward = None;
    let cut = p.cut(&[2, 2]).unwrap();
    let first = cut.costs[0];
    assert_eq!(
        first.full_backward(),
        first.input_grad() + first.weight_grad()
    );
    // Bad figures are named.
    p.action_seconds = Some(-1.0);
    assert!(p
        .validate()
        .unwrap_err()
        .to_string()
        .contains("action seconds = -1"));
    p.action_seconds = None;
    p.layers[1].backward = Some(f64::NAN);
    assert!(p
        .validate()
        .unwrap_err()
        .to_string()
        .contains("backward = NaN"));
}
