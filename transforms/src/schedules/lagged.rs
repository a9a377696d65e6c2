//! Zero Bubble's handcrafted schedules as a rewrite of a warm-up / steady / cool-down order
//! (Qi et al., ICLR 2024, ZB-H1 and ZB-H2; sail-sg `get_hand_schedule(warmup_c)`).
//!
//! Each rank's forwards and full backwards keep their order. Every backward is split into its
//! input-gradient part (I), which stays on the critical path, and its weight-gradient part (W),
//! which is delayed. With `w_r` the number of forwards rank `r` runs before its first backward:
//! - H1 keeps `w_r`; H2 raises it to `2 w_r - 1` (capped at the rank's forward count);
//! - the lag of rank `r` is `max_q w_q - w_r`: after warm-up, step `k` runs `I_k`, then
//!   `W_{k - lag}` when `k >= lag`, then the next forward; the lagged Ws close the schedule.
//!
//! On a 1F1B input this is exactly ZB-H1 (warm-up `P - r`, lag `r`) and ZB-H2 (warm-up
//! `2(P-1-r)+1`, lag `2r`). Plans with overlapped or already split tasks are not accepted.

use pipeweave_core::{Plan, Task, Work};

/// Which handcrafted schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hand {
    /// ZB-H1: 1F1B's warm-up; memory as the input.
    H1,
    /// ZB-H2: doubled warm-up; about twice the activations.
    H2,
}

/// Why an order cannot be rewritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotWarmupOrder {
    /// The rank whose order does not fit.
    pub rank: usize,
    /// The task that does not fit.
    pub task: Task,
    /// Why: not a plain forward or a full backward, or ahead of its own forward once rewritten.
    pub why: &'static str,
}

/// Rewrites every rank's order of `plan`; fails on a task other than F or B, and on an order
/// too far from warm-up / steady / cool-down (interleaving in groups smaller than the ranks) for
/// the rewrite: one that would move an input gradient ahead of its own forward.
pub fn lagged_orders(plan: &Plan, hand: Hand) -> Result<Vec<Vec<Task>>, NotWarmupOrder> {
    let mut split: Vec<(Vec<Work>, Vec<Work>, usize)> = Vec::with_capacity(plan.orders().len());
    for (rank, order) in plan.orders().iter().enumerate() {
        let mut forwards = Vec::new();
        let mut backwards = Vec::new();
        let mut warmup = None;
        for task in order {
            match *task {
                Task::Forward(w) => forwards.push(w),
                Task::Backward(w) => {
                    warmup.get_or_insert(forwards.len());
                    backwards.push(w);
                }
                other => {
                    return Err(NotWarmupOrder {
                        rank,
                        task: other,
                        why: "is not a plain forward or a full backward",
                    })
                }
            }
        }
        let base = warmup.unwrap_or(forwards.len());
        let warmup = match hand {
            Hand::H1 => base,
            Hand::H2 => (2 * base).saturating_sub(1).max(base).min(forwards.len()),
        };
        split.push((forwards, backwards, warmup));
    }
    let deepest = split.iter().map(|(_, _, w)| *w).max().unwrap_or(0);
    let orders: Vec<Vec<Task>> = split
        .into_iter()
        .map(|(forwards, backwards, warmup)| {
            let lag = deepest - warmup;
            let mut out = Vec::with_capacity(forwards.len() + 2 * backwards.len());
            out.extend(forwards[..warmup].iter().map(|&w| Task::Forward(w)));
            for (k, &b) in backwards.iter().enumerate() {
                out.push(Task::InputGrad(b));
                if k >= lag {
                    out.push(Task::WeightGrad(backwards[k - lag]));
                }
                if let Some(&f) = forwards.get(warmup + k) {
                    out.push(Task::Forward(f));
                }
            }
            let first_unweighted = backwards.len().saturating_sub(lag);
            out.extend(
                backwards[first_unweighted..]
                    .iter()
                    .map(|&w| Task::WeightGrad(w)),
            );
            out.extend(
                forwards
                    .iter()
                    .skip(warmup + backwards.len())
                    .map(|&w| Task::Forward(w)),
            );
            out
        })
        .collect();
    for (rank, order) in orders.iter().enumerate() {
        if let Some(task) = ahead_of_its_forward(order) {
            return Err(NotWarmupOrder {
                rank,
                task,
                why: "would run before its own forward",
            });
        }
    }
    Ok(orders)
}

/// Every rank's order with each full backward split in place: its input gradient, then right
/// after it its weight gradient (the activations held as before; the gradient leaves for the
/// previous stage after the I instead of after the whole backward).
pub fn split_in_place(orders: &[Vec<Task>]) -> Vec<Vec<Task>> {
    orders
        .iter()
        .map(|order| {
            let mut out = Vec::with_capacity(order.len() * 3 / 2);
            for &task in order {
                match task {
                    Task::Backward(w) => out.extend([Task::InputGrad(w), Task::WeightGrad(w)]),
                    other => out.push(other),
                }
            }
            out
        })
        .collect()
}

/// The first input gradient of `order` that comes before its own forward, if any.
fn ahead_of_its_forward(order: &[Task]) -> Option<Task> {
    let mut forwarded = std::collections::HashSet::with_capacity(order.len() / 3);
    order.iter().find_map(|task| match *task {
        Task::Forward(w) => {
            forwarded.insert(w);
            None
        }
        Task::InputGrad(w) if !forwarded.contains(&w) => Some(*task),
        _ => None,
    })
}
