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
//! deterministic: run to the end it returns the same schedule every time; stopped by its
//! deadline, how far it got depends on the machine.

mod model;
mod node_bound;
mod search;
mod state;

use model::Model;
use pipeweave_core::{Plan, Task};
use std::time::{Duration, Instant};

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
}

/// Searches the schedules of `plan`'s problem within `limit` activations per rank (infinite:
/// none) for one faster than `incumbent` (orders and their makespan), for at most `budget`.
pub fn optimal_orders(
    plan: &Plan,
    limit: f64,
    incumbent: (Vec<Vec<Task>>, f64),
    budget: Duration,
) -> Optimal {
    let model = Model::of_plan(plan, limit);
    let deadline = Instant::now() + budget;
    let found = search::branch_and_bound(&model, incumbent.1, deadline);
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
    }
}
