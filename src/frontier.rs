//! `tune --frontier`: the memory/time frontier, the fastest schedule found for every memory limit.
//!
//! The search space is [`crate::search_space`]'s (the families and their expressions) and
//! [`crate::residency_search`]'s (the second stage's); the picture is [`crate::frontier_svg`]'s.
//!
//! The search: every fixed candidate of [`crate::search_space::candidate_expressions`] (gpipe, 1F1B,
//! interleaving, ZB-H1/H2, V-Half, V-Min, DualPipe, ...; each has one peak), and for each
//! memory-driven family, `zero_bubble(INNER, policy=auto, memory=r)` on 1F1B, 2-chunk
//! interleaving and the V layout, at a ladder of limits `r`: every multiple of half a
//! microbatch's activations (`total / 2`) from there up to twice 1F1B's peak (`2P`, where `auto`
//! stops gaining). Every expression is built by [`build_plan`] as `plan` builds it, so each
//! point given back to `plan` with the same options gives the same figures.
//!
//! Then the residency stage, from the frontier of those kept schedules and its knees (its least
//! peaks within a quarter and within a half of its fastest makespan): at a few rungs (the
//! frontier's least peak; a quarter, a half and three quarters of each knee's peak, and of the
//! fastest point's above the first knee; the config's memory limit; on half-microbatch steps),
//! `recompute(BASE, memory=r)` and `offload(BASE, memory=r)` for BASE each knee above `r` and
//! 1F1B (whose whole backwards let every activation move), or the fastest point above the knees,
//! and the frontier's point just above `r`; and at the config's memory limit itself (not rounded),
//! both passes on the whole-backward bases of [`crate::search_space::LIMIT_BASES`] (1F1B and 2- to 8-chunk
//! interleaving), whose own peaks lie above the limit where the kept frontier cannot see them,
//! and on the kept knees and fastest point (a residency pass outermost is the one that fits a
//! declared limit, so their schedules are built as without it). These reach below the least memory any kept schedule needs, and can beat kept schedules above
//! it (a fast schedule with hidden transfers against a slower one that keeps everything).
//!
//! The frontier: for each limit, the fastest expression whose peak fits; its rows are the limits
//! where that changes (the point's own peak), so it is monotone by construction: a larger limit
//! keeps every schedule a smaller one had. Ties go to the smaller peak, then to the candidate
//! listed first (fixed schedules before the ladder, lower rungs first, the residency stage last).

use crate::compile::build_plan;
use crate::config::PipelineConfig;
use crate::frontier_limit::{frontier_limit, FrontierLimit};
pub use crate::frontier_point::FrontierPoint;
pub use crate::frontier_svg::frontier_svg;
use crate::residency_search::{relieved_chunk_offloads, residency_expressions};
use crate::search_space::{chunk_offload_expressions, frontier_expressions, ladder, Family};
use crate::tune::{tune_with, Candidate, TuneReport};
use pipeweave_core::TOLERANCE;
use pipeweave_transforms::Registry;
use serde::Serialize;

/// What the frontier search found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Frontier {
    /// The points, by increasing memory and decreasing makespan.
    pub frontier: Vec<FrontierPoint>,
    /// Every schedule evaluated, with its family (for the picture).
    #[serde(skip)]
    pub evaluated: Vec<(Family, Candidate)>,
    /// How many expressions were built.
    pub expressions: usize,
    /// Expressions that did not build or did not fit, with the reason.
    #[serde(skip)]
    pub rejected: Vec<(String, String)>,
    /// The limit under the frontier: no schedule of its placements is faster
    /// ([`crate::frontier_limit`]).
    pub limit: Option<FrontierLimit>,
}

impl Frontier {
    /// Every schedule found that fits, fastest first (then the smaller peak, then listing
    /// order): what `tune --memory-limit` ranks.
    pub fn ranked(&self) -> TuneReport {
        let mut candidates: Vec<Candidate> =
            self.evaluated.iter().map(|(_, c)| c.clone()).collect();
        // `evaluated` is in listing order among equal peaks and makespans; a stable sort keeps it.
        candidates.sort_by(|a, b| {
            a.makespan
                .total_cmp(&b.makespan)
                .then(a.peak_activations.total_cmp(&b.peak_activations))
        });
        TuneReport::new(candidates, self.expressions, self.rejected.clone())
    }
}

/// Runs the search (on every core, every expression built under `config`, its memory limit
/// included) and builds the frontier: the kept schedules first, then the residency stage from
/// their frontier; `progress` as in [`tune`], counting both stages.
pub fn frontier(config: &PipelineConfig, progress: &(dyn Fn(usize) + Sync)) -> Frontier {
    let cap = config.memory_limit();
    let mut jobs = frontier_expressions(config);
    let kept_expressions: Vec<String> = jobs.iter().map(|(e, _)| e.clone()).collect();
    // One registry for every point: `auto`'s searches of a plan's rungs are shared across them.
    let registry = Registry::builtin();
    let kept_report = tune_with(&registry, config, &kept_expressions, progress);
    let family_of = |jobs: &[(String, Family)], e: &str| {
        jobs.iter()
            .find(|(x, _)| x == e)
            .map_or(Family::Fixed, |(_, f)| *f)
    };
    let kept: Vec<(Family, Candidate)> = kept_report
        .candidates
        .into_iter()
        .map(|c| (family_of(&jobs, &c.expression), c))
        .collect();
    let kept_points = walk(kept.clone(), &kept_expressions, cap);
    let residency = residency_expressions(&kept_points, config.memory().total(), cap);
    let mut done = kept_expressions.len();
    let mut evaluated = kept;
    let mut rejected = kept_report.rejected;
    let mut stage = |jobs: &mut Vec<(String, Family)>,
                     config: &PipelineConfig,
                     stage_jobs: Vec<(String, Family)>| {
        let expressions: Vec<String> = stage_jobs.iter().map(|(e, _)| e.clone()).collect();
        let offset = done;
        let report = tune_with(&registry, config, &expressions, &|k| progress(offset + k));
        done += expressions.len();
        jobs.extend(stage_jobs);
        rejected.extend(report.rejected);
        report
            .candidates
            .into_iter()
            .map(|c| (family_of(jobs, &c.expression), c))
            .collect::<Vec<_>>()
    };
    evaluated.extend(stage(&mut jobs, config, residency));
    // PipeOffload's blocks with whole chunks offloaded: their peaks do not depend on a limit,
    // so they are built without it; those above it are kept only to be relieved at it.
    let chunked = stage(
        &mut jobs,
        &config.clone().with_memory_limit(None),
        chunk_offload_expressions(config.ranks(), config.microbatches()),
    );
    let fits = |c: &Candidate| cap.is_none_or(|cap| c.peak_activations <= cap + TOLERANCE);
    let (within, above): (Vec<_>, Vec<_>) = chunked.into_iter().partition(|(_, c)| fits(c));
    evaluated.extend(within);
    if let Some(limit) = cap {
        let relieved = relieved_chunk_offloads(&above, limit);
        evaluated.extend(stage(&mut jobs, config, relieved));
    }
    let expressions: Vec<String> = jobs.iter().map(|(e, _)| e.clone()).collect();
    let points = walk(evaluated.clone(), &expressions, cap);
    let mut limits = ladder(config.ranks(), config.memory().total(), None);
    limits.extend(points.iter().map(|p| p.memory_limit));
    limits.extend(cap);
    limits.sort_by(f64::total_cmp);
    limits.dedup_by(|a, b| (*a - *b).abs() < TOLERANCE);
    Frontier {
        frontier: points,
        evaluated: sorted(evaluated, &expressions),
        expressions: expressions.len(),
        rejected,
        limit: frontier_limit(config, &limits),
    }
}

/// `evaluated` by peak, then makespan, then listing order in `expressions`.
fn sorted(
    mut evaluated: Vec<(Family, Candidate)>,
    expressions: &[String],
) -> Vec<(Family, Candidate)> {
    let rank = |e: &str| {
        expressions
            .iter()
            .position(|x| x == e)
            .unwrap_or(usize::MAX)
    };
    evaluated.sort_by(|(_, a), (_, b)| {
        a.peak_activations
            .total_cmp(&b.peak_activations)
            .then(a.makespan.total_cmp(&b.makespan))
            .then(rank(&a.expression).cmp(&rank(&b.expression)))
    });
    evaluated
}

/// The frontier of `evaluated` within `cap`: walked by peak, each strict improvement kept.
fn walk(
    evaluated: Vec<(Family, Candidate)>,
    expressions: &[String],
    cap: Option<f64>,
) -> Vec<FrontierPoint> {
    let evaluated = sorted(evaluated, expressions);
    let mut points: Vec<FrontierPoint> = Vec::new();
    for (family, c) in &evaluated {
        if cap.is_some_and(|cap| c.peak_activations > cap + TOLERANCE) {
            continue;
        }
        if points
            .last()
            .is_some_and(|p| c.makespan >= p.makespan - TOLERANCE)
        {
            continue;
        }
        // A candidate at the same peak as the last point but faster replaces it.
        if points
            .last()
            .is_some_and(|p| (p.peak_activations - c.peak_activations).abs() < TOLERANCE)
        {
            points.pop();
        }
        points.push(FrontierPoint {
            memory_limit: c.peak_activations,
            expression: c.expression.clone(),
            makespan: c.makespan,
            peak_activations: c.peak_activations,
            family: family.label(&c.expression),
        });
    }
    points
}

/// The frontier's point for `limit`: the fastest whose peak fits.
pub fn point_within(frontier: &Frontier, limit: f64) -> Option<&FrontierPoint> {
    frontier
        .frontier
        .iter()
        .rev()
        .find(|p| p.peak_activations <= limit + TOLERANCE)
}

/// Whether `expression` built under `config` gives `point`'s figures.
pub fn reproduces(config: &PipelineConfig, point: &FrontierPoint) -> bool {
    let Ok(plan) = build_plan(&point.expression, config) else {
        return false;
    };
    let Ok(sim) = config.simulate(&plan) else {
        return false;
    };
    let peak = pipeweave_core::max_peak(&plan);
    (sim.makespan() - point.makespan).abs() < 1e-6 && (peak - point.peak_activations).abs() < 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_frontier_is_monotone_and_every_point_reproduces() {
        let config = PipelineConfig::new(4, 8).unwrap();
        let found = frontier(&config, &|_| {});
        assert!(found.frontier.len() >= 3, "{:?}", found.frontier);
        for pair in found.frontier.windows(2) {
            assert!(pair[1].peak_activations > pair[0].peak_activations);
            assert!(pair[1].makespan < pair[0].makespan);
        }
        for point in &found.frontier {
            assert!(reproduces(&config, point), "{point:?}");
        }
        let svg = frontier_svg(&found, "frontier");
        assert!(svg.starts_with("<svg") && svg.contains("frontier"));
    }

    #[test]
    fn recompute_and_offload_extend_the_frontier_and_reproduce() {
        let config = PipelineConfig::new(8, 32).unwrap();
        let found = frontier(&config, &|_| {});
        let residency: Vec<&FrontierPoint> = found
            .frontier
            .iter()
            .filter(|p| {
                found
                    .evaluated
                    .iter()
                    .any(|(f, c)| f.moves_activations() && c.expression == p.expression)
            })
            .collect();
        assert!(residency.len() >= 2, "{:?}", found.frontier);
        // Below V-Min's peak (4 at this size) the residency points beat every schedule that
        // keeps its activations at the same memory.
        for point in &residency {
            assert!(reproduces(&config, point), "{point:?}");
            let kept_best = found
                .evaluated
                .iter()
                .filter(|(f, c)| {
                    !f.moves_activations()
                        && c.peak_activations <= point.peak_activations + TOLERANCE
                })
                .map(|(_, c)| c.makespan)
                .fold(f64::INFINITY, f64::min);
            assert!(point.makespan < kept_best, "{point:?} against {kept_best}");
        }
        let svg = frontier_svg(&found, "frontier");
        assert!(svg.contains("offload") || svg.contains("recompute"));
    }

    #[test]
    fn a_limit_below_every_kept_schedule_gets_offloaded_interleavings_at_the_limit() {
        // PipeOffload's grid: P = 8, M = 32, a transfer half a forward, one unit per rank.
        let costs = pipeweave_core::StageCostsSpec::builder()
            .offload(0.5)
            .build()
            .validate()
            .unwrap();
        let config = PipelineConfig::new(8, 32)
            .and_then(|c| c.with_costs(costs, 0.0))
            .unwrap()
            .with_memory_limit(Some(1.0));
        let found = frontier(&config, &|_| {});
        let best = &found.ranked().candidates[0];
        // Before the limit bases, the best within one unit took 513 (ZB-V's ladder at one unit);
        // PipeOffload's own point is 97.75 at a quarter unit (8 chunks, all offloaded).
        assert!(best.makespan <= 97.75 + TOLERANCE, "{best:?}");
        assert!(best.peak_activations <= 1.0 + TOLERANCE);
        assert!(
            best.expression.starts_with("offload(zero_bubble(vpp("),
            "{best:?}"
        );
        assert!(best
            .expression
            .ends_with("order=block), policy=in_place), chunks=8)"));
    }

    #[test]
    fn a_point_within_a_limit_fits_it_and_no_faster_fits() {
        let config = PipelineConfig::new(4, 8).unwrap();
        let found = frontier(&config, &|_| {});
        let point = point_within(&found, 2.0).unwrap();
        assert!(point.peak_activations <= 2.0);
        assert!(found
            .evaluated
            .iter()
            .all(|(_, c)| c.peak_activations > 2.0 + TOLERANCE
                || c.makespan >= point.makespan - TOLERANCE));
    }
}
