//! The search behind `zero_bubble(policy=auto)` at one memory limit: the handcrafted candidates
//! that fit (the input, DeepSeek's order on dual plans, the backwards split in place, ZB-H1/H2,
//! ZB-V, V-Half, V-Min and sail-sg's ZB-V search on the V placement), the list scheduler's
//! variants ([`super::greedy`]) that must beat them, then the critical-path local search
//! ([`super::refine`]) and the exact search's polish. Deterministic; with a [`RungMemo`] (the
//! rungs of one ladder, [`super::ladder`]) work another rung did with the same outcome is reused,
//! the result the same as without. The pass ([`crate::passes::zero_bubble`]) decides the limit and
//! the ladder; `seq_split` reschedules its chunks with [`auto_within`].

use crate::error::TransformError;
use crate::schedules::cache::SearchCache;
use crate::schedules::controllable::Controllable;
use crate::schedules::dualpipe::DualShape;
use crate::schedules::exact::polish;
use crate::schedules::greedy::{self, FillWaits, InFlight, Variant};
use crate::schedules::lagged::{lagged_orders, split_in_place, Hand};
use crate::schedules::memo::RungMemo;
use crate::schedules::refine::{refine, refine_probed};
use crate::schedules::score::{refine_budget, Scored};
use crate::schedules::zbv::{zbv_orders, Cooldown};
use crate::schedules::zbv_auto::zbv_auto_orders;
use pipeweave_core::{max_peak, Plan, Task};

/// The warm-up rules the search tries, the usual winners first (so the bound prunes more).
const IN_FLIGHT: [InFlight; 4] = [
    InFlight::CostAware {
        round_up: true,
        extra: 0,
    },
    InFlight::CostAware {
        round_up: false,
        extra: 0,
    },
    InFlight::Slope(2),
    InFlight::Memory,
];

/// Every variant of the list scheduler `auto` tries on `plan`, in trial order.
fn variants(plan: &Plan, dual: bool) -> Vec<Variant> {
    let multi_stage = plan.chunks_per_rank() != Some(1);
    let mut out = Vec::new();
    for in_flight in IN_FLIGHT {
        for fill in [FillWaits::Always, FillWaits::IfTheyFit] {
            for prefer_input_grad in [true, false] {
                for reserve in [false, true] {
                    for overlap in [false, true] {
                        if (reserve && !multi_stage) || (overlap && !dual) {
                            continue;
                        }
                        out.push(Variant {
                            prefer_input_grad,
                            fill,
                            reserve,
                            overlap,
                            in_flight,
                        });
                    }
                }
            }
        }
    }
    out
}

/// The best of the list scheduler's variants by its own timing (see [`Score`], then the earlier
/// variant). Variants that cannot beat the best so far stop early. With a `memo`, a variant's run
/// at a limit and bound where an earlier rung's run makes the same comparisons is that run.
fn best_greedy(
    plan: &Plan,
    limit: f64,
    dual: bool,
    bound: f64,
    memo: Option<&RungMemo>,
) -> Option<Vec<Vec<Task>>> {
    let mut best: Option<greedy::Schedule> = None;
    for variant in variants(plan, dual) {
        let bound = best.as_ref().map_or(bound, |b| b.score.max_span.min(bound));
        let run = || greedy::schedule_probed(plan, limit, variant, bound);
        let found = match memo {
            Some(memo) => memo.greedy(variant, limit, bound, run).schedule,
            None => run().schedule,
        };
        let Some(found) = found else {
            continue;
        };
        if best.as_ref().is_none_or(|b| found.score.beats(b.score)) {
            best = Some(found);
        }
    }
    best.map(|b| b.orders)
}

/// The handcrafted candidates of `auto` that do not depend on the limit: the input order and
/// DeepSeek's (dual plans), or the input with its backwards split in place, `h1`, `h2` and, on the
/// V placement, ZB-V, V-Half and V-Min (other plans).
fn handcrafted(plan: &Plan, dual: Option<DualShape>, cache: &SearchCache) -> Vec<Vec<Vec<Task>>> {
    let mut candidates: Vec<Vec<Vec<Task>>> = vec![plan.orders().to_vec()];
    match dual {
        Some(shape) => candidates.push(shape.orders(plan, true)),
        None => {
            candidates.push(split_in_place(plan.orders()));
            for hand in [Hand::H1, Hand::H2] {
                if let Ok(orders) = lagged_orders(plan, hand) {
                    candidates.push(orders);
                }
            }
            let (p, m) = (plan.problem().ranks(), plan.problem().microbatches());
            if plan.facts().layout.is_v_shaped(p) {
                for cooldown in [Cooldown::Eager, Cooldown::Deferred] {
                    candidates.push(zbv_orders(p, m, cooldown));
                }
                for kind in [Controllable::Half, Controllable::Min] {
                    candidates.extend(cache.controllable(kind, p, m));
                }
            }
        }
    }
    candidates
}

/// The handcrafted candidates of `auto` within `limit`, simulated (None where one does not fit
/// or does not run): those of [`handcrafted`] and, on the V placement (not dual), sail-sg's ZB-V
/// search within `limit`. With a `memo`, the first are simulated once for every rung.
fn handcrafted_within(
    plan: &Plan,
    dual: Option<DualShape>,
    limit: f64,
    cache: &SearchCache,
    memo: Option<&RungMemo>,
) -> Vec<Option<Scored>> {
    let mut scored = match memo {
        Some(memo) => memo.handcrafted(limit, || {
            handcrafted(plan, dual, cache)
                .into_iter()
                .map(|orders| Scored::evaluate(plan, orders, None, None))
                .collect()
        }),
        None => handcrafted(plan, dual, cache)
            .into_iter()
            .map(|orders| Scored::evaluate(plan, orders, Some(limit), None))
            .collect(),
    };
    if dual.is_none() && plan.facts().layout.is_v_shaped(plan.problem().ranks()) {
        scored.extend(
            zbv_auto_orders(plan, limit)
                .into_iter()
                .map(|orders| Scored::evaluate(plan, orders, Some(limit), None)),
        );
    }
    scored
}

/// What the `auto` search found at one limit: its result, and every candidate it simulated
/// that fit the limit (the handcrafted ones and the result).
pub(crate) struct Searched {
    /// The search's orders (None: nothing fits).
    pub(crate) result: Option<Vec<Vec<Task>>>,
    /// Every candidate it simulated that fit the limit.
    pub(crate) fitted: Vec<Scored>,
}

/// The `auto` search on `plan`, a dual plan of shape `dual` or (None) any other. With a `memo`
/// (one per plan, shared by the rungs of its ladder), work another rung already did with the same
/// outcome is taken from it: the result is the same as without.
pub(crate) fn auto_search(
    plan: &Plan,
    dual: Option<DualShape>,
    limit: f64,
    cache: &SearchCache,
    memo: Option<&RungMemo>,
) -> Searched {
    let evaluate = |orders: Vec<Vec<Task>>| match memo {
        Some(memo) => memo.evaluate(plan, orders, limit),
        None => Scored::evaluate(plan, orders, Some(limit), None),
    };
    let mut fitted: Vec<Scored> = handcrafted_within(plan, dual, limit, cache, memo)
        .into_iter()
        .flatten()
        .collect();
    let mut best: Option<&Scored> = None;
    for scored in &fitted {
        if best.is_none_or(|b| scored.score.beats(b.score)) {
            best = Some(scored);
        }
    }
    let mut best = best.cloned();
    // The list scheduler only has to beat the handcrafted candidates.
    let bound = best.as_ref().map_or(f64::INFINITY, |b| b.score.max_span);
    if let Some(orders) = best_greedy(plan, limit, dual.is_some(), bound, memo) {
        if let Some(scored) = evaluate(orders) {
            if best.as_ref().is_none_or(|b| scored.score.beats(b.score)) {
                best = Some(scored);
            }
        }
    }
    let budget = refine_budget(plan);
    let result = best
        .map(|b| match memo {
            Some(memo) => memo.refined(b.orders, limit, |orders| {
                refine_probed(plan, orders, limit, budget)
            }),
            None => refine(plan, b.orders, limit, budget),
        })
        .map(|orders| polish(plan, dual.is_some(), limit, orders));
    if let Some(scored) = result.clone().and_then(evaluate) {
        fitted.push(scored);
    }
    Searched { result, fitted }
}

/// `auto`'s search within `limit` on `plan`, not a dual plan: what `seq_split` reschedules its
/// chunks with (its list scheduler sees their dependencies; candidates that break them fail
/// their replay and drop out). None where no candidate fits.
pub(crate) fn auto_within(plan: &Plan, limit: f64) -> Option<Vec<Vec<Task>>> {
    auto_search(plan, None, limit, &SearchCache::new(), None).result
}

/// The `auto` search's result.
pub(crate) fn auto_orders(
    plan: &Plan,
    dual: Option<DualShape>,
    limit: f64,
    cache: &SearchCache,
) -> Result<Vec<Vec<Task>>, TransformError> {
    auto_search(plan, dual, limit, cache, None)
        .result
        .ok_or_else(|| {
            TransformError::unmet(
                "auto finds a schedule within the memory limit",
                format!(
                    "no candidate fits in {limit} activations per rank (the input needs {})",
                    max_peak(plan)
                ),
            )
        })
}
