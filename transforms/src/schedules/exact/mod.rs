//! The exact search behind `zero_bubble(policy=optimal)`: a branch and bound over the F, I and W
//! of every (stage, microbatch) pair under the plan's costs, latency and per-rank memory limit,
//! which returns the best schedule it finds and a proven lower bound on every schedule.
//!
//! - [`model`]: the problem as a dense op table (durations, memory changes, dependencies, tails);
//! - [`state`]: the partial schedule, changed and undone in place;
//! - [`node_bound`]: a node's lower bound (heads, the memory limit's waits, Jackson's preemptive
//!   schedule per rank);
//! - [`search`]: the depth-first branch and bound (active schedules with memory, a transposition
//!   table, a deadline);
//! - [`improve`](improve::improve) and [`polish`](improve::polish): how the zero-bubble pass uses
//!   it on `auto`'s result.
//!
//! The schedules searched split every backward into I and W (as `zero_bubble` does) and time
//! each op as early as its rank and inputs allow, as the simulator does. The search is
//! deterministic: run to the end or stopped by a node budget it returns the same schedule every
//! time; stopped by a deadline, how far it got depends on the machine.

mod improve;
mod model;
mod node_bound;
mod search;
mod state;

pub use improve::{improve, polish, POLISH_NODES, POLISH_OPS};

use model::{Model, Pricing};
use node_bound::{node_bound, Scratch};
use pipeweave_core::{Plan, Task};
use state::State;
use std::time::{Duration, Instant};

/// How long [`optimal_orders`] may search: until a deadline, after a number of nodes, or
/// whichever comes first.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// Wall-clock time.
    pub time: Option<Duration>,
    /// Nodes visited (deterministic).
    pub nodes: Option<u64>,
}

/// The most ops (F, I and W) the search takes on: it recurses once per op placed, which must fit
/// a thread's stack (2 MiB). Larger problems get the incumbent and the root's bound.
pub const MAX_SEARCH_OPS: usize = 1_500;

/// What [`optimal_orders`] found.
#[derive(Clone, Debug)]
pub struct Optimal {
    /// The best orders found: the search's, or the incumbent's when it found none better.
    pub orders: Vec<Vec<Task>>,
    /// Their makespan under the search's timing.
    pub makespan: f64,
    /// No schedule of the problem within the limit ends before this.
    pub bound: f64,
    /// Whether the search ran to the end (the orders are then optimal).
    pub complete: bool,
    /// How many nodes it visited.
    pub nodes: u64,
    /// How many it had visited when it found its best (0: none better than the incumbent).
    pub found_at: u64,
}

/// Searches the schedules of `plan`'s problem within `limit` activations per rank (infinite:
/// none) for one faster than `incumbent` (orders within the limit and their makespan; an
/// infinite makespan when there are none), for at most `budget`.
pub fn optimal_orders(
    plan: &Plan,
    limit: f64,
    incumbent: (Vec<Vec<Task>>, f64),
    budget: Budget,
) -> Optimal {
    let model = Model::of_plan(plan, limit, Pricing::Split);
    let deadline = budget.time.map(|t| Instant::now() + t);
    // Larger problems get the root's bound alone: the search's depth grows with the ops.
    let max_nodes = if model.ops.len() > MAX_SEARCH_OPS {
        0
    } else {
        budget.nodes.unwrap_or(u64::MAX)
    };
    let found = search::branch_and_bound(&model, incumbent.1, deadline, max_nodes);
    let orders = match found.orders {
        Some(orders) => orders
            .into_iter()
            .map(|rank| rank.into_iter().map(|op| model.ops[op].task).collect())
            .collect(),
        None => incumbent.0,
    };
    Optimal {
        orders,
        makespan: found.best,
        bound: found.bound,
        complete: found.complete,
        nodes: found.nodes,
        found_at: found.found_at,
    }
}

/// Lower bounds on the makespan of every schedule of one plan's problem that runs each F, I and
/// W once (fused backwards included: each priced as cheap as any of its forms) and holds at most
/// a given limit of activations per rank: the exact search's bound at its root, whose memory
/// waits and slots ([`node_bound`]) see what the limit forces. F&B tasks with a given price are
/// relaxed too, on every layout ([`pipeweave_core::analysis::bound::CheapestForms`]: a forward
/// and a backward each a share of it). Schedules that recompute or offload
/// activations are not bounded by it.
#[derive(Debug)]
pub struct MemoryBound {
    /// None above [`MEMORY_BOUND_OPS`].
    model: Option<Model>,
    scratch: Scratch,
}

/// The most ops (F, I and W) whose memory bound is computed: it costs about a microsecond per op
/// (170 ms at 32 ranks, 2 chunks and 1,024 microbatches, 20 times the planner's build and
/// simulation there), so larger problems get no claim from it (their reports keep the
/// relaxation's bound).
pub const MEMORY_BOUND_OPS: usize = 30_000;

impl MemoryBound {
    /// The bounds of `plan`'s problem.
    pub fn new(plan: &Plan) -> MemoryBound {
        let ops = plan.problem().work_count() * 3;
        MemoryBound {
            model: (ops <= MEMORY_BOUND_OPS)
                .then(|| Model::of_plan(plan, f64::INFINITY, Pricing::Cheapest)),
            scratch: Scratch::default(),
        }
    }

    /// The bound at `limit` activations per rank: infinite where no schedule fits it; 0 (no
    /// claim) above [`MEMORY_BOUND_OPS`].
    pub fn at(&mut self, limit: f64) -> f64 {
        let Some(model) = self.model.as_mut() else {
            return 0.0;
        };
        model.set_limit(limit);
        node_bound(model, &State::new(model), &mut self.scratch)
    }
}

/// [`MemoryBound::at`] of `plan`'s problem at `limit`, 0 (no claim) where it is infinite: for
/// reports of plans that fit their limit, where it never is.
pub fn memory_bound(plan: &Plan, limit: f64) -> f64 {
    let bound = MemoryBound::new(plan).at(limit);
    if bound.is_finite() {
        bound
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;
    use pipeweave_core::testing::{costs, unscheduled};
    use pipeweave_core::{lower_bound, simulate};

    /// `expression` over `ranks` x `m` at unit costs.
    fn built(expression: &str, ranks: u32, m: u32) -> Plan {
        let passes = Registry::builtin().compile_expression(expression).unwrap();
        passes
            .run(unscheduled(ranks, m, costs(1.0, 1.0, 1.0)))
            .unwrap()
    }

    #[test]
    fn the_memory_limit_as_slots_raises_the_bound() {
        // P = 8, M = 16, 4 activations: rank 0 holds 4 microbatches at once, each for at least
        // its round trip (8 F + 8 I + its W = 17): 4 rounds of 17, plus the last Fs' waits.
        let plan = unscheduled(8, 16, costs(1.0, 1.0, 1.0));
        assert_eq!(lower_bound(&plan), 55.0);
        assert_eq!(memory_bound(&plan, 4.0), 71.0);
        // Unbounded: no more than the relaxation.
        assert!(memory_bound(&plan, 1e300) <= 55.0 + 1e-9);
    }

    #[test]
    fn a_limit_nothing_fits_is_infinite_and_no_claim_in_reports() {
        let plan = unscheduled(2, 2, costs(1.0, 1.0, 1.0));
        assert_eq!(MemoryBound::new(&plan).at(0.5), f64::INFINITY);
        assert_eq!(memory_bound(&plan, 0.5), 0.0);
    }

    #[test]
    fn huge_limits_and_two_routes_are_bounded_without_harm() {
        let plan = built("dual(f1b(gpipe))", 4, 4);
        let relaxed = lower_bound(&plan);
        let bound = memory_bound(&plan, 1e300);
        assert!(bound > 0.0 && bound <= simulate(&plan).unwrap().makespan() + 1e-9);
        assert!(relaxed <= simulate(&plan).unwrap().makespan() + 1e-9);
    }

    #[test]
    fn the_search_proves_its_schedule_and_stops_on_its_node_budget() {
        // No incumbent to beat (ZB-H1's orders hold 4, above the limit).
        let plan = built("zero_bubble(f1b(gpipe), policy=h1)", 4, 8);
        let start = (plan.orders().to_vec(), f64::INFINITY);
        let budget = |nodes| Budget {
            time: None,
            nodes: Some(nodes),
        };
        let found = optimal_orders(&plan, 3.0, start.clone(), budget(1_000_000));
        assert!(found.complete);
        assert_eq!((found.makespan, found.bound), (31.0, 31.0));
        let orders = plan.clone().with_orders(found.orders).unwrap();
        assert_eq!(simulate(&orders).unwrap().makespan(), 31.0);
        assert!(pipeweave_core::max_peak(&orders) <= 3.0);
        // Ten nodes: stopped, the bound below what it has, the same every time.
        let short = optimal_orders(&plan, 3.0, start.clone(), budget(10));
        assert!(!short.complete);
        assert!(short.bound <= 31.0 && short.makespan >= 31.0);
        let again = optimal_orders(&plan, 3.0, start, budget(10));
        assert_eq!(
            (again.makespan, again.bound, again.orders),
            (short.makespan, short.bound, short.orders)
        );
    }
}
