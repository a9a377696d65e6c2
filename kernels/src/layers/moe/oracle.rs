//! The test oracle of a [`super::Moe`]: the mixture written densely with ordinary candle ops
//! (every expert on every token, weighted by a renormalised masked softmax that is zero off the
//! top-k) and differentiated by candle's autograd. Independent of the layer's phases: its top-k
//! is picked by repeated arg-max, not by a sort.

use candle_core::{DType, Device, Result, Tensor};

use crate::config::MoeConfig;
use crate::oracle::{linear, mlp, softmax};

/// For each row of `probs` (`[N, E]`), a 0/1 mask of its `k` largest entries (ties to the lower
/// index).
fn top_k_mask(probs: &Tensor, top_k: usize) -> Result<Vec<f64>> {
    let rows = probs.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    let mut mask = Vec::new();
    for row in rows {
        let mut picked = vec![0.0; row.len()];
        for _ in 0..top_k {
            let mut best: Option<usize> = None;
            for (e, &p) in row.iter().enumerate() {
                if picked[e] == 0.0 && best.is_none_or(|b| p > row[b]) {
                    best = Some(e);
                }
            }
            picked[best.expect("top_k is at most the number of experts")] = 1.0;
        }
        mask.extend(picked);
    }
    Ok(mask)
}

/// The mixture on `x: [.., d]` with parameters `[router.w, router.b, then per expert c_fc.w,
/// c_fc.b, c_proj.w, c_proj.b]`: `(output, aux)`, `aux` the scaled load-balancing loss (a
/// rank-0 tensor).
pub(crate) fn moe(x: &Tensor, p: &[Tensor], config: &MoeConfig) -> Result<(Tensor, Tensor)> {
    let (experts, top_k) = (config.experts(), config.top_k());
    let width = x.dims()[x.rank() - 1];
    let tokens = x.elem_count() / width;
    let rows = x.reshape((tokens, width))?;
    let probs = softmax(&linear(&rows, &p[0], &p[1])?)?;
    let mask_values = top_k_mask(&probs, top_k)?;
    let mask = Tensor::from_vec(mask_values.clone(), (tokens, experts), &Device::Cpu)?
        .to_dtype(x.dtype())?;
    let kept = (&probs * &mask)?;
    let weights = kept.broadcast_div(&kept.sum_keepdim(1)?)?;
    let mut output = rows.zeros_like()?;
    for e in 0..experts {
        let expert = mlp(&rows, &p[2 + 4 * e..6 + 4 * e])?;
        output = (output + expert.broadcast_mul(&weights.narrow(1, e, 1)?)?)?;
    }
    let fractions: Vec<f64> = (0..experts)
        .map(|e| {
            let load: f64 = mask_values.iter().skip(e).step_by(experts).sum();
            load / (tokens * top_k) as f64
        })
        .collect();
    let fractions = Tensor::from_vec(fractions, experts, &Device::Cpu)?.to_dtype(x.dtype())?;
    let balance = (probs.mean(0)? * fractions)?.sum_all()?;
    let aux = (balance * (config.aux_coefficient() * experts as f64))?;
    Ok((output.reshape(x.dims())?, aux))
}

/// Checks a layer whose backward differentiates `L + aux` (a [`super::Moe`], or a layer holding
/// one) against candle's autograd on `oracle(input, params) = (output, aux)`, with a random
/// output gradient: the output, the aux loss (`aux_of` the forward's state), the input gradient
/// and every parameter's gradient. `params` are the layer's parameter values in its order.
pub(crate) fn check_with_aux<L: crate::layers::Layer<InputGrad = Tensor>>(
    name: &str,
    layer: &L,
    input: &Tensor,
    params: &[Tensor],
    aux_of: impl Fn(&L::Saved) -> f64,
    oracle: impl Fn(&Tensor, &[Tensor]) -> Result<(Tensor, Tensor)>,
) {
    use crate::testing::{check_against_oracle, GRAD_SEED};
    let oracle = |x: &Tensor, p: &[Tensor]| oracle(x, p).map(|(y, aux)| (y, Some(aux)));
    check_against_oracle(name, layer, input, params, GRAD_SEED, oracle, Some(&aux_of));
}
