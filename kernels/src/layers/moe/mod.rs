//! [`Moe`]: a mixture-of-experts feed-forward sub-layer. A router (`router: d -> E`, a
//! [`Linear`]) and a softmax give each token a probability per expert; each token goes to its
//! `k` most probable experts (ties to the lower index), weighted by their probabilities
//! renormalised to sum 1; each expert is an [`Mlp`] (`c_fc: d -> h`, `gelu_new`,
//! `c_proj: h -> d`); the output of a token is the weighted sum of its experts' outputs.
//!
//! # Phases
//!
//! The forward and its backward are made of public phases, so that a trainer running the
//! experts on other ranks (expert parallelism, rank `r` of `X` holding the experts of an
//! [`ExpertShard`]) can put an all-to-all between them; [`Layer`] runs them on one rank:
//!
//! 1. [`Moe::route`] (`routing.rs`): the router and the top-k choice, a [`Routing`] kept on the
//!    host (token -> `[(expert, weight)]`, the probabilities, the load-balancing loss);
//! 2. [`Moe::dispatch`] (`exchange.rs`): the rows each expert of a shard receives, one
//!    [`ExpertRows`] per expert with tokens, experts ascending, tokens ascending within;
//! 3. [`Moe::experts`], or [`ExpertBank::forward`] on a rank holding a shard's experts only
//!    ([`Moe::shard_bank`]; `experts.rs`): each expert's MLP on its rows;
//! 4. [`Moe::combine`]: every expert's outputs, from every shard, weighted and added into their
//!    tokens' rows in one order, experts ascending (tokens ascending within), whatever the
//!    shards: the same bits for any number of expert-parallel ranks.
//!
//! The backward runs them the other way: [`Moe::combine_backward`] (the gradient of each
//! expert's outputs, and of each routing weight), [`ExpertBank::backward_input`],
//! [`Moe::dispatch_backward`] (the experts' input gradients added into their tokens' rows in the
//! same order as the combine), [`Moe::route_backward`] (through the renormalised weights, the
//! softmax and the load-balancing loss, into the router), then the weight halves
//! [`Moe::router_backward_weight`] and [`ExpertBank::backward_weight`]. Each expert's products
//! see the same rows in the same order on any shard, so gradients are bit-identical too.
//!
//! # Load-balancing loss
//!
//! Switch Transformer's auxiliary loss, `aux = c · E · Σ_e f_e · P_e`, with `f_e` the fraction
//! of the `N·k` token-slots routed to expert `e` (a constant for the gradient), `P_e` the mean
//! router probability of `e` over the `N` tokens and `c` the configuration's
//! [`MoeConfig::aux_coefficient`]; uniform routing gives `c`. Its value is
//! [`Routing::aux_loss`] ([`MoeSaved::aux_loss`]); the backward differentiates `L + aux`, `L`
//! the loss whose gradient the output gets, so the caller adds `aux` to the loss it reports and
//! scales `c` for its own normalisation (e.g. divides it by the number of microbatches). A
//! sequence chunk's loss is its own tokens'.
//!
//! The routing (an `N x E` softmax and sort) runs on the host in f64 with pure-Rust `libm`: the
//! dispatch needs its counts on the host anyway, and the choice is then the same on every
//! machine for the same logits.
//!
//! # Expert parallelism
//!
//! [`Moe::on_shard`] (`placement.rs`) is the layer as one of `X` expert-parallel ranks runs it:
//! its [`Layer`] passes run every phase on the rank's tokens, its own experts only, with the
//! [`ExpertExchange`] of an [`ExpertPlacement`] between the experts and the combine (and between
//! the experts' backward and the dispatch's), giving the bits of the whole layer.
//!
//! Parameters, in order: `router.weight` (`[d, E]`), `router.bias` (`[E]`), then for each
//! expert `e` in `0..E` (of the shard, on an expert-parallel rank): `experts.{e}.c_fc.weight`,
//! `experts.{e}.c_fc.bias`, `experts.{e}.c_proj.weight`, `experts.{e}.c_proj.bias`.

mod exchange;
mod experts;
mod placement;
mod routing;

#[cfg(test)]
pub(crate) mod oracle;
#[cfg(test)]
pub(crate) mod tests;

use candle_core::{DType, Tensor};

pub use exchange::CombineSaved;
pub use experts::{ExpertBank, ExpertRows, ExpertsPending, ExpertsSaved};
pub use placement::{ExchangePhase, ExpertExchange, ExpertPlacement};
pub use routing::{RouterPending, RouterSaved, Routing, RoutingGrad};

use super::linear::Linear;
use super::mlp::Mlp;
use super::protocol::{held_tensors, joined, Layer, NamedParameters, ParameterSlots};
use crate::check;
use crate::config::{ExpertShard, MoeConfig};
use crate::error::{KernelError, Result};
use crate::init::{ParameterFactory, INIT_STD};
use crate::primitives::Primitives;

const LAYER: &str = "Moe";

/// A mixture-of-experts feed-forward sub-layer: a router and `E` expert MLPs, each token sent to
/// its top-k experts (see the module doc); on an expert-parallel rank, the router and its
/// shard's experts.
#[derive(Debug, Clone)]
pub struct Moe {
    config: MoeConfig,
    router: Linear,
    /// Every expert, or the placement's.
    bank: ExpertBank,
    /// Where the experts run: `None` on one rank holding them all.
    placement: Option<ExpertPlacement>,
}

/// What [`Moe::forward`] keeps: the routing and each phase's state.
#[derive(Debug)]
pub struct MoeSaved {
    routing: Routing,
    router: RouterSaved,
    experts: ExpertsSaved,
    combine: CombineSaved,
}

/// What [`Moe::backward_weight`] needs.
#[derive(Debug)]
pub struct MoePendingWeightGrad {
    router: RouterPending,
    experts: ExpertsPending,
}

impl MoeSaved {
    /// The forward's routing.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// The load-balancing loss of the forward's tokens, scaled by the coefficient (what the
    /// backward adds to the loss).
    pub fn aux_loss(&self) -> f64 {
        self.routing.aux_loss()
    }
}

impl Moe {
    /// A mixture of experts of shape `config` from its router (`d -> E`) and its `E` experts
    /// (each `d -> hidden -> d`), all of the router's dtype.
    pub fn new(config: MoeConfig, router: Linear, experts: Vec<Mlp>) -> Result<Self> {
        let (width, dtype) = (router.in_features(), router.dtype());
        check::named(LAYER, "router.weight", router.weight())
            .shape_is(&[width, config.experts()])?;
        if experts.len() != config.experts() {
            return Err(KernelError::ParameterCount {
                layer: LAYER,
                actual: 4 * experts.len(),
                expected: 4 * config.experts(),
            });
        }
        let bank = ExpertBank::new(0, experts)?;
        if (bank.width(), bank.hidden()) != (width, config.hidden()) {
            return Err(KernelError::Shape {
                layer: LAYER,
                tensor: "experts.0.c_fc.weight",
                actual: vec![bank.width(), bank.hidden()],
                expected: format!(
                    "[{width}, {}] (the router's width, the hidden width)",
                    config.hidden()
                ),
            });
        }
        let routers = (dtype, "the router's");
        check::dtype_follows(LAYER, "experts.0.c_fc.weight", bank.dtype(), routers)?;
        Ok(Moe {
            config,
            router,
            bank,
            placement: None,
        })
    }

    /// The shape of the mixture.
    pub fn config(&self) -> &MoeConfig {
        &self.config
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.router.in_features()
    }

    /// The element type of the parameters (and of the activations).
    pub fn dtype(&self) -> DType {
        self.router.dtype()
    }

    /// The router `d -> E`.
    pub fn router(&self) -> &Linear {
        &self.router
    }

    /// The experts this layer holds: all `E`, or on an expert-parallel rank its shard's.
    pub fn bank(&self) -> &ExpertBank {
        &self.bank
    }

    /// The experts `shard` holds, for a rank that runs only those (their parameters are shared
    /// with this layer's, not copied).
    pub fn shard_bank(&self, shard: ExpertShard) -> Result<ExpertBank> {
        self.check_shard(shard, "shard_bank")?;
        self.bank.part(shard.held())
    }

    /// Phase 3 on one rank: [`ExpertBank::forward`] of all the experts.
    pub fn experts(
        &self,
        ops: &dyn Primitives,
        rows: &[ExpertRows],
    ) -> Result<(Vec<ExpertRows>, ExpertsSaved)> {
        self.bank.forward(ops, rows)
    }

    /// Fails unless `shard` splits this mixture's experts.
    fn check_shard(&self, shard: ExpertShard, phase: &'static str) -> Result<()> {
        if shard.experts() == self.config.experts() {
            return Ok(());
        }
        Err(KernelError::ExpertRowsMismatch {
            phase,
            problem: format!(
                "a shard of {} experts for a mixture of {}",
                shard.experts(),
                self.config.experts()
            ),
        })
    }

    /// Fails unless `routing` was made for this mixture's experts and top-k.
    fn check_routing(&self, routing: &Routing, phase: &'static str) -> Result<()> {
        let ours = (self.config.experts(), self.config.top_k());
        if (routing.experts(), routing.top_k()) == ours {
            return Ok(());
        }
        Err(KernelError::ExpertRowsMismatch {
            phase,
            problem: format!(
                "a routing to {} of {} experts for a mixture routing to {} of {}",
                routing.top_k(),
                routing.experts(),
                ours.1,
                ours.0
            ),
        })
    }
}

impl Layer for Moe {
    type Saved = MoeSaved;
    type PendingWeightGrad = MoePendingWeightGrad;
    type InputGrad = Tensor;

    /// The four phases: every expert on one rank, or this rank's with the exchange.
    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, MoeSaved)> {
        let (routing, router) = self.route(ops, input)?;
        let rows = self.dispatch(ops, input, &routing, self.shard())?;
        let (own, experts) = self.bank.forward(ops, &rows)?;
        let outputs = self.gather(ExchangePhase::Combine, own)?;
        let (output, combine) = self.combine(ops, &routing, &outputs)?;
        let saved = MoeSaved {
            routing,
            router,
            experts,
            combine,
        };
        Ok((output, saved))
    }

    /// The backward phases (this rank's experts with the exchange, on an expert-parallel
    /// rank); the gradient is of `L + aux` (see the module doc).
    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: MoeSaved,
        grad_output: &Tensor,
    ) -> Result<(Tensor, MoePendingWeightGrad)> {
        let routing = &saved.routing;
        let (grad_outputs, grad_weights) =
            self.combine_backward(ops, routing, saved.combine, grad_output)?;
        let shard = self.shard();
        let own: Vec<ExpertRows> = grad_outputs
            .into_iter()
            .filter(|part| shard.holds(part.expert()))
            .collect();
        let (grad_rows, experts) = self.bank.backward_input(ops, saved.experts, &own)?;
        let grad_rows = self.gather(ExchangePhase::DispatchBackward, grad_rows)?;
        let from_experts = self.dispatch_backward(ops, routing, &grad_rows)?;
        let (from_router, router) =
            self.route_backward(ops, routing, saved.router, &grad_weights)?;
        let grad_input = ops.add(&from_experts, &from_router)?;
        Ok((grad_input, MoePendingWeightGrad { router, experts }))
    }

    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: MoePendingWeightGrad,
    ) -> Result<Vec<Tensor>> {
        let mut grads = self.router_backward_weight(ops, pending.router)?;
        grads.extend(self.bank.backward_weight(ops, pending.experts)?);
        Ok(grads)
    }
}

impl ParameterFactory<'_> {
    /// The mixture `config` of width `d` under `prefix`, GPT-2-initialised: the router's and the
    /// experts' `c_fc` weights `N(0, 0.02²)`, the experts' `c_proj` weights
    /// `N(0, residual_std²)` (a block's MLP's), biases 0.
    pub(crate) fn moe(
        &self,
        prefix: &str,
        d: usize,
        config: &MoeConfig,
        residual_std: f64,
    ) -> Result<Moe> {
        let router = self.linear(&format!("{prefix}.router"), d, config.experts(), INIT_STD)?;
        let experts = (0..config.experts())
            .map(|e| {
                self.mlp(
                    &format!("{prefix}.experts.{e}"),
                    d,
                    config.hidden(),
                    residual_std,
                )
            })
            .collect::<Result<Vec<_>>>()?;
        Moe::new(*config, router, experts)
    }
}

impl NamedParameters for Moe {
    fn push_parameters(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.router.push_parameters(&joined(prefix, "router"), out);
        self.bank.push_parameters(&joined(prefix, "experts"), out);
    }
}

impl ParameterSlots for Moe {
    fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        self.router.push_slots(out);
        self.bank.push_slots(out);
    }
}

held_tensors!(mut MoeSaved {
    router,
    experts,
    combine
});
held_tensors!(mut MoePendingWeightGrad { router, experts });
