//! The exact search behind `zero_bubble(policy=optimal)`: a branch and bound over the F, I and W
//! of every (stage, microbatch) pair under the plan's costs, latency and per-rank memory limit,
//! which returns the best schedule it finds and a proven lower bound on every schedule.
//!
//! - [`model`]: the problem as a dense op table (durations, memory changes, dependencies, tails);
//! - [`state`]: the partial schedule, changed and undone in place;
//! - [`node_bound`]: a node's lower bound (heads, the memory limit's waits, Jackson's preemptive
//!   schedule per rank);
//! - [`search`]: the depth-first branch and bound (active schedules with memory, a transposition
//!   table, a deadline).
//!
//! The schedules searched split every backward into I and W (as `zero_bubble` does) and time
//! each op as early as its rank and inputs allow, as the simulator does. The search is
//! deterministic: run to the end or stopped by a node budget it returns the same schedule every
//! time; stopped by a deadline, how far it got depends on the machine.

mod model;
mod node_bound;
mod search;
mod state;

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
/// none) for one faster than `incumbent` (orders and their makespan), for at most `budget`.
pub fn optimal_orders(
    plan: &Plan,
    limit: f64,
    incumbent: (Vec<Vec<Task>>, f64),
    budget: Budget,
) -> Optimal {
    let model = Model::of_plan(plan, limit, Pricing::Split);
    let deadline = budget.time.map(|t| Instant::now() + t);
    let max_nodes = budget.nodes.unwrap_or(u64::MAX);
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
/// waits and slots ([`node_bound`]) see what the limit forces. On two routes, DualPipe's F&B
/// tasks are relaxed too (each half at most half the task). Schedules that recompute or offload
/// activations are not bounded by it.
#[derive(Debug)]
pub struct MemoryBound {
    model: Model,
    scratch: Scratch,
}

impl MemoryBound {
    /// The bounds of `plan`'s problem.
    pub fn new(plan: &Plan) -> MemoryBound {
        MemoryBound {
            model: Model::of_plan(plan, f64::INFINITY, Pricing::Cheapest),
            scratch: Scratch::default(),
        }
    }

    /// The bound at `limit` activations per rank: infinite where no schedule fits it.
    pub fn at(&mut self, limit: f64) -> f64 {
        self.model.set_limit(limit);
        node_bound(&self.model, &State::new(&self.model), &mut self.scratch)
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
