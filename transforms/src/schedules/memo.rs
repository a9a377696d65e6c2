//! What the searches of one ladder ([`super::ladder`]) share across its rungs, so that a rung pays
//! only for the work its limit changes.
//!
//! The `auto` search at one limit is a deterministic function of the plan and of the outcomes of
//! the comparisons it makes against that limit (does `x` fit, `x <= limit + TOLERANCE`?) and
//! against the bound its list scheduler prunes by. A [`Threshold`] records those outcomes for one
//! run: the largest value that passed and the smallest that failed. Any other limit that gives
//! every recorded comparison the same outcome ([`Threshold::admits`]) makes the same run, op for
//! op, so its result is reused rather than recomputed: the ladder's results are bit for bit those
//! of running every rung from scratch.
//!
//! A [`RungMemo`] holds, for one plan, the list scheduler's runs by variant (with the thresholds
//! of their limit and bound, [`crate::schedules::greedy::schedule_probed`]), the local search's
//! results by input orders (with the threshold of their limit,
//! [`crate::schedules::refine::refine_probed`]) and simulated orders by orders (evaluated without
//! a limit; a limit only filters by peak, which [`Scored::evaluate`] checks before it simulates).

use crate::schedules::greedy::{Probed, Variant};
use crate::schedules::score::Scored;
pub use crate::schedules::threshold::Threshold;
use pipeweave_core::{Plan, Task, TOLERANCE};
use std::cmp::Ordering;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// A hash of orders, as data.
fn hash_orders(orders: &[Vec<Task>]) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    orders.hash(&mut hasher);
    hasher.finish()
}

/// A list scheduler's run: its variant, the thresholds of its limit and bound, its result.
type GreedyRun = (Variant, Probed);

/// A local search's run: its input orders, the threshold of its limit, its result.
type RefineRun = (Vec<Vec<Task>>, Threshold, Vec<Vec<Task>>);

/// Orders simulated without a limit, by their hash.
type Evaluated = HashMap<u64, Vec<(Vec<Vec<Task>>, Option<Scored>)>>;

/// What the rungs of one plan's ladder share (see the module doc). Every entry is for the plan
/// the memo was made for: one memo, one plan.
#[derive(Default)]
pub struct RungMemo {
    greedy: Mutex<Vec<GreedyRun>>,
    refined: Mutex<HashMap<u64, Vec<RefineRun>>>,
    evaluated: Mutex<Evaluated>,
    handcrafted: Mutex<Option<Vec<Option<Scored>>>>,
}

impl RungMemo {
    /// An empty memo.
    pub fn new() -> RungMemo {
        RungMemo::default()
    }

    /// The list scheduler's run of `variant` at `limit` within `bound`, remembered.
    pub fn greedy(
        &self,
        variant: Variant,
        limit: f64,
        bound: f64,
        run: impl FnOnce() -> Probed,
    ) -> Probed {
        if let Ok(runs) = self.greedy.lock() {
            if let Some((_, found)) = runs
                .iter()
                .find(|(v, p)| *v == variant && p.limit.admits(limit) && p.bound.admits(bound))
            {
                return found.clone();
            }
        }
        let found = run();
        if let Ok(mut runs) = self.greedy.lock() {
            runs.push((variant, found.clone()));
        }
        found
    }

    /// The local search's result on `orders` at `limit`, remembered: `run` gives its result and
    /// the threshold of its limit.
    pub fn refined(
        &self,
        orders: Vec<Vec<Task>>,
        limit: f64,
        run: impl FnOnce(Vec<Vec<Task>>) -> (Vec<Vec<Task>>, Threshold),
    ) -> Vec<Vec<Task>> {
        let key = hash_orders(&orders);
        if let Ok(runs) = self.refined.lock() {
            if let Some((_, _, found)) = runs
                .get(&key)
                .into_iter()
                .flatten()
                .find(|(input, t, _)| t.admits(limit) && *input == orders)
            {
                return found.clone();
            }
        }
        let (found, threshold) = run(orders.clone());
        if let Ok(mut runs) = self.refined.lock() {
            runs.entry(key)
                .or_default()
                .push((orders, threshold, found.clone()));
        }
        found
    }

    /// [`Scored::evaluate`] of `orders` on `plan` within `limit` (no bound), its simulation
    /// remembered.
    pub fn evaluate(&self, plan: &Plan, orders: Vec<Vec<Task>>, limit: f64) -> Option<Scored> {
        let key = hash_orders(&orders);
        let known = self.evaluated.lock().ok().and_then(|known| {
            known
                .get(&key)?
                .iter()
                .find(|(o, _)| *o == orders)
                .map(|(_, s)| s.clone())
        });
        let scored = match known {
            Some(scored) => scored,
            None => {
                let scored = Scored::evaluate(plan, orders.clone(), None, None);
                if let Ok(mut known) = self.evaluated.lock() {
                    known.entry(key).or_default().push((orders, scored.clone()));
                }
                scored
            }
        };
        within(scored, limit)
    }

    /// The handcrafted candidates that do not depend on the limit, simulated without one
    /// (`make` gives them, once), each filtered by its peak at `limit`.
    pub fn handcrafted(
        &self,
        limit: f64,
        make: impl FnOnce() -> Vec<Option<Scored>>,
    ) -> Vec<Option<Scored>> {
        let mut slot = self.handcrafted.lock().unwrap_or_else(|e| e.into_inner());
        slot.get_or_insert_with(make)
            .iter()
            .map(|s| within(s.clone(), limit))
            .collect()
    }
}

/// A candidate simulated without a limit, kept where its peak fits `limit` as
/// [`Scored::evaluate`] checks it.
fn within(scored: Option<Scored>, limit: f64) -> Option<Scored> {
    let above = |peak: f64| peak.partial_cmp(&(limit + TOLERANCE)) == Some(Ordering::Greater);
    scored.filter(|s| !above(s.peak))
}
