//! Losses and gradients of a GPT trained through every schedule equal a single-rank run: bit for
//! bit with deterministic accumulation, within f32 rounding without it; recompute on and off.

mod common;
mod tiny_gpt;

use candle_core::{DType, Tensor};
use common::{plan, SCHEDULES};
use pipeweave_core::RecvPolicy;
use pipeweave_train::{GptModel, ModelCut, StepRunner};
use std::collections::BTreeMap;
use tiny_gpt::{batch, bits, config};

/// Loss and gradients by parameter name of one step of `expression`.
fn step(
    expression: &str,
    ranks: u32,
    recompute: bool,
    deterministic: bool,
) -> (f64, BTreeMap<String, Tensor>) {
    step_cut(expression, ranks, None, recompute, deterministic)
}

/// [`step`] with the blocks cut as `layers` says (one count per position).
fn step_cut(
    expression: &str,
    ranks: u32,
    layers: Option<&[usize]>,
    recompute: bool,
    deterministic: bool,
) -> (f64, BTreeMap<String, Tensor>) {
    let microbatches = 8;
    let plan = plan(expression, ranks, microbatches);
    let runner = StepRunner::new(&plan, RecvPolicy::Early, false).unwrap();
    let cut = ModelCut::with_layers(&config(), plan.problem(), layers).unwrap();
    let model = GptModel::on_cut(&config(), cut, 7, DType::F32, recompute, deterministic).unwrap();
    let outcome = model
        .step(&runner, &batch(microbatches as usize, 11))
        .unwrap();
    let mut grads = BTreeMap::new();
    for (k, position) in model.models().iter().enumerate() {
        for ((name, _), grad) in position.parameters().into_iter().zip(&outcome.gradients[k]) {
            grads.insert(name, grad.clone());
        }
    }
    (outcome.loss, grads)
}

/// The loss `l` and the gradients `grads` of the run `what` are `reference`'s (with its loss
/// `loss`), bit for bit.
fn assert_same_bits(
    what: &str,
    (l, grads): &(f64, BTreeMap<String, Tensor>),
    (loss, reference): &(f64, BTreeMap<String, Tensor>),
) {
    assert_eq!(l.to_bits(), loss.to_bits(), "{what}: loss {l} vs {loss}");
    assert_eq!(grads.len(), reference.len(), "{what}");
    for (name, g) in grads {
        assert_eq!(bits(g), bits(&reference[name]), "{what}: {name}");
    }
}

fn max_relative(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let scale = b
        .iter()
        .fold(0f32, |m, x| m.max(x.abs()))
        .max(f32::MIN_POSITIVE);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs() / scale)
        .fold(0f32, f32::max) as f64
}

#[test]
fn every_schedule_gives_the_single_rank_bits_when_deterministic() {
    let single = step("gpipe", 1, false, true);
    assert!(single.0.is_finite() && single.0 > 0.0);
    for &expression in SCHEDULES {
        for recompute in [false, true] {
            assert_same_bits(
                &format!("{expression} recompute={recompute}"),
                &step(expression, 4, recompute, true),
                &single,
            );
        }
    }
}

#[test]
fn every_cut_gives_the_single_rank_bits_when_deterministic() {
    let single = step("gpipe", 1, false, true);
    let cases: [(&str, u32, &[usize]); 6] = [
        ("f1b(gpipe)", 2, &[1, 3]),
        ("f1b(gpipe)", 2, &[4, 0]),
        ("zero_bubble(f1b(gpipe))", 4, &[0, 1, 1, 2]),
        ("f1b(gpipe)", 4, &[2, 1, 1, 0]),
        ("zero_bubble(dual(f1b(gpipe)))", 2, &[3, 1]),
        (
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
            2,
            &[0, 2, 1, 1],
        ),
    ];
    for (expression, ranks, layers) in cases {
        assert_same_bits(
            &format!("{expression} {layers:?}"),
            &step_cut(expression, ranks, Some(layers), false, true),
            &single,
        );
    }
}

#[test]
fn without_determinism_schedules_agree_within_f32_rounding() {
    let (loss, reference) = step("gpipe", 1, false, false);
    for &expression in SCHEDULES {
        let (l, grads) = step(expression, 4, false, false);
        assert!(
            (l - loss).abs() / loss < 1e-5,
            "{expression}: {l} vs {loss}"
        );
        for (name, g) in &grads {
            let e = max_relative(g, &reference[name]);
            assert!(e < 1e-5, "{expression}: {name} differs by {e}");
        }
    }
}

/// Per rank, the most activation bytes held at once in one step of `expression` on 4 ranks.
fn peaks(expression: &str, recompute: bool) -> Vec<usize> {
    let plan = plan(expression, 4, 8);
    let runner = StepRunner::new(&plan, RecvPolicy::Early, false).unwrap();
    let model = GptModel::new(&config(), plan.problem(), 7, DType::F32, recompute, false).unwrap();
    model
        .step(&runner, &batch(8, 11))
        .unwrap()
        .peak_activation_bytes
}

#[test]
fn measured_activation_memory_follows_the_schedule_and_recompute() {
    let gpipe = peaks("gpipe", false);
    let f1b = peaks("f1b(gpipe)", false);
    let recomputed = peaks("f1b(gpipe)", true);
    // 1F1B keeps at most P - r microbatches in flight on rank r, GPipe all 8.
    assert!(f1b[0] < gpipe[0], "{f1b:?} vs {gpipe:?}");
    assert!(f1b[3] < f1b[0], "{f1b:?}");
    // Recomputing keeps only each stage's input: less wherever several microbatches are in
    // flight; on the last rank (one at a time) the backward's own state dominates either way.
    for (r, (a, b)) in recomputed.iter().zip(&f1b).enumerate() {
        if r < 3 {
            assert!(a < b, "rank {r}: {a} with recompute, {b} without");
        } else {
            assert!(a <= b, "rank {r}: {a} with recompute, {b} without");
        }
    }
}
