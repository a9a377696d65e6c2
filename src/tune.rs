//! `tune`: which schedule is best for my sizes, costs and memory? The engine of every search:
//!
//! Builds a list of candidate expressions (the search space is [`crate::search_space`]'s) for one
//! [`PipelineConfig`], keeps those that build and whose peak activations fit the memory limit,
//! and ranks them by makespan (then peak memory, then the order of the list). Every candidate is
//! built by [`build_plan`] exactly as `plan` would build it with the same options, so an
//! expression given back to `plan` gives the same figures. Candidates are evaluated on every
//! core. With a profile, the search runs over candidate cuts too ([`tune_cuts`]).

use crate::compile::build_plan_with;
use crate::config::PipelineConfig;
use crate::error::Error;
use crate::report::{gap, placement_bound, tidy};
use crate::search_space::Challengers;
use pipeweave_core::{
    cut_violation, even_cut, lower_bound, CutCosts, PinnedEnds, Plan, Profile, TOLERANCE,
};
use pipeweave_transforms::Registry;
use serde::Serialize;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One schedule that fits, with its figures.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Candidate {
    /// The expression (give it to `plan` with the same options).
    pub expression: String,
    /// When the last op ends.
    pub makespan: f64,
    /// The Zero Bubble paper's bubble rate.
    pub bubble_rate: f64,
    /// The largest peak activations of any rank (units of a rank's share).
    pub peak_activations: f64,
    /// The stages of the plan.
    pub stages: u32,
    /// Whether PyTorch's pipelining runtime can run the plan (one route, no tied stages:
    /// `pipeweave.torch.schedule`, `plan --csv`); DualPipe's two routes cannot.
    pub pytorch: bool,
    /// A lower bound on every schedule of this candidate's problem (its placement, costs and
    /// memory) within the search's memory limit ([`placement_bound`]).
    pub lower_bound: f64,
    /// With `--profile`: the blocks per rank's share this candidate was costed with (give
    /// them to `plan --layers-per-stage` and `train_gpt --layers-per-stage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers_per_stage: Option<Vec<usize>>,
    /// With `--profile`: the largest peak activations of any rank, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_activation_bytes: Option<f64>,
}

/// What a search found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TuneReport {
    /// The schedules that fit, fastest first.
    pub candidates: Vec<Candidate>,
    /// How many expressions were tried.
    pub evaluated: usize,
    /// Expressions that did not build or did not fit, with the reason.
    pub rejected: Vec<(String, String)>,
    /// The limit of the search: no schedule of any placement among the candidates is faster
    /// (the least of their [`Candidate::lower_bound`]s); None without candidates.
    pub lower_bound: Option<f64>,
    /// How far the fastest candidate is above that limit, relative to it.
    pub optimality_gap: Option<f64>,
}

impl TuneReport {
    /// The report of `candidates` (fastest first), with the limit of the search they span.
    pub fn new(
        candidates: Vec<Candidate>,
        evaluated: usize,
        rejected: Vec<(String, String)>,
    ) -> TuneReport {
        let lower_bound = candidates
            .iter()
            .map(|c| c.lower_bound)
            .min_by(f64::total_cmp);
        let optimality_gap = match (candidates.first(), lower_bound) {
            (Some(best), Some(bound)) => Some(tidy(gap(best.makespan, bound))),
            _ => None,
        };
        TuneReport {
            candidates,
            evaluated,
            rejected,
            lower_bound,
            optimality_gap,
        }
    }
}

/// The [`placement_bound`]s a search computed, by problem (placement, costs, memory) and
/// whether the plan keeps its activations: candidates of one placement share them.
#[derive(Debug, Default)]
struct PlacementBounds {
    known: Mutex<HashMap<(u64, bool), f64>>,
}

impl PlacementBounds {
    /// [`placement_bound`] of `plan` at `limit` (one search has one limit).
    fn of(&self, plan: &Plan, limit: Option<f64>) -> f64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        plan.problem().hash(&mut hasher);
        plan.costs().hash(&mut hasher);
        plan.memory().hash(&mut hasher);
        let key = (hasher.finish(), plan.manages_residency());
        if let Some(bound) = self.known.lock().ok().and_then(|k| k.get(&key).copied()) {
            return bound;
        }
        let bound = placement_bound(plan, limit);
        if let Ok(mut known) = self.known.lock() {
            known.insert(key, bound);
        }
        bound
    }
}

/// Evaluates `expressions` under `config` on every core; `progress` is called once per
/// finished expression with the number done so far. The built-in passes of one registry build
/// them all, so their searches share what they remember ([`tune_with`]).
pub fn tune(
    config: &PipelineConfig,
    expressions: &[String],
    progress: &(dyn Fn(usize) + Sync),
) -> TuneReport {
    tune_with(&Registry::builtin(), config, expressions, progress)
}

/// [`tune`] with the passes of `registry`: its `zero_bubble` passes share the registry's search
/// cache, so a caller that tunes several lists (the frontier) pays for each search once.
pub fn tune_with(
    registry: &Registry,
    config: &PipelineConfig,
    expressions: &[String],
    progress: &(dyn Fn(usize) + Sync),
) -> TuneReport {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let bounds = PlacementBounds::default();
    let results: Mutex<Vec<(usize, Result<Candidate, String>)>> = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(expression) = expressions.get(i) else {
                    break;
                };
                let outcome = evaluate(registry, config, expression, &bounds);
                if let Ok(mut r) = results.lock() {
                    r.push((i, outcome));
                }
                progress(done.fetch_add(1, Ordering::SeqCst) + 1);
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|e| e.into_inner());
    results.sort_by_key(|(i, _)| *i);
    let mut candidates = Vec::new();
    let mut rejected = Vec::new();
    for (i, outcome) in results {
        match outcome {
            Ok(c) => candidates.push((i, c)),
            Err(reason) => rejected.push((expressions[i].clone(), reason)),
        }
    }
    candidates.sort_by(|(i, a), (j, b)| {
        a.makespan
            .total_cmp(&b.makespan)
            .then(a.peak_activations.total_cmp(&b.peak_activations))
            .then(i.cmp(j))
    });
    TuneReport::new(
        candidates.into_iter().map(|(_, c)| c).collect(),
        expressions.len(),
        rejected,
    )
}

/// [`tune_with`] on `expressions`, then on each group of `challengers` whose placement could
/// beat the best found: a group is built only where its placement's lower bound
/// ([`pipeweave_core::lower_bound`], a bound at every memory limit) is below the best makespan,
/// so none of the groups left out could have been faster. All are ranked together, the list's
/// expressions before the challengers on ties; `evaluated` counts what was built.
pub fn tune_challenged(
    registry: &Registry,
    config: &PipelineConfig,
    expressions: &[String],
    challengers: &[Challengers],
    progress: &(dyn Fn(usize) + Sync),
) -> TuneReport {
    let listed = tune_with(registry, config, expressions, progress);
    let best = listed
        .candidates
        .first()
        .map_or(f64::INFINITY, |c| c.makespan);
    let could_win = |group: &Challengers| {
        build_plan_with(registry, &group.placement, config)
            .map_or(true, |plan| lower_bound(&plan) < best - TOLERANCE / 2.0)
    };
    let extra: Vec<String> = challengers
        .iter()
        .filter(|group| could_win(group))
        .flat_map(|group| group.expressions.iter().cloned())
        .filter(|e| !expressions.contains(e))
        .collect();
    if extra.is_empty() {
        return listed;
    }
    let done = listed.evaluated;
    let found = tune_with(registry, config, &extra, &|k| progress(done + k));
    let mut candidates = listed.candidates;
    candidates.extend(found.candidates);
    // A stable sort: among equals, the list's candidates (already in its order) stay first.
    candidates.sort_by(|a, b| {
        a.makespan
            .total_cmp(&b.makespan)
            .then(a.peak_activations.total_cmp(&b.peak_activations))
    });
    let mut rejected = listed.rejected;
    rejected.extend(found.rejected);
    TuneReport::new(candidates, done + found.evaluated, rejected)
}

/// Builds and simulates one expression.
fn evaluate(
    registry: &Registry,
    config: &PipelineConfig,
    expression: &str,
    bounds: &PlacementBounds,
) -> Result<Candidate, String> {
    let plan = build_plan_with(registry, expression, config).map_err(|e| e.to_string())?;
    let sim = config.simulate(&plan).map_err(|e| e.to_string())?;
    let peak = sim
        .ranks()
        .iter()
        .map(|r| r.peak_activations)
        .fold(0.0, f64::max);
    if !sim.makespan().is_finite() {
        return Err(format!("the makespan is {}", sim.makespan()));
    }
    Ok(Candidate {
        expression: expression.to_string(),
        makespan: tidy(sim.makespan()),
        bubble_rate: tidy(sim.bubble_rate()),
        peak_activations: tidy(peak),
        stages: plan.problem().stages(),
        pytorch: pipeweave_core::formats::csv::pytorch_expressible(plan.problem()).is_ok(),
        lower_bound: tidy(bounds.of(&plan, config.memory_limit())),
        layers_per_stage: None,
        peak_activation_bytes: None,
    })
}

/// [`tune`] over the cuts of a profiled model: `search` ranks the schedules of each cut's
/// configuration (costs and memory of that cut, see [`PipelineConfig::with_profile`]); every
/// candidate is tagged with its cut and its peak in bytes, and all are ranked together, fastest
/// first, then by bytes (memory units differ between cuts), then in the order of `cuts`.
pub fn tune_cuts(
    base: &PipelineConfig,
    profile: &Profile,
    cuts: &[Vec<usize>],
    search: &mut dyn FnMut(&PipelineConfig, &CutCosts) -> Result<TuneReport, Error>,
) -> Result<TuneReport, Error> {
    let mut all = TuneReport::new(Vec::new(), 0, Vec::new());
    for layers in cuts {
        let (config, cut) = base.clone().with_profile(profile, Some(layers))?;
        let found = search(&config, &cut)?;
        all.candidates
            .extend(found.candidates.into_iter().map(|mut c| {
                c.layers_per_stage = Some(layers.clone());
                c.peak_activation_bytes = Some((c.peak_activations * cut.bytes_per_unit).round());
                c
            }));
        all.evaluated += found.evaluated;
        all.rejected.extend(found.rejected);
    }
    all.candidates.sort_by(|a, b| {
        a.makespan.total_cmp(&b.makespan).then(
            a.peak_activation_bytes
                .unwrap_or(0.0)
                .total_cmp(&b.peak_activation_bytes.unwrap_or(0.0)),
        )
    });
    Ok(TuneReport::new(all.candidates, all.evaluated, all.rejected))
}

/// The cuts of `blocks` free layers (a profile's blocks, or all its layers where none is
/// pinned) into `ranks` shares `tune --profile` tries, the even one first (ties go to it): every
/// other cut (in lexicographic order) where they are few (at most `limit`), else the even cut and
/// those that move up to two blocks off each of the first and the last share (where the layers
/// pinned there, an embedding and a head, make a share heavy) onto the others, spread evenly. A
/// share without a pinned layer always keeps a block ([`cut_violation`]).
pub fn candidate_cuts(
    blocks: usize,
    ranks: usize,
    pinned: &PinnedEnds,
    limit: usize,
) -> Vec<Vec<usize>> {
    /// Every cut of `left` blocks over the shares from `k` on, share `j` taking at least
    /// `least[j]`, appended to `prefix`; false once more than `limit` are found.
    fn all(
        k: usize,
        left: usize,
        least: &[usize],
        out: &mut Vec<Vec<usize>>,
        prefix: &mut Vec<usize>,
        limit: usize,
    ) -> bool {
        if out.len() > limit {
            return false;
        }
        let rest: usize = least[k + 1..].iter().sum();
        if left < least[k] + rest {
            return true;
        }
        if k + 1 == least.len() {
            prefix.push(left);
            out.push(prefix.clone());
            prefix.pop();
            return out.len() <= limit;
        }
        for here in least[k]..=left - rest {
            prefix.push(here);
            let fits = all(k + 1, left - here, least, out, prefix, limit);
            prefix.pop();
            if !fits {
                return false;
            }
        }
        true
    }
    if ranks == 0 {
        return Vec::new();
    }
    if ranks == 1 {
        return vec![vec![blocks]];
    }
    let even = even_cut(blocks, ranks, pinned);
    let least: Vec<usize> = (0..ranks).map(|k| pinned.least(k, ranks)).collect();
    let mut out = Vec::new();
    if all(0, blocks, &least, &mut out, &mut Vec::new(), limit) {
        // The even cut first: ties go to it.
        out.retain(|c| *c != even);
        out.insert(0, even);
        return out;
    }
    let mut cuts = vec![even.clone()];
    let mut push = |cut: Vec<usize>| {
        if !cuts.contains(&cut) && cut_violation(&cut, blocks, pinned).is_none() {
            cuts.push(cut);
        }
    };
    if ranks == 2 {
        for d in 1..=2 {
            if even[0] >= d {
                push(vec![even[0] - d, even[1] + d]);
            }
            if even[1] >= d {
                push(vec![even[0] + d, even[1] - d]);
            }
        }
    } else {
        let middle = ranks - 2;
        for off_first in 0..=2usize.min(even[0]) {
            for off_last in 0..=2usize.min(even[ranks - 1]) {
                let mut cut = even.clone();
                cut[0] -= off_first;
                cut[ranks - 1] -= off_last;
                for k in 0..off_first + off_last {
                    cut[1 + k % middle] += 1;
                }
                push(cut);
            }
        }
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search_space::candidate_expressions;

    #[test]
    fn the_best_is_at_least_as_fast_as_every_fixed_schedule() {
        let config = PipelineConfig::new(4, 8).unwrap();
        let expressions = candidate_expressions(4, 8, None, None);
        let report = tune(&config, &expressions, &|_| {});
        assert_eq!(report.evaluated, expressions.len());
        let best = &report.candidates[0];
        for c in &report.candidates {
            assert!(best.makespan <= c.makespan);
        }
        let f1b = report
            .candidates
            .iter()
            .find(|c| c.expression == "f1b(gpipe)")
            .unwrap();
        assert!(best.makespan < f1b.makespan);
    }

    #[test]
    fn cuts_are_every_cut_when_few_else_moves_off_the_ends() {
        let both = PinnedEnds::new(Some("`embedding`"), Some("`head`"));
        assert_eq!(
            candidate_cuts(3, 2, &both, 64),
            [vec![1, 2], vec![0, 3], vec![2, 1], vec![3, 0]]
        );
        // The middle share keeps a block.
        assert!(candidate_cuts(4, 3, &both, 64)
            .iter()
            .all(|c| c[1] >= 1 && c.iter().sum::<usize>() == 4));
        assert_eq!(candidate_cuts(4, 3, &both, 64).len(), 10);
        // Nothing pinned: every share keeps a layer.
        let none = PinnedEnds::none();
        assert_eq!(
            candidate_cuts(4, 2, &none, 64),
            [vec![2, 2], vec![1, 3], vec![3, 1]]
        );
        assert_eq!(candidate_cuts(4, 3, &none, 64).len(), 3);
        let plain = candidate_cuts(32, 8, &none, 64);
        assert!(plain.len() > 1);
        assert!(plain.iter().all(|c| cut_violation(c, 32, &none).is_none()));
        let many = candidate_cuts(32, 8, &both, 64);
        assert_eq!(many[0], [4; 8]);
        assert_eq!(many.len(), 9);
        assert!(many.contains(&vec![2, 5, 5, 5, 5, 4, 4, 2]));
        assert!(many.iter().all(|c| c.iter().sum::<usize>() == 32));
    }

    #[test]
    fn a_memory_limit_rejects_what_does_not_fit() {
        let config = PipelineConfig::new(4, 8)
            .unwrap()
            .with_memory_limit(Some(4.0));
        let expressions = candidate_expressions(4, 8, Some(4.0), None);
        let report = tune(&config, &expressions, &|_| {});
        assert!(report
            .candidates
            .iter()
            .all(|c| c.peak_activations <= 4.0 + TOLERANCE));
        assert!(report.rejected.iter().any(|(e, _)| e == "gpipe"));
    }
}
