//! The exact search as the zero-bubble pass uses it: `policy=optimal`'s improvement of `auto`'s
//! result within a budget ([`improve`]), and `auto`'s own polishing of small memory-bound
//! problems within a node budget ([`polish`]). Both keep the given orders unless the simulator
//! agrees the search's are faster.

use super::{optimal_orders, Budget};
use crate::schedules::score::Scored;
use pipeweave_core::{max_peak, Plan, Task, TOLERANCE};

/// The most ops (F, I and W) of a problem whose `auto` result the exact search polishes.
pub const POLISH_OPS: usize = 300;
/// The exact search's node budget when it polishes `auto`'s result (deterministic; about half a
/// second).
pub const POLISH_NODES: u64 = 100_000;

/// `orders` (`auto`'s result on `plan`, split backwards, within `limit`) improved by the exact
/// search for `budget`: the orders and the search's proven bound (None where `orders` do not
/// simulate, which the driver's verification then reports).
pub fn improve(
    plan: &Plan,
    orders: Vec<Vec<Task>>,
    limit: f64,
    budget: Budget,
) -> (Vec<Vec<Task>>, Option<f64>) {
    let Some(scored) = Scored::evaluate(plan, orders.clone(), Some(limit), None) else {
        return (orders, None);
    };
    let makespan = scored.score.makespan;
    let found = optimal_orders(plan, limit, (orders.clone(), makespan), budget);
    // The search times ops as the simulator does; its orders are taken where the simulator
    // agrees they are faster.
    match Scored::evaluate(plan, found.orders, Some(limit), None) {
        Some(better) if better.score.makespan < makespan - TOLERANCE => {
            (better.orders, Some(found.bound.min(better.score.makespan)))
        }
        _ => (orders, Some(found.bound.min(makespan))),
    }
}

/// `auto`'s result `orders` on `plan` (not a dual plan), polished by the exact search within
/// [`POLISH_NODES`] where the problem has at most [`POLISH_OPS`] ops and `limit` binds (below the
/// input's peak): the memory-bound problems where the list scheduler and the local search miss
/// irregular orders. Only a faster schedule replaces `orders`.
pub fn polish(plan: &Plan, dual: bool, limit: f64, orders: Vec<Vec<Task>>) -> Vec<Vec<Task>> {
    if dual || plan.problem().work_count() * 3 > POLISH_OPS || limit >= max_peak(plan) - TOLERANCE {
        return orders;
    }
    let budget = Budget {
        time: None,
        nodes: Some(POLISH_NODES),
    };
    improve(plan, orders, limit, budget).0
}
