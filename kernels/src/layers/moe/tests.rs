//! Tests of [`Moe`] and its phases: gradients against candle's autograd, the load-balancing
//! loss, the top-k's ties, determinism, sharded phases against the layer, and the errors.

use candle_core::{DType, Tensor};

use super::oracle::{check_with_aux, moe as moe_oracle};
use super::*;
use crate::testing::{assert_bit_identical, assert_matches, ops, random, values, DTYPES};

/// A configuration the tests use (hidden width 8, aux coefficient 0.1).
fn config(experts: usize, top_k: usize) -> MoeConfig {
    MoeConfig::new(experts, top_k, 8, 0.1).unwrap()
}

/// Random parameters of a mixture of width `d`, in the layer's order, from `seed`.
pub(crate) fn params(d: usize, config: &MoeConfig, dtype: DType, seed: u64) -> Vec<Tensor> {
    let (e, h) = (config.experts(), config.hidden());
    let mut p = vec![
        random(seed, &[d, e], 1.0, dtype),
        random(seed + 1, &[e], 0.5, dtype),
    ];
    for expert in 0..e as u64 {
        let seed = seed + 10 * (expert + 1);
        p.push(random(seed, &[d, h], 0.5, dtype));
        p.push(random(seed + 1, &[h], 0.5, dtype));
        p.push(random(seed + 2, &[h, d], 0.5, dtype));
        p.push(random(seed + 3, &[d], 0.5, dtype));
    }
    p
}

/// The mixture of `config` from `params`'s values.
pub(crate) fn build(p: &[Tensor], config: &MoeConfig) -> Moe {
    let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
    let experts = (0..config.experts())
        .map(|e| Mlp::new(linear(2 + 4 * e), linear(4 + 4 * e)).unwrap())
        .collect();
    Moe::new(*config, linear(0), experts).unwrap()
}

/// `params` with the router's weight zero and its bias `bias`: every token routed alike.
fn constant_routing(p: &[Tensor], bias: &[f64]) -> Vec<Tensor> {
    let mut p = p.to_vec();
    p[0] = p[0].zeros_like().unwrap();
    p[1] = Tensor::new(bias, &candle_core::Device::Cpu).unwrap();
    p
}

#[test]
fn matches_candle_autograd() {
    for dtype in DTYPES {
        for (experts, top_k) in [(4, 2), (3, 1), (4, 4), (5, 3)] {
            let config = config(experts, top_k);
            let p = params(4, &config, dtype, 1);
            let input = random(5, &[2, 3, 4], 1.0, dtype);
            let name = format!("Moe E={experts} k={top_k}");
            check_with_aux(
                &name,
                &build(&p, &config),
                &input,
                &p,
                MoeSaved::aux_loss,
                |x, p| moe_oracle(x, p, &config),
            );
        }
    }
}

#[test]
fn an_expert_without_tokens_gets_zero_gradients() {
    let config = config(4, 2);
    let mut p = params(4, &config, DType::F64, 2);
    let starved = [0.0, 0.0, 0.0, -40.0];
    p[1] = (&p[1] + Tensor::new(&starved[..], &candle_core::Device::Cpu).unwrap()).unwrap();
    let layer = build(&p, &config);
    let input = random(6, &[2, 3, 4], 1.0, DType::F64);
    check_with_aux(
        "Moe starved",
        &layer,
        &input,
        &p,
        MoeSaved::aux_loss,
        |x, p| moe_oracle(x, p, &config),
    );
    let (output, saved) = layer.forward(&ops(), &input).unwrap();
    assert_eq!(saved.routing().load()[3], 0);
    let (_, pending) = layer.backward_input(&ops(), saved, &output).unwrap();
    let grads = layer.backward_weight(&ops(), pending).unwrap();
    assert!(grads[2 + 12..]
        .iter()
        .all(|g| values(g).iter().all(|&v| v == 0.0)));
}

#[test]
fn aux_loss_matches_a_direct_computation() {
    let ops = ops();
    let input = random(7, &[3, 4], 1.0, DType::F64);
    // Every token routed alike: f_e is 1/k on the top-k, P_e is softmax(bias)_e.
    for (top_k, bias, chosen) in [
        (1, [0.0, 1.0, 0.0, 0.0], vec![1]),
        (2, [2.0, 1.0, 0.0, 0.5], vec![0, 1]),
        (2, [0.0; 4], vec![0, 1]),
    ] {
        let config = config(4, top_k);
        let layer = build(
            &constant_routing(&params(4, &config, DType::F64, 3), &bias),
            &config,
        );
        let (routing, _) = layer.route(&ops, &input).unwrap();
        let exps: Vec<f64> = bias.iter().map(|b| b.exp()).collect();
        let p: Vec<f64> = exps.iter().map(|e| e / exps.iter().sum::<f64>()).collect();
        let direct = 0.1 * 4.0 * chosen.iter().map(|&e| p[e] / top_k as f64).sum::<f64>();
        assert!(
            (routing.aux_loss() - direct).abs() < 1e-15,
            "{top_k} {bias:?}"
        );
    }
    // Uniform probabilities give the coefficient itself.
    let config = config(4, 2);
    let uniform = build(
        &constant_routing(&params(4, &config, DType::F64, 3), &[0.0; 4]),
        &config,
    );
    assert!((uniform.route(&ops, &input).unwrap().0.aux_loss() - 0.1).abs() < 1e-15);

    // Random routing: the loss from the routing's own probabilities and choices.
    let layer = build(&params(4, &config, DType::F64, 4), &config);
    let input = random(8, &[2, 5, 4], 1.0, DType::F64);
    let (routing, _) = layer.route(&ops, &input).unwrap();
    let tokens = routing.tokens() as f64;
    let direct: f64 = (0..4)
        .map(|e| {
            let routed = (0..routing.tokens())
                .filter(|&t| routing.assignment(t).any(|(chosen, _)| chosen == e))
                .count() as f64;
            let mean = (0..routing.tokens())
                .map(|t| routing.probabilities(t)[e])
                .sum::<f64>();
            routed / (2.0 * tokens) * mean / tokens
        })
        .sum::<f64>()
        * 0.1
        * 4.0;
    assert!((routing.aux_loss() - direct).abs() < 1e-14);
}

#[test]
fn top_k_breaks_ties_to_the_lower_expert_and_renormalises() {
    let config = config(4, 3);
    let layer = build(
        &constant_routing(&params(4, &config, DType::F64, 3), &[0.0, 1.0, 0.0, 0.0]),
        &config,
    );
    let (routing, _) = layer
        .route(&ops(), &random(9, &[5, 4], 1.0, DType::F64))
        .unwrap();
    let (e, one) = (std::f64::consts::E, 1.0);
    let total = e + 2.0 * one;
    for token in 0..5 {
        let assignment: Vec<(usize, f64)> = routing.assignment(token).collect();
        let experts: Vec<usize> = assignment.iter().map(|&(x, _)| x).collect();
        assert_eq!(experts, [1, 0, 2]);
        let weights: Vec<f64> = assignment.iter().map(|&(_, w)| w).collect();
        for (w, expected) in weights.iter().zip([e / total, one / total, one / total]) {
            assert!((w - expected).abs() < 1e-15);
        }
    }
    assert_eq!(routing.load(), [5, 5, 5, 0]);
    assert_eq!(routing.tokens_of(2), [0, 1, 2, 3, 4]);
}

#[test]
fn dispatch_groups_rows_by_expert_then_token() {
    let config = config(4, 2);
    let layer = build(&params(4, &config, DType::F64, 5), &config);
    let input = random(10, &[2, 3, 4], 1.0, DType::F64);
    let (routing, _) = layer.route(&ops(), &input).unwrap();
    let token_rows = input.reshape((6, 4)).unwrap();
    for shard in ExpertShard::all(2, 4).unwrap() {
        let rows = layer.dispatch(&ops(), &input, &routing, shard).unwrap();
        let experts: Vec<usize> = rows.iter().map(ExpertRows::expert).collect();
        let expected: Vec<usize> = shard.held().filter(|&e| routing.load()[e] > 0).collect();
        assert_eq!(experts, expected);
        for part in &rows {
            let tokens = routing.tokens_of(part.expert());
            assert!(tokens.windows(2).all(|w| w[0] < w[1]));
            for (i, token) in tokens.into_iter().enumerate() {
                let want = token_rows.get(token).unwrap();
                assert_bit_identical("dispatched row", &part.rows().get(i).unwrap(), &want);
            }
        }
    }
}

/// What a run of the layer gives: output, input gradient, weight gradients.
pub(crate) type Run = (Tensor, Tensor, Vec<Tensor>);

/// The layer's forward and backward through [`Layer`].
pub(crate) fn run_layer(layer: &Moe, input: &Tensor, grad: &Tensor) -> Run {
    let ops = ops();
    let (output, saved) = layer.forward(&ops, input).unwrap();
    let (grad_input, pending) = layer.backward_input(&ops, saved, grad).unwrap();
    (
        output,
        grad_input,
        layer.backward_weight(&ops, pending).unwrap(),
    )
}

/// The same through the public phases with the experts on `ranks` expert-parallel ranks, each
/// running only its shard's bank; the ranks' rows arrive last rank first.
fn run_sharded(layer: &Moe, input: &Tensor, grad: &Tensor, ranks: usize) -> Run {
    let ops = ops();
    let shards = ExpertShard::all(ranks, layer.config().experts()).unwrap();
    let banks: Vec<ExpertBank> = shards
        .iter()
        .map(|&s| layer.shard_bank(s).unwrap())
        .collect();
    let (routing, router) = layer.route(&ops, input).unwrap();
    let mut outputs = Vec::new();
    let mut saved = Vec::new();
    for (shard, bank) in shards.iter().zip(&banks).rev() {
        let rows = layer.dispatch(&ops, input, &routing, *shard).unwrap();
        let (rank_outputs, rank_saved) = bank.forward(&ops, &rows).unwrap();
        outputs.extend(rank_outputs);
        saved.insert(0, rank_saved);
    }
    let (output, combine) = layer.combine(&ops, &routing, &outputs).unwrap();

    let (grad_outputs, grad_weights) = layer
        .combine_backward(&ops, &routing, combine, grad)
        .unwrap();
    let mut grad_rows = Vec::new();
    let mut pending = Vec::new();
    for ((shard, bank), rank_saved) in shards.iter().zip(&banks).zip(saved).rev() {
        let mine: Vec<ExpertRows> = grad_outputs
            .iter()
            .filter(|part| shard.holds(part.expert()))
            .cloned()
            .collect();
        let (rank_rows, rank_pending) = bank.backward_input(&ops, rank_saved, &mine).unwrap();
        grad_rows.extend(rank_rows);
        pending.insert(0, rank_pending);
    }
    let from_experts = layer.dispatch_backward(&ops, &routing, &grad_rows).unwrap();
    let (from_router, router) = layer
        .route_backward(&ops, &routing, router, &grad_weights)
        .unwrap();
    let grad_input = ops.add(&from_experts, &from_router).unwrap();
    let mut grads = layer.router_backward_weight(&ops, router).unwrap();
    for (bank, rank_pending) in banks.iter().zip(pending) {
        grads.extend(bank.backward_weight(&ops, rank_pending).unwrap());
    }
    (output, grad_input, grads)
}

/// Asserts two runs hold the same bits.
pub(crate) fn assert_same_run(what: &str, actual: &Run, expected: &Run) {
    assert_bit_identical(&format!("{what} output"), &actual.0, &expected.0);
    assert_bit_identical(&format!("{what} d(input)"), &actual.1, &expected.1);
    assert_eq!(actual.2.len(), expected.2.len(), "{what}: gradient count");
    for (i, (a, e)) in actual.2.iter().zip(&expected.2).enumerate() {
        assert_bit_identical(&format!("{what} gradient {i}"), a, e);
    }
}

/// A mixture of 4 experts (top-2) of width 16, an input of 32 tokens and an output gradient:
/// what the tests of its shards run.
pub(crate) fn sharded_case(dtype: DType) -> (Moe, Tensor, Tensor) {
    let config = MoeConfig::new(4, 2, 32, 0.01).unwrap();
    let layer = build(&params(16, &config, dtype, 6), &config);
    let input = random(11, &[4, 8, 16], 1.0, dtype);
    let grad = random(12, &[4, 8, 16], 1.0, dtype);
    (layer, input, grad)
}

#[test]
fn phases_on_any_number_of_shards_give_the_layers_bits() {
    for dtype in DTYPES {
        let (layer, input, grad) = sharded_case(dtype);
        let whole = run_layer(&layer, &input, &grad);
        for ranks in [1, 2, 4] {
            let sharded = run_sharded(&layer, &input, &grad, ranks);
            assert_same_run(&format!("{dtype:?} on {ranks} ranks"), &sharded, &whole);
        }
    }
}

#[test]
fn runs_are_deterministic() {
    let config = config(4, 2);
    let layer = build(&params(8, &config, DType::F32, 7), &config);
    let input = random(13, &[2, 6, 8], 1.0, DType::F32);
    let grad = random(14, &[2, 6, 8], 1.0, DType::F32);
    let (first, second) = (
        run_layer(&layer, &input, &grad),
        run_layer(&layer, &input, &grad),
    );
    assert_same_run("second run", &second, &first);
    let routing = |l: &Moe| l.route(&ops(), &input).unwrap().0;
    assert_eq!(routing(&layer), routing(&layer));
}

#[test]
fn parameter_names_are_the_router_then_each_expert() {
    let config = config(2, 1);
    let names: Vec<String> = build(&params(4, &config, DType::F64, 1), &config)
        .parameters()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let mut expected = vec!["router.weight".to_string(), "router.bias".to_string()];
    for e in 0..2 {
        for part in ["c_fc.weight", "c_fc.bias", "c_proj.weight", "c_proj.bias"] {
            expected.push(format!("experts.{e}.{part}"));
        }
    }
    assert_eq!(names, expected);
    let shard = ExpertShard::new(1, 2, 2).unwrap();
    let bank = build(&params(4, &config, DType::F64, 1), &config)
        .shard_bank(shard)
        .unwrap();
    assert_eq!(bank.parameters()[0].0, "1.c_fc.weight");
}

#[test]
fn phases_reject_rows_that_do_not_match_the_routing() {
    let ops = ops();
    let config = config(4, 2);
    let layer = build(&params(4, &config, DType::F64, 8), &config);
    let input = random(15, &[2, 3, 4], 1.0, DType::F64);
    let (routing, _) = layer.route(&ops, &input).unwrap();
    let shards = ExpertShard::all(2, 4).unwrap();
    let rows = layer.dispatch(&ops, &input, &routing, shards[0]).unwrap();
    let (outputs, _) = layer.experts(&ops, &rows).unwrap();
    // One rank's outputs only: the other rank's experts are missing.
    let err = layer.combine(&ops, &routing, &outputs).unwrap_err();
    assert_matches!(
        err,
        KernelError::ExpertRowsMismatch {
            phase: "combine",
            ..
        }
    );
    assert!(
        err.to_string()
            .starts_with("Moe::combine: the rows of expert"),
        "{err}"
    );
    let twice: Vec<ExpertRows> = outputs.iter().chain(&outputs).cloned().collect();
    let err = layer.dispatch_backward(&ops, &routing, &twice).unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    // A bank does not run experts it does not hold.
    let other = layer.shard_bank(shards[1]).unwrap();
    let err = other.forward(&ops, &rows).unwrap_err();
    assert_matches!(
        err,
        KernelError::ExpertRowsMismatch {
            phase: "experts",
            ..
        }
    );
    // A shard of another mixture.
    let foreign = ExpertShard::new(0, 2, 6).unwrap();
    assert!(layer.dispatch(&ops, &input, &routing, foreign).is_err());
    assert!(layer.shard_bank(foreign).is_err());
}

#[test]
fn rejects_parts_that_do_not_agree() {
    let config = config(4, 2);
    let p = params(4, &config, DType::F64, 9);
    let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
    let experts = |n: usize| -> Vec<Mlp> {
        (0..n)
            .map(|e| Mlp::new(linear(2 + 4 * e), linear(4 + 4 * e)).unwrap())
            .collect()
    };
    let err = Moe::new(config, linear(0), experts(3)).unwrap_err();
    assert_matches!(err, KernelError::ParameterCount { .. });
    let wider = MoeConfig::new(4, 2, 16, 0.1).unwrap();
    let err = Moe::new(wider, linear(0), experts(4)).unwrap_err();
    assert_matches!(err, KernelError::Shape { layer: "Moe", .. });
    let five = MoeConfig::new(5, 2, 8, 0.1).unwrap();
    let err = Moe::new(five, linear(0), experts(4)).unwrap_err();
    assert_matches!(
        err,
        KernelError::Shape {
            tensor: "router.weight",
            ..
        }
    );
    let layer = build(&p, &config);
    let wrong = random(1, &[2, 3, 5], 1.0, DType::F64);
    assert_matches!(
        layer.forward(&ops(), &wrong).unwrap_err(),
        KernelError::Shape { .. }
    );
}
