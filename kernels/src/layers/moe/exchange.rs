//! Phases 2 and 4 of a [`Moe`] and their backwards: the exchange of rows between the tokens and
//! the experts. [`Moe::dispatch`] gathers the rows each expert of a shard receives;
//! [`Moe::combine`] adds the experts' weighted outputs into their tokens' rows;
//! [`Moe::combine_backward`] and [`Moe::dispatch_backward`] do the reverse.
//!
//! The order is fixed by the routing alone: experts ascending, each expert's tokens ascending.
//! The combine (and the dispatch's backward) takes every expert's rows, from every shard, in
//! any order, puts them in that order and adds them into the token rows one after another, so
//! each token's sum is made in the same order for any number of expert-parallel ranks.

use candle_core::Tensor;

use super::experts::ExpertRows;
use super::routing::{Routing, RoutingGrad};
use super::{Moe, LAYER};
use crate::check;
use crate::config::ExpertShard;
use crate::error::{KernelError, Result};
use crate::layers::protocol::held_tensors;
use crate::primitives::Primitives;

/// What [`Moe::combine`] keeps: every expert's outputs, experts ascending (the gradient of a
/// routing weight is the product of its expert's output and the output gradient).
#[derive(Debug)]
pub struct CombineSaved {
    outputs: Vec<ExpertRows>,
}

impl Moe {
    /// Phase 2: the rows of `input` (the routed input, `[.., d]`) that each expert of `shard`
    /// receives: one [`ExpertRows`] per held expert with at least one token, experts ascending,
    /// each expert's tokens ascending ([`Routing::tokens_of`]).
    pub fn dispatch(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        routing: &Routing,
        shard: ExpertShard,
    ) -> Result<Vec<ExpertRows>> {
        self.check_routing(routing, "dispatch")?;
        self.check_shard(shard, "dispatch")?;
        check::named(LAYER, "input", input).shaped_like(routing.input_dims(), self.dtype())?;
        let rows = ops.reshape(input, &[routing.tokens(), self.width()])?;
        shard
            .held()
            .filter(|&expert| !routing.slots(expert).is_empty())
            .map(|expert| {
                let ids = token_ids(ops, routing, &[expert])?;
                Ok(ExpertRows::new(expert, ops.gather_rows(&rows, &ids)?))
            })
            .collect()
    }

    /// Phase 4: the output (the routed input's shape) from every expert's outputs (each
    /// `[n_e, d]`, the expert's tokens ascending; every expert with tokens exactly once, from
    /// any shard, in any order): each token's outputs times their weights, added experts
    /// ascending.
    pub fn combine(
        &self,
        ops: &dyn Primitives,
        routing: &Routing,
        outputs: &[ExpertRows],
    ) -> Result<(Tensor, CombineSaved)> {
        let outputs = self.in_expert_order(routing, outputs, "combine")?;
        let weighted = outputs
            .iter()
            .map(|part| scale_rows(ops, part.rows(), &weights(routing, part.expert())))
            .collect::<Result<Vec<_>>>()?;
        let output = self.add_into_tokens(ops, routing, &outputs, &weighted)?;
        let outputs = outputs.into_iter().cloned().collect();
        Ok((output, CombineSaved { outputs }))
    }

    /// The backward of phase 4: from the output gradient, the gradient of each expert's
    /// outputs (`weight · grad` of its tokens, experts ascending: to send back to the shards)
    /// and of each routing weight (`output · grad`, for [`Moe::route_backward`]).
    pub fn combine_backward(
        &self,
        ops: &dyn Primitives,
        routing: &Routing,
        saved: CombineSaved,
        grad_output: &Tensor,
    ) -> Result<(Vec<ExpertRows>, RoutingGrad)> {
        self.check_routing(routing, "combine_backward")?;
        check::grad_matches(LAYER, grad_output, routing.input_dims(), self.dtype())?;
        let grad_rows = ops.reshape(grad_output, &[routing.tokens(), self.width()])?;
        let mut grad_weights = vec![0.0; routing.tokens() * routing.top_k()];
        let mut grads = Vec::with_capacity(saved.outputs.len());
        for output in &saved.outputs {
            let expert = output.expert();
            let ids = token_ids(ops, routing, &[expert])?;
            let grad = ops.gather_rows(&grad_rows, &ids)?;
            let dots = row_dots(ops, &grad, output.rows())?;
            for (&slot, dot) in routing.slots(expert).iter().zip(dots) {
                grad_weights[slot] = dot;
            }
            let scaled = scale_rows(ops, &grad, &weights(routing, expert))?;
            grads.push(ExpertRows::new(expert, scaled));
        }
        Ok((grads, RoutingGrad::new(grad_weights)))
    }

    /// The backward of phase 2: the input gradient (the routed input's shape) from the
    /// gradients of every expert's rows (from any shard, in any order, as for
    /// [`Moe::combine`]), added into their tokens' rows experts ascending.
    pub fn dispatch_backward(
        &self,
        ops: &dyn Primitives,
        routing: &Routing,
        grads: &[ExpertRows],
    ) -> Result<Tensor> {
        let grads = self.in_expert_order(routing, grads, "dispatch_backward")?;
        let rows: Vec<Tensor> = grads.iter().map(|part| part.rows().clone()).collect();
        self.add_into_tokens(ops, routing, &grads, &rows)
    }

    /// `parts` put in expert order, checked against the routing: every expert with tokens
    /// exactly once, with `[n_e, d]` rows of the layer's dtype, and no other.
    fn in_expert_order<'a>(
        &self,
        routing: &Routing,
        parts: &'a [ExpertRows],
        phase: &'static str,
    ) -> Result<Vec<&'a ExpertRows>> {
        self.check_routing(routing, phase)?;
        let mut ordered: Vec<&ExpertRows> = parts.iter().collect();
        ordered.sort_by_key(|part| part.expert());
        let mismatch = |problem: String| KernelError::ExpertRowsMismatch { phase, problem };
        for pair in ordered.windows(2) {
            if pair[0].expert() == pair[1].expert() {
                return Err(mismatch(format!(
                    "expert {} appears twice",
                    pair[0].expert()
                )));
            }
        }
        let expected: Vec<usize> = (0..routing.experts())
            .filter(|&e| !routing.slots(e).is_empty())
            .collect();
        for (position, &expert) in expected.iter().enumerate() {
            match ordered.get(position).map(|part| part.expert()) {
                Some(found) if found == expert => {}
                Some(found) if found < expert => {
                    return Err(mismatch(format!(
                        "rows for expert {found}, which no token goes to"
                    )))
                }
                _ => return Err(mismatch(format!("the rows of expert {expert} are missing"))),
            }
        }
        if let Some(extra) = ordered.get(expected.len()) {
            let expert = extra.expert();
            return Err(mismatch(format!(
                "rows for expert {expert}, which no token goes to"
            )));
        }
        for part in &ordered {
            let count = routing.slots(part.expert()).len();
            check::named(LAYER, "expert rows", part.rows())
                .shaped_like(&[count, self.width()], self.dtype())?;
        }
        Ok(ordered)
    }

    /// `rows` (one tensor per part of `parts`, in expert order) added into a zero tensor of the
    /// routed input's shape at their tokens' rows, one after another.
    fn add_into_tokens(
        &self,
        ops: &dyn Primitives,
        routing: &Routing,
        parts: &[&ExpertRows],
        rows: &[Tensor],
    ) -> Result<Tensor> {
        let experts: Vec<usize> = parts.iter().map(|part| part.expert()).collect();
        let ids = token_ids(ops, routing, &experts)?;
        let rows = concat_rows(ops, rows, self.width())?;
        let sum = ops.scatter_add_rows(&rows, &ids, routing.tokens())?;
        ops.reshape(&sum, routing.input_dims())
    }
}

/// The tokens of `experts`, one expert after another, as a U32 tensor.
fn token_ids(ops: &dyn Primitives, routing: &Routing, experts: &[usize]) -> Result<Tensor> {
    let ids = experts
        .iter()
        .flat_map(|&e| routing.tokens_of(e))
        .map(|token| {
            u32::try_from(token).map_err(|_| KernelError::InvalidArgument {
                field: "tokens",
                value: routing.tokens().to_string(),
                reason: "a mixture of experts indexes its tokens with u32",
            })
        })
        .collect::<Result<Vec<u32>>>()?;
    ops.u32_tensor(&ids, &[ids.len()])
}

/// The weights of the slots routed to `expert`, by token.
fn weights(routing: &Routing, expert: usize) -> Vec<f64> {
    routing
        .slots(expert)
        .iter()
        .map(|&slot| routing.weight(slot))
        .collect()
}

/// `rows` (`[n, d]`) with row `i` times `factors[i]`: the factors spread over the rows by a
/// product with a row of ones (exact), then multiplied in.
fn scale_rows(ops: &dyn Primitives, rows: &Tensor, factors: &[f64]) -> Result<Tensor> {
    let width = rows.dims().last().copied().unwrap_or(1);
    let column = ops.float_tensor(factors, &[factors.len(), 1], rows.dtype())?;
    let ones = ops.float_tensor(&vec![1.0; width], &[1, width], rows.dtype())?;
    ops.mul(rows, &ops.matmul(&column, &ones)?)
}

/// The dot products of the rows of `a` and `b` (both `[n, d]`), on the host.
fn row_dots(ops: &dyn Primitives, a: &Tensor, b: &Tensor) -> Result<Vec<f64>> {
    let width = a.dims().last().copied().unwrap_or(1);
    let ones = ops.float_tensor(&vec![1.0; width], &[width, 1], a.dtype())?;
    ops.f64_values(&ops.matmul(&ops.mul(a, b)?, &ones)?)
}

/// The rows of `parts` (each `[n_i, width]`) one after another, `[Σ n_i, width]`.
fn concat_rows(ops: &dyn Primitives, parts: &[Tensor], width: usize) -> Result<Tensor> {
    if let [only] = parts {
        return Ok(only.clone());
    }
    let as_positions = parts
        .iter()
        .map(|part| ops.reshape(part, &[1, part.elem_count() / width, width]))
        .collect::<Result<Vec<_>>>()?;
    let joined = ops.concat_positions(&as_positions)?;
    ops.reshape(&joined, &[joined.elem_count() / width, width])
}

held_tensors!(mut CombineSaved { outputs });
