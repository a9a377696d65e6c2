//! Tests of [`StageModel`]: the whole model against candle's autograd, recomputation, stage
//! splits, initialisation, naming and typed errors.

use candle_core::{DType, Device, Tensor};

use super::*;
use crate::layers::CrossEntropy;
use crate::oracle;
use crate::testing::{
    assert_bit_identical, assert_close, assert_matches, assert_parameter_gradients,
    invalid_argument, random, random_ids, root_cause, shape_error, DTYPES,
};

pub(super) const PAD: u32 = 256;

pub(super) fn config() -> GptConfig {
    GptConfig::new(2, 8, 2, 8).unwrap()
}

/// The stage of `blocks` (global indices), after the embedding and before the head where asked:
/// a span of the model's layers `[embedding, blocks.., head]`.
pub(super) fn stage_layout(
    config: &GptConfig,
    embedding: bool,
    blocks: Range<usize>,
    head: bool,
) -> StageLayout {
    let start = if embedding { 0 } else { 1 + blocks.start };
    let end = if head {
        config.n_layer() + 2
    } else {
        1 + blocks.end
    };
    StageLayout::new(config, start..end).unwrap()
}

/// The whole model of [`config`] in one stage, initialised from `seed`.
fn whole_model(seed: u64, dtype: DType) -> StageModel {
    StageModel::new(config(), StageLayout::whole_model(&config()), seed, dtype).unwrap()
}

/// Asserts the two gradient lists hold the same number of tensors, each with the same bits.
fn assert_all_bit_identical(what: &str, actual: &[Tensor], expected: &[Tensor]) {
    assert_eq!(actual.len(), expected.len(), "{what}: counts differ");
    for (a, b) in expected.iter().zip(actual) {
        assert_bit_identical(what, b, a);
    }
}

/// Token ids `[2, 6]` and targets with three padding positions.
pub(super) fn batch() -> (Tensor, Tensor) {
    let ids = random_ids(11, &[2, 6], 256);
    let mut targets = random_ids(12, &[12], 256).to_vec1::<u32>().unwrap();
    for pad_at in [4, 5, 11] {
        targets[pad_at] = PAD;
    }
    (
        ids,
        Tensor::from_vec(targets, (2, 6), &Device::Cpu).unwrap(),
    )
}

/// Loss sum, counted tokens and gradients of a whole step through `stages` in order.
pub(super) struct Step {
    pub(super) loss_sum: f64,
    pub(super) grads: Vec<Tensor>,
}

pub(super) fn step(
    stages: &[&StageModel],
    ids: &Tensor,
    targets: &Tensor,
    normalizer: f64,
) -> Step {
    let mut activation = ids.clone();
    let mut saved = Vec::new();
    for stage in stages {
        let (output, state) = stage.forward(&activation).unwrap();
        saved.push(state);
        activation = output;
    }
    let ops = stages[0].primitives();
    let loss = CrossEntropy::new(Some(PAD))
        .loss_and_grad(ops, &activation, targets, normalizer)
        .unwrap();
    let mut grad = Some(loss.grad_logits);
    let mut pending = Vec::new();
    for (stage, state) in stages.iter().zip(saved).rev() {
        let grad_output = grad
            .take()
            .expect("only the first stage returns no input gradient");
        let (grad_input, weight_state) = stage.backward_input(state, &grad_output).unwrap();
        grad = grad_input;
        pending.push(weight_state);
    }
    let mut grads = Vec::new();
    for (stage, weight_state) in stages.iter().zip(pending.into_iter().rev()) {
        grads.extend(stage.backward_weight(weight_state).unwrap());
    }
    let loss_sum = loss
        .loss_sum
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    Step { loss_sum, grads }
}

/// The whole model written with candle ops on `params` (in stage order): summed loss.
fn oracle_loss_sum(params: &[Tensor], ids: &Tensor, targets: &Tensor, n_head: usize) -> Tensor {
    let mut hidden = oracle::embedding(ids, &params[0], &params[1]).unwrap();
    for block in params[2..params.len() - 3].chunks(12) {
        hidden = oracle::block(&hidden, block, n_head).unwrap();
    }
    let n = params.len();
    let logits = oracle::head(&hidden, &params[n - 3], &params[n - 2], &params[n - 1]).unwrap();
    let vocab = logits.dims()[2];
    let rows = logits.reshape(((), vocab)).unwrap();
    let flat = targets.flatten_all().unwrap();
    let mask = flat.ne(PAD).unwrap().to_dtype(logits.dtype()).unwrap();
    let safe = flat.minimum(vocab as u32 - 1).unwrap();
    oracle::cross_entropy_sum(&rows, &safe, &mask).unwrap()
}

#[test]
fn whole_model_matches_candle_autograd() {
    let (ids, targets) = batch();
    let normalizer = 9.0;
    for dtype in DTYPES {
        let model = whole_model(7, dtype);
        let ours = step(&[&model], &ids, &targets, normalizer);

        let named = model.parameters();
        let tensors: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
        let vars = oracle::vars(&tensors);
        let var_tensors: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let loss_sum = oracle_loss_sum(&var_tensors, &ids, &targets, 2);
        let grads = (&loss_sum / normalizer).unwrap().backward().unwrap();

        let ours_loss = Tensor::new(ours.loss_sum, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        assert_close("StageModel loss sum", &ours_loss, &loss_sum);
        let names = model.parameter_names();
        assert_parameter_gradients("StageModel", &names, &ours.grads, &grads, &vars);
    }
}

#[test]
fn recompute_is_bit_identical() {
    let (ids, targets) = batch();
    for dtype in DTYPES {
        let model = whole_model(3, dtype);
        let recomputing = model.clone().with_recompute(true);
        let plain = step(&[&model], &ids, &targets, 9.0);
        let again = step(&[&recomputing], &ids, &targets, 9.0);
        assert_eq!(plain.loss_sum.to_bits(), again.loss_sum.to_bits());
        assert_all_bit_identical("recomputed weight gradient", &again.grads, &plain.grads);

        // A middle stage: the input gradient too.
        let layout = stage_layout(&config(), false, 0..2, false);
        let middle = StageModel::new(config(), layout, 3, dtype).unwrap();
        let input = random(5, &[2, 6, 8], 1.0, dtype);
        let grad_output = random(6, &[2, 6, 8], 1.0, dtype);
        let run = |stage: &StageModel| {
            let (_, saved) = stage.forward(&input).unwrap();
            let (grad_input, pending) = stage.backward_input(saved, &grad_output).unwrap();
            (grad_input.unwrap(), stage.backward_weight(pending).unwrap())
        };
        let (dx, dw) = run(&middle);
        let (dx_again, dw_again) = run(&middle.clone().with_recompute(true));
        assert_bit_identical("recomputed input gradient", &dx_again, &dx);
        assert_all_bit_identical("recomputed weight gradient", &dw_again, &dw);
    }
}

#[test]
fn dropped_and_offloaded_states_give_bit_identical_gradients() {
    for dtype in DTYPES {
        for (embedding, head) in [(true, false), (false, false), (false, true)] {
            let layout = stage_layout(&config(), embedding, 0..2, head);
            let stage = StageModel::new(config(), layout, 3, dtype).unwrap();
            let input = if embedding {
                random_ids(4, &[2, 6], 256)
            } else {
                random(5, &[2, 6, 8], 1.0, dtype)
            };
            let out_dims = if head { [2, 6, 256] } else { [2, 6, 8] };
            let grad_output = random(6, &out_dims, 1.0, dtype);
            let finish = |saved: StageSaved| {
                let (grad_input, pending) = stage.backward_input(saved, &grad_output).unwrap();
                (grad_input, stage.backward_weight(pending).unwrap())
            };
            let (_, saved) = stage.forward(&input).unwrap();
            let kept_bytes = saved.held_bytes();
            let (dx, dw) = finish(saved);

            // Dropped to the input, then recomputed.
            let checkpoint = stage.checkpoint(&input);
            assert!(checkpoint.is_checkpoint());
            assert!(checkpoint.held_bytes() < kept_bytes);
            let (dx_r, dw_r) = finish(stage.recompute_state(checkpoint).unwrap());

            // Copied to the host and back.
            let (_, saved) = stage.forward(&input).unwrap();
            let host = saved.to_host().unwrap();
            assert!(host.bytes() > 0 && host.bytes() <= kept_bytes * 2);
            let back = host.to_device().unwrap();
            assert_eq!(back.held_bytes(), kept_bytes);
            let (dx_o, dw_o) = finish(back);

            for other in [&dx_r, &dx_o] {
                match (&dx, other) {
                    (Some(a), Some(b)) => assert_bit_identical("input gradient", b, a),
                    (None, None) => {}
                    _ => panic!("input gradients differ in presence"),
                }
            }
            for other in [&dw_r, &dw_o] {
                assert_all_bit_identical("weight gradient", other, &dw);
            }
        }
    }
}

#[test]
fn two_stages_equal_one() {
    let (ids, targets) = batch();
    for dtype in DTYPES {
        let whole = whole_model(5, dtype);
        let first = stage_layout(&config(), true, 0..1, false);
        let last = stage_layout(&config(), false, 1..2, true);
        let stage_0 = StageModel::new(config(), first, 5, dtype).unwrap();
        let stage_1 = StageModel::new(config(), last, 5, dtype).unwrap();

        let split_names = [stage_0.parameter_names(), stage_1.parameter_names()].concat();
        assert_eq!(split_names, whole.parameter_names());
        let one = step(&[&whole], &ids, &targets, 9.0);
        let two = step(&[&stage_0, &stage_1], &ids, &targets, 9.0);
        assert_eq!(one.loss_sum.to_bits(), two.loss_sum.to_bits());
        assert_all_bit_identical("split-stage gradient", &two.grads, &one.grads);
    }
}

#[test]
fn microbatch_gradients_sum_to_the_batch_gradient() {
    let model = whole_model(9, DType::F64);
    let (ids, targets) = batch();
    let normalizer =
        crate::layers::count_non_padding(model.primitives(), &targets, Some(PAD)).unwrap() as f64;
    let full = step(&[&model], &ids, &targets, normalizer);
    let half = |t: &Tensor, i: usize| t.narrow(0, i, 1).unwrap();
    let parts: Vec<Step> = (0..2)
        .map(|i| step(&[&model], &half(&ids, i), &half(&targets, i), normalizer))
        .collect();
    let loss_sum = parts[0].loss_sum + parts[1].loss_sum;
    assert!((loss_sum - full.loss_sum).abs() <= 1e-12 * full.loss_sum.abs());
    for (i, expected) in full.grads.iter().enumerate() {
        let summed = (&parts[0].grads[i] + &parts[1].grads[i]).unwrap();
        assert_close("sum of microbatch gradients", &summed, expected);
    }
}

#[test]
fn padding_targets_do_not_change_gradients() {
    let model = whole_model(9, DType::F64);
    let (ids, targets) = batch();
    let with_pad = step(&[&model], &ids, &targets, 9.0);
    // Changing the *inputs* at positions after the last real target of a row cannot matter
    // (causal attention), so the padded tail may hold anything.
    let mut tail_changed = ids.to_vec2::<u32>().unwrap();
    tail_changed[1][5] = 42;
    let tail_changed = Tensor::new(tail_changed, &Device::Cpu).unwrap();
    let changed = step(&[&model], &tail_changed, &targets, 9.0);
    assert_eq!(with_pad.loss_sum.to_bits(), changed.loss_sum.to_bits());
    for (name, (a, b)) in model
        .parameter_names()
        .iter()
        .zip(with_pad.grads.iter().zip(&changed.grads))
    {
        if name == "transformer.wte.weight" || name == "transformer.wpe.weight" {
            continue; // the embedding rows of the changed token differ, with zero gradient
        }
        assert_close(&format!("padded tail d({name})"), b, a);
    }
}

#[test]
fn same_seed_gives_the_same_weights_for_any_split() {
    let config = GptConfig::new(4, 8, 2, 8).unwrap();
    let whole = StageModel::new(config, StageLayout::whole_model(&config), 1, DType::F32).unwrap();
    let middle = StageModel::new(
        config,
        stage_layout(&config, false, 2..4, false),
        1,
        DType::F32,
    )
    .unwrap();
    let by_name: std::collections::HashMap<String, Tensor> =
        whole.parameters().into_iter().collect();
    for (name, tensor) in middle.parameters() {
        assert!(name.starts_with("transformer.h.2.") || name.starts_with("transformer.h.3."));
        assert_bit_identical(&name, &tensor, &by_name[&name]);
    }
    let reseeded =
        StageModel::new(config, StageLayout::whole_model(&config), 2, DType::F32).unwrap();
    let wte = |m: &StageModel| m.parameters().remove(0).1;
    assert_ne!(
        crate::testing::values(&wte(&whole)),
        crate::testing::values(&wte(&reseeded))
    );
}

#[test]
fn initialisation_follows_gpt2() {
    let config = GptConfig::new(8, 64, 4, 16).unwrap();
    let model = StageModel::new(config, StageLayout::whole_model(&config), 0, DType::F64).unwrap();
    let std_of = |t: &Tensor| {
        let v = crate::testing::values(t);
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
    };
    for (name, tensor) in model.parameters() {
        let v = crate::testing::values(&tensor);
        if name.ends_with(".bias") {
            assert!(v.iter().all(|&x| x == 0.0), "{name}");
        } else if name.contains("ln_") {
            assert!(v.iter().all(|&x| x == 1.0), "{name}");
        } else {
            let expected = match name.ends_with("c_proj.weight") {
                true => 0.02 / 4.0, // 0.02 / sqrt(2 * 8)
                false => 0.02,
            };
            let std = std_of(&tensor);
            assert!(
                (std / expected - 1.0).abs() < 0.1,
                "{name}: std {std}, expected {expected}"
            );
        }
    }
}

#[test]
fn parameter_shapes_are_the_parameters_without_values() {
    let config = GptConfig::new(3, 8, 2, 8).unwrap();
    for layout in [
        StageLayout::whole_model(&config),
        StageLayout::new(&config, 2..5).unwrap(),
    ] {
        let model = StageModel::new(config, layout.clone(), 0, DType::F32).unwrap();
        let expected: Vec<(String, Vec<usize>)> = model
            .parameters()
            .into_iter()
            .map(|(name, t)| (name, t.dims().to_vec()))
            .collect();
        assert_eq!(
            StageModel::parameter_shapes(&config, &layout).unwrap(),
            expected
        );
    }
}

#[test]
fn names_use_global_block_indices() {
    let config = GptConfig::new(4, 8, 2, 8).unwrap();
    let layout = stage_layout(&config, false, 2..4, true);
    let names = StageModel::new(config, layout, 0, DType::F32)
        .unwrap()
        .parameter_names();
    assert_eq!(names.len(), 2 * 12 + 3);
    assert_eq!(names[0], "transformer.h.2.ln_1.weight");
    assert_eq!(names[12 + 2], "transformer.h.3.attn.c_attn.weight");
    assert_eq!(
        names[24..],
        [
            "transformer.ln_f.weight",
            "transformer.ln_f.bias",
            "lm_head.weight"
        ]
    );
    let first = stage_layout(&config, true, 0..0, false);
    let names = StageModel::new(config, first, 0, DType::F32)
        .unwrap()
        .parameter_names();
    assert_eq!(names, ["transformer.wte.weight", "transformer.wpe.weight"]);
}

#[test]
fn a_stage_without_layers_passes_through() {
    let layout = stage_layout(&config(), false, 1..1, false);
    let empty = StageModel::new(config(), layout, 0, DType::F64).unwrap();
    let input = random(1, &[2, 3, 8], 1.0, DType::F64);
    let (output, saved) = empty.forward(&input).unwrap();
    assert_bit_identical("identity forward", &output, &input);
    let (grad_input, pending) = empty.backward_input(saved, &input).unwrap();
    assert_bit_identical("identity backward", &grad_input.unwrap(), &input);
    assert!(empty.backward_weight(pending).unwrap().is_empty());
}

#[test]
fn set_parameters_replaces_and_validates() {
    let mut model = whole_model(0, DType::F64);
    let mut values: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    values[3] = values[3].affine(2.0, 1.0).unwrap();
    model.set_parameters(values.clone()).unwrap();
    assert_bit_identical("replaced", &model.parameters()[3].1, &values[3]);

    let err = model.set_parameters(values[1..].to_vec()).unwrap_err();
    assert_matches!(err, KernelError::ParameterCount { .. });
    let mut wrong = values.clone();
    wrong[4] = random(1, &[3], 1.0, DType::F64);
    let err = model.set_parameters(wrong).unwrap_err();
    assert!(
        err.to_string().contains(&model.parameter_names()[4]),
        "{err}"
    );
    assert_matches!(root_cause(&err), KernelError::Shape { .. }, err);
    let mut wrong = values;
    wrong[0] = wrong[0].to_dtype(DType::F32).unwrap();
    let err = model.set_parameters(wrong).unwrap_err();
    assert_matches!(root_cause(&err), KernelError::DType { .. }, err);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let whole = whole_model(0, DType::F32);
    let bad_id = Tensor::new(&[[3u32, 256, 1]], &Device::Cpu).unwrap();
    let err = whole.forward(&bad_id).unwrap_err();
    assert!(err.to_string().contains("transformer.wte/wpe"), "{err}");
    assert_matches!(
        root_cause(&err),
        KernelError::TokenOutOfRange { id: 256, .. },
        err
    );
    let too_long = random_ids(1, &[1, 9], 256);
    let err = whole.forward(&too_long).unwrap_err();
    assert_matches!(
        root_cause(&err),
        KernelError::SequenceTooLong { seq_len: 9, .. },
        err
    );

    let layout = stage_layout(&config(), false, 0..2, true);
    let rest = StageModel::new(config(), layout, 0, DType::F32).unwrap();
    let err = rest
        .forward(&random(1, &[2, 3, 7], 1.0, DType::F32))
        .unwrap_err();
    assert_eq!(shape_error(&err), ("StageModel", "input"));
    let err = rest
        .forward(&random(1, &[2, 9, 8], 1.0, DType::F32))
        .unwrap_err();
    assert_matches!(err, KernelError::SequenceTooLong { .. });
    let err = rest
        .forward(&random(1, &[2, 3, 8], 1.0, DType::F64))
        .unwrap_err();
    assert_matches!(err, KernelError::DType { .. });

    let (logits, saved) = rest
        .forward(&random(1, &[2, 3, 8], 1.0, DType::F32))
        .unwrap();
    let wrong_grad = random(2, &[2, 3, 8], 1.0, DType::F32);
    let err = rest.backward_input(saved, &wrong_grad).unwrap_err();
    assert!(
        err.to_string().contains("transformer.ln_f/lm_head"),
        "{err}"
    );
    assert_eq!(
        shape_error(root_cause(&err)),
        ("Head", "grad_output"),
        "{err}"
    );

    let (_, foreign) = whole.forward(&random_ids(1, &[2, 3], 256)).unwrap();
    let err = rest.backward_input(foreign, &logits).unwrap_err();
    assert_eq!(invalid_argument(&err), "saved");

    let err = StageLayout::new(&config(), 2..5).unwrap_err();
    assert_eq!(invalid_argument(&err), "layers");
    let err =
        StageModel::new(config(), StageLayout::whole_model(&config()), 0, DType::U32).unwrap_err();
    assert_eq!(invalid_argument(&err), "dtype");
    let err = GptConfig::new(2, 10, 4, 8).unwrap_err();
    assert_eq!(invalid_argument(&err), "n_head");
}
