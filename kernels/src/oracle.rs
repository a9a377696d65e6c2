//! The test oracle: GPT-2's layers written with ordinary candle ops, differentiated by candle's
//! own autograd (`Var` + `backward`). Independent of [`crate::primitives`] on purpose.

use candle_core::{Result, Tensor, Var, D};

/// Wraps each tensor as a fresh autograd variable.
pub(crate) fn vars(tensors: &[Tensor]) -> Vec<Var> {
    tensors
        .iter()
        .map(|t| Var::from_tensor(t).expect("a float tensor can be a variable"))
        .collect()
}

/// `x · w + b` over any leading dimensions.
pub(crate) fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.broadcast_matmul(w)?.broadcast_add(b)
}

/// Layer norm over the last dimension, eps 1e-5.
pub(crate) fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let mean = x.mean_keepdim(D::Minus1)?;
    let centered = x.broadcast_sub(&mean)?;
    let var = centered.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = centered.broadcast_div(&(var + 1e-5)?.sqrt()?)?;
    normed.broadcast_mul(w)?.broadcast_add(b)
}

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, spelled out.
pub(crate) fn gelu_new(x: &Tensor) -> Result<Tensor> {
    let cubic = (x.powf(3.0)? * 0.044715)?;
    let inner = ((x + cubic)? * (2.0 / std::f64::consts::PI).sqrt())?;
    (x * 0.5)? * (inner.tanh()? + 1.0)?
}

/// Softmax over the last dimension (the max shift is a constant for the gradient).
pub(crate) fn softmax(x: &Tensor) -> Result<Tensor> {
    let shifted = x.broadcast_sub(&x.max_keepdim(D::Minus1)?.detach())?;
    let exp = shifted.exp()?;
    exp.broadcast_div(&exp.sum_keepdim(D::Minus1)?)
}

/// Hugging Face's `GPT2Attention` forward (no dropout) on `x: [B, T, d]`.
pub(crate) fn attention(x: &Tensor, p: &[Tensor], n_head: usize) -> Result<Tensor> {
    let (batch, seq, width) = x.dims3()?;
    let head_dim = width / n_head;
    let qkv = linear(x, &p[0], &p[1])?;
    let heads = |i: usize| -> Result<Tensor> {
        qkv.narrow(2, i * width, width)?
            .reshape((batch, seq, n_head, head_dim))?
            .transpose(1, 2)?
            .contiguous()
    };
    let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
    let scores = (q.matmul(&k.t()?)? / (head_dim as f64).sqrt())?;
    let future: Vec<u8> = (0..seq * seq)
        .map(|i| u8::from(i % seq > i / seq))
        .collect();
    let future = Tensor::from_vec(future, (seq, seq), x.device())?.broadcast_as(scores.shape())?;
    let neg_inf =
        Tensor::full(f64::NEG_INFINITY, scores.shape(), x.device())?.to_dtype(x.dtype())?;
    let masked = future.where_cond(&neg_inf, &scores)?;
    let context = softmax(&masked)?.matmul(&v)?;
    let merged = context
        .transpose(1, 2)?
        .contiguous()?
        .reshape((batch, seq, width))?;
    linear(&merged, &p[2], &p[3])
}

/// GPT-2's MLP with parameters `[c_fc.w, c_fc.b, c_proj.w, c_proj.b]`.
pub(crate) fn mlp(x: &Tensor, p: &[Tensor]) -> Result<Tensor> {
    linear(&gelu_new(&linear(x, &p[0], &p[1])?)?, &p[2], &p[3])
}

/// GPT-2's block with its 12 parameters in Hugging Face order.
pub(crate) fn block(x: &Tensor, p: &[Tensor], n_head: usize) -> Result<Tensor> {
    let h = (x + attention(&layer_norm(x, &p[0], &p[1])?, &p[2..6], n_head)?)?;
    &h + mlp(&layer_norm(&h, &p[6], &p[7])?, &p[8..12])?
}

/// `wte[ids] + wpe[0..T]` for `ids: [B, T]`.
pub(crate) fn embedding(ids: &Tensor, wte: &Tensor, wpe: &Tensor) -> Result<Tensor> {
    let (batch, seq) = ids.dims2()?;
    let tokens = wte.index_select(&ids.flatten_all()?, 0)?;
    let tokens = tokens.reshape((batch, seq, wte.dim(1)?))?;
    tokens.broadcast_add(&wpe.narrow(0, 0, seq)?)
}

/// `ln_f(h) · lm_headᵀ`.
pub(crate) fn head(h: &Tensor, ln_w: &Tensor, ln_b: &Tensor, lm_head: &Tensor) -> Result<Tensor> {
    layer_norm(h, ln_w, ln_b)?.broadcast_matmul(&lm_head.t()?)
}

/// `Σ_i mask_i · (-log softmax(logits_i)[target_i])` for logits `[N, V]`.
pub(crate) fn cross_entropy_sum(
    logits: &Tensor,
    targets: &Tensor,
    mask: &Tensor,
) -> Result<Tensor> {
    let shifted = logits.broadcast_sub(&logits.max_keepdim(D::Minus1)?.detach())?;
    let log_probs = shifted.broadcast_sub(&shifted.exp()?.sum_keepdim(D::Minus1)?.log()?)?;
    let picked = log_probs.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?;
    picked.mul(mask)?.sum_all()?.neg()
}
