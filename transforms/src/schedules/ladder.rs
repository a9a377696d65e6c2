//! A search run across a ladder of memory limits, so that its result never gets slower as the
//! limit grows.
//!
//! A search under a limit (`zero_bubble`'s `auto`) is a heuristic: at a larger limit it may find a
//! slower schedule than it found at a smaller one, although everything that fit the smaller
//! limit fits the larger. [`fastest_within`] runs the search at the limit and at every rung below
//! it (multiples of half a microbatch of a rank's share, [`rung_step`]); a rung's search gives
//! every candidate it evaluated that fits the rung (its result and, for `auto`, the handcrafted
//! schedules), and the fastest by makespan (then by longest per-rank span, then the higher rung)
//! over all rungs wins. Every rung at or
//! below a limit is a rung of every larger limit, so the result's makespan never increases with
//! the limit; between two rungs it is the lower rung's unless the search at the limit itself is
//! faster.
//!
//! The top rung is searched first: where its result reaches the plan's lower bound and its
//! longest span the busiest rank's least work, nothing below can be faster and the climb stops
//! there (the result is the same as climbing every rung).
//!
//! The searches of the rungs run on every core, each core climbing its own run of neighbouring
//! rungs (a search that remembers what it compared against its limit, as `auto`'s does through
//! a [`crate::schedules::memo::RungMemo`], reuses the rung below where the comparisons agree),
//! and are remembered in the caller's
//! [`SearchCache`] (by the plan and the limit), so a caller that asks for many limits of one plan
//! through one cache, as the frontier does, pays for each rung once.

use crate::schedules::cache::SearchCache;
use crate::schedules::score::Scored;
use pipeweave_core::{least_span, lower_bound, Plan, Task, TOLERANCE};
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// The fastest candidate a rung's search found (None: nothing fits).
type Rung = Option<Scored>;

/// What identifies a plan's searches: its problem, models, facts, limit and orders, hashed as
/// data.
fn fingerprint(plan: &Plan) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    plan.problem().hash(&mut hasher);
    plan.costs().hash(&mut hasher);
    plan.memory().hash(&mut hasher);
    plan.memory_limit().map(f64::to_bits).hash(&mut hasher);
    plan.facts().hash(&mut hasher);
    plan.orders().hash(&mut hasher);
    hasher.finish()
}

/// Half a microbatch of the largest rank's share of activations: the ladder's step. A rank's
/// share counts each of its stages once, a later member of a tied group (a mirror holding a copy
/// of another stage's weights and activations figures) not again.
pub fn rung_step(plan: &Plan) -> f64 {
    let problem = plan.problem();
    let mut replica = vec![false; problem.stages() as usize];
    for group in problem.tied_stages() {
        for stage in group.iter().skip(1) {
            replica[stage.index()] = true;
        }
    }
    let mut share = vec![0.0f64; problem.ranks() as usize];
    for (s, rank) in problem.stage_to_rank().iter().enumerate() {
        if !replica[s] {
            share[rank.index()] += plan.memory().stages()[s].total();
        }
    }
    let largest = share.into_iter().fold(0.0, f64::max);
    if largest > 0.0 {
        largest / 2.0
    } else {
        0.5
    }
}

/// The rungs up to `limit`: every multiple of `step` below it, then the limit itself.
pub fn rungs(step: f64, limit: f64) -> Vec<f64> {
    let mut out: Vec<f64> = (1u32..)
        .map(|k| f64::from(k) * step)
        .take_while(|r| *r < limit - TOLERANCE)
        .collect();
    out.push(limit);
    out
}

/// Whether `a` is faster than `b`: a shorter makespan, or the same and a shorter longest span.
fn faster(a: &Scored, b: &Scored) -> bool {
    a.score.makespan < b.score.makespan - TOLERANCE
        || (a.score.makespan < b.score.makespan + TOLERANCE
            && a.score.max_span < b.score.max_span - TOLERANCE)
}

/// Whether no candidate of any rung can be [`faster`] than `found`: its makespan is the plan's
/// lower bound ([`lower_bound`], which holds at every limit) and its longest span the least any
/// schedule's can be ([`least_span`]). A rung below the one that found it then finds nothing
/// faster, and a tie keeps the higher rung, so the ladder's result is `found` without climbing.
fn unbeatable(plan: &Plan, found: &Scored) -> bool {
    let slack = TOLERANCE / 2.0;
    found.score.max_span <= least_span(plan) + slack
        && found.score.makespan <= lower_bound(plan) + slack
}

/// The fastest of what `search` gives at `limit`, remembered in `cache`.
fn remembered(
    plan: &Plan,
    key: u64,
    limit: f64,
    cache: &SearchCache,
    search: &(impl Fn(&Plan, f64) -> Vec<Scored> + Sync),
) -> Rung {
    cache.rung((key, limit.to_bits()), || {
        let mut best: Option<Scored> = None;
        for candidate in search(plan, limit) {
            if candidate.peak <= limit + TOLERANCE
                && best.as_ref().is_none_or(|b| faster(&candidate, b))
            {
                best = Some(candidate);
            }
        }
        best
    })
}

/// The fastest candidate `search` finds at `limit` or at any rung below it (see the module doc);
/// None when nothing fits.
pub fn fastest_within(
    plan: &Plan,
    limit: f64,
    cache: &SearchCache,
    search: impl Fn(&Plan, f64) -> Vec<Scored> + Sync,
) -> Option<Vec<Vec<Task>>> {
    let key = fingerprint(plan);
    let step = rung_step(plan);
    // No rank ever holds more than every microbatch of its share (two steps each): rungs above
    // that all find what that finds, so a limit of 1e12 climbs no further.
    let ceiling = 2.0 * step * f64::from(plan.problem().microbatches());
    let all = rungs(step, limit.min(ceiling));
    // The top rung first: where it is unbeatable, no rung below can win (ties keep it).
    if let Some(&top) = all.last() {
        if let Some(found) = remembered(plan, key, top, cache, &search) {
            if unbeatable(plan, &found) {
                return Some(found.orders);
            }
        }
    }
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(all.len());
    let found: Vec<(usize, Rung)> = if workers <= 1 {
        all.iter()
            .enumerate()
            .map(|(k, &r)| (k, remembered(plan, key, r, cache, &search)))
            .collect()
    } else {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for _ in 0..workers {
                // Each worker climbs its own run of neighbouring rungs, the lower first: where
                // the search remembers work by the comparisons it made against its limit, a rung
                // often makes the same ones as the rung below and reuses its work.
                scope.spawn(|| loop {
                    let w = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if w >= workers {
                        break;
                    }
                    let (from, to) = (w * all.len() / workers, (w + 1) * all.len() / workers);
                    for (k, &r) in all.iter().enumerate().take(to).skip(from) {
                        let found = remembered(plan, key, r, cache, &search);
                        if let Ok(mut out) = results.lock() {
                            out.push((k, found));
                        }
                    }
                });
            }
        });
        results.into_inner().unwrap_or_else(|e| e.into_inner())
    };
    let mut found: Vec<(usize, Scored)> = found
        .into_iter()
        .filter_map(|(k, rung)| Some((k, rung?)))
        .collect();
    // The higher rung first, so that a tie keeps it.
    found.sort_by_key(|(k, _)| std::cmp::Reverse(*k));
    let mut best: Option<Scored> = None;
    for (_, scored) in found {
        if best.as_ref().is_none_or(|b| faster(&scored, b)) {
            best = Some(scored);
        }
    }
    best.map(|b| b.orders)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_step_up_to_the_limit() {
        assert_eq!(rungs(0.5, 2.0), [0.5, 1.0, 1.5, 2.0]);
        assert_eq!(rungs(0.5, 1.2), [0.5, 1.0, 1.2]);
        assert_eq!(rungs(0.5, 0.3), [0.3]);
    }

    #[test]
    fn huge_limits_climb_no_further_than_every_microbatch_held() {
        let config = (4, 8);
        let plan = crate::compile_expression("f1b(gpipe)")
            .unwrap()
            .run(pipeweave_core::testing::unit_plan(config.0, config.1))
            .unwrap();
        let searched = std::sync::atomic::AtomicUsize::new(0);
        let found = fastest_within(&plan, 1e12, &SearchCache::new(), |_, _| {
            searched.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Vec::new()
        });
        assert!(found.is_none());
        // One rung per half microbatch up to all 8 held: 16 searches, not 2e12.
        assert!(searched.into_inner() <= 16);
    }
}
