//! Test helpers: seeded random tensors, relative errors, the split backward of a layer run end
//! to end, and error-cause unwrapping.

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};

use crate::error::KernelError;
use crate::init::{NormalSampler, SplitMix64};
use crate::layers::model::InputGradient;
use crate::layers::Layer;
use crate::primitives::CpuPrimitives;

/// The dtypes every oracle test runs in.
pub(crate) const DTYPES: [DType; 2] = [DType::F64, DType::F32];

/// The primitive ops under test.
pub(crate) fn ops() -> CpuPrimitives {
    CpuPrimitives::new()
}

/// The required relative agreement with the oracle: 1e-10 in f64, 1e-5 in f32.
pub(crate) fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-10,
        _ => 1e-5,
    }
}

/// A tensor of `N(0, std²)` values drawn from `seed`.
pub(crate) fn random(seed: u64, shape: &[usize], std: f64, dtype: DType) -> Tensor {
    let mut sampler = NormalSampler::new(seed);
    let count = shape.iter().product();
    let values: Vec<f64> = (0..count).map(|_| std * sampler.next_normal()).collect();
    Tensor::from_vec(values, shape, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .expect("test tensor shapes are consistent")
}

/// A U32 tensor of ids uniform in `0..limit` drawn from `seed`.
pub(crate) fn random_ids(seed: u64, shape: &[usize], limit: u32) -> Tensor {
    let mut rng = SplitMix64::new(seed);
    let count = shape.iter().product();
    let values: Vec<u32> = (0..count)
        .map(|_| (rng.next_u64() % u64::from(limit)) as u32)
        .collect();
    Tensor::from_vec(values, shape, &Device::Cpu).expect("test tensor shapes are consistent")
}

/// The values of a float tensor as f64.
pub(crate) fn values(t: &Tensor) -> Vec<f64> {
    t.flatten_all()
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_vec1::<f64>())
        .expect("test tensors are float tensors")
}

/// `max|a - b| / max(max|b|, tiny)`: the error relative to the expected tensor's scale.
pub(crate) fn relative_error(actual: &Tensor, expected: &Tensor) -> f64 {
    assert_eq!(
        actual.dims(),
        expected.dims(),
        "compared tensors differ in shape"
    );
    let (a, b) = (values(actual), values(expected));
    let max_diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    let scale = b.iter().map(|y| y.abs()).fold(f64::MIN_POSITIVE, f64::max);
    max_diff / scale
}

/// Asserts `actual` agrees with `expected` to the dtype's tolerance; prints and returns the error.
pub(crate) fn assert_close(what: &str, actual: &Tensor, expected: &Tensor) -> f64 {
    let error = relative_error(actual, expected);
    let tol = tolerance(expected.dtype());
    println!(
        "max relative error {what} ({:?}): {error:.3e}",
        expected.dtype()
    );
    assert!(error <= tol, "{what}: relative error {error:e} > {tol:e}");
    error
}

/// Asserts the two tensors hold the same bits.
pub(crate) fn assert_bit_identical(what: &str, actual: &Tensor, expected: &Tensor) {
    assert_eq!(actual.dims(), expected.dims(), "{what}: shapes differ");
    let (a, b) = (values(actual), values(expected));
    let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(same, "{what}: not bit-identical");
}

/// What a layer's split backward produced: output, input gradient, weight gradients.
pub(crate) struct SplitRun<G> {
    pub output: Tensor,
    pub grad_input: G,
    pub grad_weights: Vec<Tensor>,
}

/// Runs forward, backward_input and backward_weight of `layer` on `input` and `grad_output`.
pub(crate) fn run_split<L: Layer>(
    layer: &L,
    input: &Tensor,
    grad_output: impl Fn(&Tensor) -> Tensor,
) -> SplitRun<L::InputGrad> {
    run_split_inspecting(layer, input, grad_output, |_| {})
}

/// [`run_split`], showing `inspect` the forward's state before the backward consumes it.
pub(crate) fn run_split_inspecting<L: Layer>(
    layer: &L,
    input: &Tensor,
    grad_output: impl Fn(&Tensor) -> Tensor,
    inspect: impl FnOnce(&L::Saved),
) -> SplitRun<L::InputGrad> {
    let ops = ops();
    let (output, saved) = layer.forward(&ops, input).expect("forward");
    inspect(&saved);
    let grad = grad_output(&output);
    let (grad_input, pending) = layer
        .backward_input(&ops, saved, &grad)
        .expect("backward_input");
    let grad_weights = layer
        .backward_weight(&ops, pending)
        .expect("backward_weight");
    SplitRun {
        output,
        grad_input,
        grad_weights,
    }
}

/// Asserts that `$value` matches `$pattern`; on failure shows `$shown` (by default the value, a
/// [`KernelError`]): `assert_matches!(root_cause(&err), KernelError::Shape { .. }, err)`.
macro_rules! assert_matches {
    ($value:expr, $pattern:pat $(,)?) => {{
        let value = &$value;
        assert!(matches!(value, $pattern), "{value}");
    }};
    ($value:expr, $pattern:pat, $shown:expr $(,)?) => {
        assert!(matches!($value, $pattern), "{}", $shown)
    };
}
pub(crate) use assert_matches;

/// The `(layer, tensor)` a [`KernelError::Shape`] names; fails the test on any other error.
pub(crate) fn shape_error(err: &KernelError) -> (&'static str, &'static str) {
    match err {
        KernelError::Shape { layer, tensor, .. } => (layer, tensor),
        other => panic!("expected a shape error, got: {other}"),
    }
}

/// The `(layer, tensor)` a [`KernelError::DType`] names; fails the test on any other error.
pub(crate) fn dtype_error(err: &KernelError) -> (&'static str, &'static str) {
    match err {
        KernelError::DType { layer, tensor, .. } => (layer, tensor),
        other => panic!("expected a dtype error, got: {other}"),
    }
}

/// The field a [`KernelError::InvalidArgument`] names; fails the test on any other error.
pub(crate) fn invalid_argument(err: &KernelError) -> &'static str {
    match err {
        KernelError::InvalidArgument { field, .. } => field,
        other => panic!("expected an invalid argument, got: {other}"),
    }
}

/// The innermost error under any [`KernelError::At`] wrappers.
pub(crate) fn root_cause(error: &KernelError) -> &KernelError {
    match error {
        KernelError::At { source, .. } => root_cause(source),
        other => other,
    }
}

/// The seed of the random output gradient of [`check_layer_against_oracle`].
pub(crate) const GRAD_SEED: u64 = 0x5EED;

/// Checks a layer's output, input gradient and weight gradients against candle's autograd on
/// `oracle(input, params)`, with a random output gradient; returns the largest relative error.
/// `params` are the layer's parameter values in its order.
pub(crate) fn check_layer_against_oracle<L: Layer>(
    name: &str,
    layer: &L,
    input: &Tensor,
    params: &[Tensor],
    oracle: impl Fn(&Tensor, &[Tensor]) -> candle_core::Result<Tensor>,
) -> f64
where
    L::InputGrad: InputGradient,
{
    check_layer_against_oracle_seeded(name, layer, input, params, GRAD_SEED, oracle)
}

/// As [`check_layer_against_oracle`], with the output gradient drawn from `grad_seed`. An input
/// that is not a float tensor (token ids) is not differentiated, and the layer must return no
/// input gradient for it.
pub(crate) fn check_layer_against_oracle_seeded<L: Layer>(
    name: &str,
    layer: &L,
    input: &Tensor,
    params: &[Tensor],
    grad_seed: u64,
    oracle: impl Fn(&Tensor, &[Tensor]) -> candle_core::Result<Tensor>,
) -> f64
where
    L::InputGrad: InputGradient,
{
    let oracle = |x: &Tensor, p: &[Tensor]| Ok((oracle(x, p)?, None));
    check_against_oracle(name, layer, input, params, grad_seed, oracle, None)
}

/// The auxiliary loss a layer adds to the loss it differentiates (a mixture's load balancing):
/// its value, from the forward's state.
pub(crate) type AuxOf<'a, S> = &'a dyn Fn(&S) -> f64;

/// [`check_layer_against_oracle_seeded`] of a layer whose backward differentiates `L + aux`
/// where `aux_of` is given: `oracle(input, params) = (output, aux)`, `aux` a rank-0 tensor
/// (`None` without `aux_of`), and the aux loss is checked too.
pub(crate) fn check_against_oracle<L: Layer>(
    name: &str,
    layer: &L,
    input: &Tensor,
    params: &[Tensor],
    grad_seed: u64,
    oracle: impl Fn(&Tensor, &[Tensor]) -> candle_core::Result<(Tensor, Option<Tensor>)>,
    aux_of: Option<AuxOf<'_, L::Saved>>,
) -> f64
where
    L::InputGrad: InputGradient,
{
    let input_var = input
        .dtype()
        .is_float()
        .then(|| crate::oracle::vars(std::slice::from_ref(input)).remove(0));
    let oracle_input = input_var.as_ref().map_or(input, |var| var.as_tensor());
    let param_vars = crate::oracle::vars(params);
    let param_tensors: Vec<Tensor> = param_vars.iter().map(|v| v.as_tensor().clone()).collect();
    let (expected, aux) = oracle(oracle_input, &param_tensors).expect("oracle forward");
    let grad_output = random(grad_seed, expected.dims(), 1.0, expected.dtype());
    let grads = (&expected * &grad_output)
        .and_then(|t| t.sum_all())
        .and_then(|loss| match &aux {
            Some(aux) => loss + aux,
            None => Ok(loss),
        })
        .and_then(|loss| loss.backward())
        .expect("oracle backward");
    let mut actual_aux = None;
    let run = run_split_inspecting(
        layer,
        input,
        |_| grad_output.clone(),
        |saved| {
            actual_aux = aux_of.map(|aux_of| aux_of(saved));
        },
    );
    if let Some(actual) = actual_aux {
        assert_aux_close(name, actual, aux.as_ref().expect("the oracle's aux loss"));
    }
    let mut worst = assert_close(&format!("{name} output"), &run.output, &expected);
    match (run.grad_input.into_gradient(), &input_var) {
        (Some(actual), Some(var)) => {
            let expected_dx = grads.get(var.as_tensor()).expect("input gradient");
            let what = format!("{name} d(input)");
            worst = worst.max(assert_close(&what, &actual, expected_dx));
        }
        (None, None) => {}
        _ => panic!("{name}: an input gradient exactly for a float input"),
    }
    let names: Vec<String> = layer.parameters().into_iter().map(|(n, _)| n).collect();
    let param_worst =
        assert_parameter_gradients(name, &names, &run.grad_weights, &grads, &param_vars);
    worst.max(param_worst)
}

/// Asserts a layer's aux loss agrees with the oracle's (a rank-0 tensor) to its dtype's
/// tolerance.
fn assert_aux_close(name: &str, actual: f64, expected: &Tensor) {
    let expected_value = expected
        .to_dtype(DType::F64)
        .and_then(|t| t.to_scalar::<f64>())
        .expect("a rank-0 float tensor");
    let error = (actual - expected_value).abs() / expected_value.abs().max(f64::MIN_POSITIVE);
    println!("relative error {name} aux loss: {error:.3e}");
    assert!(
        error <= tolerance(expected.dtype()),
        "{name} aux loss: {actual} vs the oracle's {expected_value}"
    );
}

/// Checks a layer with heads (width 8, 2 heads), built by `build(params, n_head)` from
/// `params(width, dtype)`, against candle's autograd on `oracle(input, params, n_head)` in every
/// dtype, on a random `[2, 5, 8]` input.
pub(crate) fn check_multi_head_layer<L: Layer<InputGrad = Tensor>>(
    name: &str,
    params: impl Fn(usize, DType) -> Vec<Tensor>,
    build: impl Fn(&[Tensor], usize) -> L,
    oracle: impl Fn(&Tensor, &[Tensor], usize) -> candle_core::Result<Tensor>,
) {
    for dtype in DTYPES {
        let (d, n_head) = (8, 2);
        let p = params(d, dtype);
        let input = random(5, &[2, 5, d], 1.0, dtype);
        check_layer_against_oracle(name, &build(&p, n_head), &input, &p, |x, p| {
            oracle(x, p, n_head)
        });
    }
}

/// Asserts `actual` holds one gradient per parameter (`names`, `vars`: in order), each agreeing
/// with candle's gradient of the parameter's variable in `grads`; returns the largest relative
/// error.
pub(crate) fn assert_parameter_gradients(
    what: &str,
    names: &[String],
    actual: &[Tensor],
    grads: &GradStore,
    vars: &[Var],
) -> f64 {
    assert_eq!(
        actual.len(),
        vars.len(),
        "{what}: one gradient per parameter"
    );
    let mut worst = 0.0f64;
    for (name, (actual, var)) in names.iter().zip(actual.iter().zip(vars)) {
        let expected = grads.get(var.as_tensor()).expect("parameter gradient");
        worst = worst.max(assert_close(&format!("{what} d({name})"), actual, expected));
    }
    worst
}

/// Central finite differences of the scalar `loss` at `x` (f64), step `step`.
pub(crate) fn finite_difference(x: &Tensor, step: f64, loss: impl Fn(&Tensor) -> f64) -> Tensor {
    let base = values(x);
    let grad: Vec<f64> = (0..base.len())
        .map(|i| {
            let shifted = |delta: f64| {
                let mut v = base.clone();
                v[i] += delta;
                Tensor::from_vec(v, x.dims(), &Device::Cpu).expect("same shape")
            };
            (loss(&shifted(step)) - loss(&shifted(-step))) / (2.0 * step)
        })
        .collect();
    Tensor::from_vec(grad, x.dims(), &Device::Cpu).expect("same shape")
}

/// `Σ output ⊙ weights` as f64.
pub(crate) fn weighted_sum(output: &Tensor, weights: &Tensor) -> f64 {
    values(output)
        .iter()
        .zip(values(weights))
        .map(|(a, b)| a * b)
        .sum()
}

/// Asserts a finite-difference gradient agrees with an analytic one to `tol` relative.
pub(crate) fn assert_matches_finite_difference(
    what: &str,
    analytic: &Tensor,
    numeric: &Tensor,
    tol: f64,
) -> f64 {
    let error = relative_error(analytic, numeric);
    println!("max relative error {what} vs finite differences: {error:.3e}");
    assert!(error <= tol, "{what}: relative error {error:e} > {tol:e}");
    error
}
