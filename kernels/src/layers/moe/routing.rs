//! Phase 1 of a [`Moe`], the routing: `logits = x · W_r + b_r`, a softmax over the `E` experts,
//! each token's `k` most probable experts (ties to the lower index) with their probabilities
//! renormalised to sum 1 ([`Routing`]); and its backward, through the renormalisation, the
//! softmax and the load-balancing loss into the router ([`Moe::route_backward`]).
//!
//! Everything after the router's product runs on the host in f64 (`N x E` values), the
//! exponential from `libm`: the same choice for the same logits on every machine.

use candle_core::Tensor;

use super::{Moe, LAYER};
use crate::check;
use crate::config::MoeConfig;
use crate::error::{KernelError, Result};
use crate::layers::linear::{LinearPendingWeightGrad, LinearSaved};
use crate::layers::protocol::{held_tensors, Layer};
use crate::primitives::Primitives;

/// Where each token of a batch goes: its top-k experts (by descending probability, ties to the
/// lower index) with their renormalised weights, every router probability, and the
/// load-balancing loss. Tokens are the rows of the input (its leading dimensions flattened); a
/// token's `j`-th choice is its slot `j`.
#[derive(Debug, Clone, PartialEq)]
pub struct Routing {
    input_dims: Vec<usize>,
    experts: usize,
    top_k: usize,
    /// `[N, E]`, row-major.
    probabilities: Vec<f64>,
    /// `[N, k]`: each token's experts.
    chosen: Vec<usize>,
    /// `[N, k]`: their weights, summing to 1 per token.
    weights: Vec<f64>,
    /// Per expert, the slots (`token · k + j`) routed to it, by token.
    slots: Vec<Vec<usize>>,
    aux_coefficient: f64,
    aux_loss: f64,
}

/// The gradient of the loss w.r.t. each routing weight (`[N, k]`, the routing's slots), from
/// [`Moe::combine_backward`] for [`Moe::route_backward`].
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingGrad {
    slots: Vec<f64>,
}

/// What [`Moe::route`] keeps for the router's backward.
#[derive(Debug)]
pub struct RouterSaved {
    router: LinearSaved,
}

/// What [`Moe::router_backward_weight`] needs.
#[derive(Debug)]
pub struct RouterPending {
    router: LinearPendingWeightGrad,
}

impl Routing {
    /// The routing of `logits` (`[N, E]` row-major) of an input of shape `input_dims`.
    fn from_logits(logits: &[f64], input_dims: &[usize], config: &MoeConfig) -> Self {
        let (experts, top_k) = (config.experts(), config.top_k());
        let tokens = logits.len() / experts;
        let mut probabilities = Vec::with_capacity(logits.len());
        let mut chosen = Vec::with_capacity(tokens * top_k);
        let mut weights = Vec::with_capacity(tokens * top_k);
        let mut slots = vec![Vec::new(); experts];
        for (token, row) in logits.chunks_exact(experts).enumerate() {
            let p = softmax(row);
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
            let top = &order[..top_k];
            let total: f64 = top.iter().map(|&e| p[e]).sum();
            for (j, &expert) in top.iter().enumerate() {
                chosen.push(expert);
                weights.push(p[expert] / total);
                slots[expert].push(token * top_k + j);
            }
            probabilities.extend(p);
        }
        let mut routing = Routing {
            input_dims: input_dims.to_vec(),
            experts,
            top_k,
            probabilities,
            chosen,
            weights,
            slots,
            aux_coefficient: config.aux_coefficient(),
            aux_loss: 0.0,
        };
        routing.aux_loss = routing.compute_aux_loss();
        routing
    }

    /// `c · E · Σ_e f_e · P_e`.
    fn compute_aux_loss(&self) -> f64 {
        let tokens = self.tokens() as f64;
        let token_slots = tokens * self.top_k as f64;
        let balance: f64 = (0..self.experts)
            .map(|e| {
                let fraction = self.slots[e].len() as f64 / token_slots;
                let mean_probability = (0..self.tokens())
                    .map(|t| self.probabilities[t * self.experts + e])
                    .sum::<f64>()
                    / tokens;
                fraction * mean_probability
            })
            .sum();
        self.aux_coefficient * self.experts as f64 * balance
    }

    /// The shape of the routed input.
    pub fn input_dims(&self) -> &[usize] {
        &self.input_dims
    }

    /// The number of tokens `N` (rows of the input).
    pub fn tokens(&self) -> usize {
        self.chosen.len() / self.top_k
    }

    /// The number of experts `E`.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// The number of experts per token `k`.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Where `token` goes: `(expert, weight)` for each of its `k` slots, most probable first.
    pub fn assignment(&self, token: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        let slots = token * self.top_k..(token + 1) * self.top_k;
        let chosen = self.chosen[slots.clone()].iter().copied();
        chosen.zip(self.weights[slots].iter().copied())
    }

    /// The router's probability of each expert for `token`.
    pub fn probabilities(&self, token: usize) -> &[f64] {
        &self.probabilities[token * self.experts..(token + 1) * self.experts]
    }

    /// The tokens routed to `expert`, ascending: the order of its rows in every phase.
    pub fn tokens_of(&self, expert: usize) -> Vec<usize> {
        self.slots[expert].iter().map(|s| s / self.top_k).collect()
    }

    /// How many tokens each expert receives.
    pub fn load(&self) -> Vec<usize> {
        self.slots.iter().map(Vec::len).collect()
    }

    /// The load-balancing loss `c · E · Σ_e f_e · P_e` (see the module doc of [`Moe`]).
    pub fn aux_loss(&self) -> f64 {
        self.aux_loss
    }

    /// The slots routed to `expert`, by token.
    pub(super) fn slots(&self, expert: usize) -> &[usize] {
        &self.slots[expert]
    }

    /// The weight of `slot`.
    pub(super) fn weight(&self, slot: usize) -> f64 {
        self.weights[slot]
    }

    /// The gradient of the router logits (`[N, E]`) from that of the weights and of the
    /// load-balancing loss: for a token with chosen set `K`, `S = Σ_K p`, `w_j = p_j / S`,
    /// `dp_i = (dw_i - Σ_j w_j dw_j) / S` on `K`, plus `c · E · f_e / N` on every expert, then
    /// through the softmax `dl = p ⊙ (dp - p · dp)`.
    fn logit_gradient(&self, grad: &RoutingGrad) -> Vec<f64> {
        let (experts, top_k, tokens) = (self.experts, self.top_k, self.tokens());
        let token_slots = (tokens * top_k) as f64;
        let aux_scale = self.aux_coefficient * experts as f64 / tokens as f64;
        let from_aux: Vec<f64> = (0..experts)
            .map(|e| aux_scale * self.slots[e].len() as f64 / token_slots)
            .collect();
        let mut grad_logits = Vec::with_capacity(tokens * experts);
        for token in 0..tokens {
            let p = self.probabilities(token);
            let slots = token * top_k..(token + 1) * top_k;
            let chosen = &self.chosen[slots.clone()];
            let (w, dw) = (&self.weights[slots.clone()], &grad.slots[slots]);
            let total: f64 = chosen.iter().map(|&e| p[e]).sum();
            let mean: f64 = w.iter().zip(dw).map(|(w, dw)| w * dw).sum();
            let mut dp = from_aux.clone();
            for (&e, &dw) in chosen.iter().zip(dw) {
                dp[e] += (dw - mean) / total;
            }
            let dot: f64 = p.iter().zip(&dp).map(|(p, dp)| p * dp).sum();
            grad_logits.extend(p.iter().zip(&dp).map(|(p, dp)| p * (dp - dot)));
        }
        grad_logits
    }
}

impl RoutingGrad {
    /// The gradient of each slot's weight, `[N, k]` row-major.
    pub(super) fn new(slots: Vec<f64>) -> Self {
        RoutingGrad { slots }
    }

    /// The gradient of each routing weight, by slot (`token · k + j`).
    pub fn slots(&self) -> &[f64] {
        &self.slots
    }
}

/// The softmax of `row`, shifted by its maximum.
fn softmax(row: &[f64]) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = row.iter().map(|&l| libm::exp(l - max)).collect();
    let total: f64 = exps.iter().sum();
    exps.into_iter().map(|e| e / total).collect()
}

impl Moe {
    /// Phase 1: routes `input` (`[.., d]`, each row a token).
    pub fn route(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Routing, RouterSaved)> {
        check::named(LAYER, "input", input).rows_of(self.width(), self.dtype())?;
        let tokens = input.elem_count() / self.width();
        let rows = ops.reshape(input, &[tokens, self.width()])?;
        let (logits, router) = self.router.forward(ops, &rows)?;
        let logits = ops.f64_values(&logits)?;
        let routing = Routing::from_logits(&logits, input.dims(), &self.config);
        Ok((routing, RouterSaved { router }))
    }

    /// The backward of phase 1: the input gradient through the router, from the gradient of
    /// the routing weights and of the load-balancing loss (added here, at its coefficient).
    pub fn route_backward(
        &self,
        ops: &dyn Primitives,
        routing: &Routing,
        saved: RouterSaved,
        grad: &RoutingGrad,
    ) -> Result<(Tensor, RouterPending)> {
        self.check_routing(routing, "route_backward")?;
        if grad.slots.len() != routing.chosen.len() {
            return Err(KernelError::ExpertRowsMismatch {
                phase: "route_backward",
                problem: format!(
                    "{} weight gradients for the {} slots of the routing",
                    grad.slots.len(),
                    routing.chosen.len()
                ),
            });
        }
        let shape = [routing.tokens(), routing.experts()];
        let grad_logits = ops.float_tensor(&routing.logit_gradient(grad), &shape, self.dtype())?;
        let (grad_rows, router) = self
            .router
            .backward_input(ops, saved.router, &grad_logits)?;
        let grad_input = ops.reshape(&grad_rows, routing.input_dims())?;
        Ok((grad_input, RouterPending { router }))
    }

    /// The weight half of the router's backward: `router.weight`'s and `router.bias`'s
    /// gradients.
    pub fn router_backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: RouterPending,
    ) -> Result<Vec<Tensor>> {
        self.router.backward_weight(ops, pending.router)
    }
}

held_tensors!(mut RouterSaved { router });
held_tensors!(mut RouterPending { router });
