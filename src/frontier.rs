//! `tune --frontier`: the memory/time frontier, the fastest schedule found for every memory limit.
//!
//! The search: every fixed candidate of [`crate::tune::candidate_expressions`] (gpipe, 1F1B,
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
//! both passes on the whole-backward bases of [`LIMIT_BASES`] (1F1B and 2- to 8-chunk
//! interleaving), whose own peaks lie above the limit where the kept frontier cannot see them,
//! and on the kept knees and fastest point (a residency pass outermost is the one that fits a
//! declared limit, so their schedules are built as without it). These reach below the least memory any kept schedule needs, and can beat kept schedules above
//! it (a fast schedule with hidden transfers against a slower one that keeps everything).
//!
//! The frontier: for each limit, the fastest expression whose peak fits; its rows are the limits
//! where that changes (the point's own peak), so it is monotone by construction: a larger limit
//! keeps every schedule a smaller one had. Ties go to the smaller peak, then to the candidate
//! listed first (fixed schedules before the ladder, lower rungs first, the residency stage last).

use crate::config::{build_plan, PipelineConfig};
use crate::frontier_limit::{frontier_limit, FrontierLimit};
use crate::report::tidy;
use crate::tune::{candidate_expressions, tune_with, Candidate, TuneReport};
use pipeweave_core::TOLERANCE;
use pipeweave_transforms::Registry;
use serde::Serialize;

/// The inner plans whose `zero_bubble(..., policy=auto, memory=r)` runs on the ladder.
pub const LADDER_FAMILIES: [&str; 3] = [
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
];

/// One point of the frontier.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FrontierPoint {
    /// The smallest limit at which this point is the fastest (its own peak).
    pub memory_limit: f64,
    /// The expression (give it to `plan` with the same options).
    pub expression: String,
    /// Its makespan.
    pub makespan: f64,
    /// Its peak activations (units of a rank's share).
    pub peak_activations: f64,
    /// The family it belongs to: the expression itself for fixed schedules, `auto on INNER`
    /// for the ladder.
    pub family: String,
}

/// What the frontier search found.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Frontier {
    /// The points, by increasing memory and decreasing makespan.
    pub frontier: Vec<FrontierPoint>,
    /// Every schedule evaluated, with its family (for the picture).
    #[serde(skip)]
    pub evaluated: Vec<(String, Candidate)>,
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

/// The ladder's limits for `ranks` ranks and one microbatch's activations `total`, up to `cap`.
pub fn ladder(ranks: u32, total: f64, cap: Option<f64>) -> Vec<f64> {
    let step = total / 2.0;
    let top = 2.0 * f64::from(ranks) * total;
    let top = cap.map_or(top, |c| c.min(top));
    (1..)
        .map(|k| f64::from(k) * step)
        .take_while(|r| *r <= top + TOLERANCE)
        .collect()
}

fn ladder_expression(inner: &str, limit: f64) -> String {
    format!("zero_bubble({inner}, policy=auto, memory={limit})")
}

/// Every expression of the search, with its family, in tie-breaking order; the ladder stops at
/// the config's memory limit.
pub fn frontier_expressions(config: &PipelineConfig) -> Vec<(String, String)> {
    let cap = config.memory_limit();
    let mut out: Vec<(String, String)> = candidate_expressions(
        config.ranks(),
        config.microbatches(),
        cap,
        config.sequence(),
    )
    .into_iter()
    .map(|e| (e.clone(), e))
    .collect();
    for limit in ladder(config.ranks(), config.memory().total(), cap) {
        for inner in LADDER_FAMILIES {
            out.push((ladder_expression(inner, limit), format!("auto on {inner}")));
        }
    }
    out
}

/// The passes of the residency stage, which fit a plan to a limit by moving its activations.
pub const RESIDENCY_PASSES: [&str; 2] = ["recompute", "offload"];

/// The family of PipeOffload's building blocks with whole chunks offloaded
/// (`offload(BLOCK, chunks=K)`, [`chunk_offload_expressions`]).
pub const CHUNK_OFFLOAD_FAMILY: &str = "chunk offload";

/// Whether a family's plans move activations (recompute, offload, chunk offload): the frontier's
/// residency points.
pub fn moves_activations(family: &str) -> bool {
    RESIDENCY_PASSES.contains(&family) || family == CHUNK_OFFLOAD_FAMILY
}

/// The schedules the frontier's picture names beside their dots (expression, name).
pub const NAMED_SCHEDULES: [(&str, &str); 7] = [
    ("gpipe", "GPipe"),
    ("f1b(gpipe)", "1F1B"),
    ("zero_bubble(f1b(gpipe), policy=h1)", "ZB-H1"),
    ("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", "ZB-V"),
    (
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=v_half)",
        "V-Half",
    ),
    (
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=v_min)",
        "V-Min",
    ),
    ("zero_bubble(dual(f1b(gpipe)))", "DualPipe"),
];

/// The base below the knees whose backwards are whole (its activations can all move).
pub const WHOLE_BACKWARDS_BASE: &str = LIMIT_BASES[0];

/// How much slower than the fastest point the knees of a kept frontier may be: its least peak
/// within a quarter of the fastest makespan, and within a half.
pub const KNEES: [f64; 2] = [1.25, 1.5];

/// The bases the residency stage also fits to a user's limit itself: whole-backward schedules
/// (every activation can move) from 1F1B to 8-chunk interleaving, whose peaks lie above the
/// limit, so the kept frontier within it never names them. PipeOffload's low-memory points are
/// offloaded interleavings of this kind; more chunks hold less per microbatch in flight (at
/// P = 8, M = 32, a transfer a quarter of a forward: 8 chunks reach a quarter unit at 103.2).
pub const LIMIT_BASES: [&str; 8] = [
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=3)",
    "vpp(f1b(gpipe), chunks=4)",
    "vpp(f1b(gpipe), chunks=5)",
    "vpp(f1b(gpipe), chunks=6)",
    "vpp(f1b(gpipe), chunks=7)",
    "vpp(f1b(gpipe), chunks=8)",
];

/// The chunk counts of PipeOffload's building block the residency stage offloads whole chunks
/// of (`offload(..., chunks=K)`), as their sweep does: more chunks hold less per microbatch.
pub const CHUNK_OFFLOAD_CHUNKS: std::ops::RangeInclusive<u32> = 2..=8;

/// PipeOffload's own points: `offload(zero_bubble(vpp(f1b(gpipe), chunks=C, group=G,
/// order=block), policy=in_place), chunks=K)` (their group building block, its backwards split
/// in place, its first `K` chunks offloaded in slots of the link) for every `C` of
/// [`CHUNK_OFFLOAD_CHUNKS`], each group `G` of [`chunk_offload_groups`] and `K` from 1 to `C` (the family `offload`), and each block without offload (`K = 0`, a fixed schedule).
/// Their peaks follow from `K` and the link's speed, not from a limit, so the frontier keeps
/// those that fit.
pub fn chunk_offload_expressions(ranks: u32, microbatches: u32) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for c in CHUNK_OFFLOAD_CHUNKS {
        for g in chunk_offload_groups(ranks, microbatches) {
            let base = format!(
                "zero_bubble(vpp(f1b(gpipe), chunks={c}, group={g}, order=block), policy=in_place)"
            );
            out.push((base.clone(), base.clone()));
            for k in 1..=c {
                out.push((
                    format!("offload({base}, chunks={k})"),
                    CHUNK_OFFLOAD_FAMILY.to_string(),
                ));
            }
        }
    }
    out
}

/// The groups of PipeOffload's building block the residency stage tries: those their README
/// recommends (`ceil(P/2)` to `P`) and the powers of two below (their slow-link points use
/// groups of 1, 2 and 4), at most `microbatches`.
pub fn chunk_offload_groups(ranks: u32, microbatches: u32) -> Vec<u32> {
    let half = ranks.div_ceil(2);
    let below = std::iter::successors(Some(1u32), |g| g.checked_mul(2)).take_while(|&g| g < half);
    below
        .chain(half..=ranks)
        .filter(|&g| g <= microbatches)
        .collect()
}

/// A knee of a kept frontier: its least peak within `slower` times its fastest makespan.
pub fn knee(kept: &[FrontierPoint], slower: f64) -> Option<&FrontierPoint> {
    let fastest = kept.last()?;
    kept.iter()
        .find(|p| p.makespan <= slower * fastest.makespan)
        .or(Some(fastest))
}

/// The residency stage's limits below the fastest point of `kept` (a frontier of schedules that
/// keep their activations): the frontier's least peak; a quarter, a half and three quarters of
/// each knee's peak ([`KNEES`]), and of the fastest point's peak above the first knee; and `cap`;
/// rounded down to steps of `total / 2`, from `total / 2` up.
pub fn residency_rungs(kept: &[FrontierPoint], total: f64, cap: Option<f64>) -> Vec<f64> {
    let (Some(first), Some(last), Some(knee)) = (kept.first(), kept.last(), knee(kept, KNEES[0]))
    else {
        return Vec::new();
    };
    let step = total / 2.0;
    let quarters = |p: f64| [p / 4.0, p / 2.0, 3.0 * p / 4.0];
    let above_knee = quarters(last.peak_activations)
        .into_iter()
        .filter(|&r| r > knee.peak_activations);
    let knees = KNEES
        .iter()
        .filter_map(|&k| self::knee(kept, k))
        .flat_map(|p| quarters(p.peak_activations));
    let mut rungs: Vec<f64> = std::iter::once(first.peak_activations)
        .chain(knees)
        .chain(above_knee)
        .chain(cap)
        .map(|r| ((r / step) + TOLERANCE).floor() * step)
        .filter(|&r| r >= step - TOLERANCE && r < last.peak_activations - TOLERANCE)
        .filter(|&r| cap.is_none_or(|c| r <= c + TOLERANCE))
        .collect();
    rungs.sort_by(f64::total_cmp);
    rungs.dedup_by(|a, b| (*a - *b).abs() < TOLERANCE);
    rungs
}

/// The residency stage's expressions with their families: at every rung, each residency pass on
/// the knees of `kept` whose peaks are above the rung (moving the fastest schedule's activations
/// costs more there) and on 1F1B there, on its fastest point where the rung is above the knees,
/// and on its point just above the rung; and at the limit `cap` itself, each on the
/// whole-backward bases of [`LIMIT_BASES`] and on the knees and fastest point of `kept`.
pub fn residency_expressions(
    kept: &[FrontierPoint],
    total: f64,
    cap: Option<f64>,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    if let Some(fastest) = kept.last() {
        below_the_kept(&mut out, kept, fastest, total, cap);
    }
    // At the limit itself, the whole-backward bases, whatever the kept frontier holds, and the
    // kept knees and fastest point (built under the limit, a residency pass outermost moves
    // their activations rather than their schedules fitting it alone: `PassList`'s rule).
    if let Some(limit) = cap.filter(|&c| c > 0.0) {
        let kept_bases = KNEES
            .iter()
            .filter_map(|&k| knee(kept, k))
            .chain(kept.last())
            .map(|p| p.expression.as_str());
        let bases: Vec<&str> = LIMIT_BASES.iter().copied().chain(kept_bases).collect();
        push_residency(&mut out, &bases, tidy(limit));
    }
    out
}

/// The residency expressions at the rungs below the kept frontier's fastest point (see
/// [`residency_expressions`]).
fn below_the_kept(
    out: &mut Vec<(String, String)>,
    kept: &[FrontierPoint],
    fastest: &FrontierPoint,
    total: f64,
    cap: Option<f64>,
) {
    let knees: Vec<&FrontierPoint> = KNEES.iter().filter_map(|&k| knee(kept, k)).collect();
    for rung in residency_rungs(kept, total, cap) {
        let above = kept
            .iter()
            .find(|p| p.peak_activations > rung + TOLERANCE)
            .unwrap_or(fastest);
        let mut bases: Vec<&str> = knees
            .iter()
            .filter(|k| k.peak_activations > rung + TOLERANCE)
            .map(|k| k.expression.as_str())
            .collect();
        if bases.is_empty() {
            bases.push(fastest.expression.as_str());
        } else {
            // Below a knee, also 1F1B: its backwards are whole, so every activation can move (a
            // schedule with split backwards keeps what its weight gradients need).
            bases.push(WHOLE_BACKWARDS_BASE);
        }
        bases.push(above.expression.as_str());
        bases.dedup();
        push_residency(out, &bases, rung);
    }
}

/// Each residency pass on each of `bases` at `rung`, where not listed yet.
fn push_residency(out: &mut Vec<(String, String)>, bases: &[&str], rung: f64) {
    for pass in RESIDENCY_PASSES {
        for base in bases {
            let expression = format!("{pass}({base}, memory={rung})");
            if !out.iter().any(|(e, _)| *e == expression) {
                out.push((expression, pass.to_string()));
            }
        }
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
    let family_of = |jobs: &[(String, String)], e: &str| {
        jobs.iter()
            .find(|(x, _)| x == e)
            .map_or_else(|| e.to_string(), |(_, f)| f.clone())
    };
    let kept: Vec<(String, Candidate)> = kept_report
        .candidates
        .into_iter()
        .map(|c| (family_of(&jobs, &c.expression), c))
        .collect();
    let kept_points = walk(kept.clone(), &kept_expressions, cap);
    let residency = residency_expressions(&kept_points, config.memory().total(), cap);
    let mut done = kept_expressions.len();
    let mut evaluated = kept;
    let mut rejected = kept_report.rejected;
    let mut stage = |jobs: &mut Vec<(String, String)>,
                     config: &PipelineConfig,
                     stage_jobs: Vec<(String, String)>| {
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

/// How many of the whole-chunk offloads just above a limit the residency stage relieves at it.
pub const RELIEVED_CHUNK_OFFLOADS: usize = 6;

/// `recompute(E, memory=limit)` for the first [`RELIEVED_CHUNK_OFFLOADS`] points of the frontier
/// of `above` (whole-chunk offloads whose peaks exceed `limit`), from the least peak up: what
/// the link could not hide is recomputed (PipeOffload's slow-link points at their least memory).
fn relieved_chunk_offloads(above: &[(String, Candidate)], limit: f64) -> Vec<(String, String)> {
    let mut by_peak: Vec<&Candidate> = above.iter().map(|(_, c)| c).collect();
    by_peak.sort_by(|a, b| {
        a.peak_activations
            .total_cmp(&b.peak_activations)
            .then(a.makespan.total_cmp(&b.makespan))
    });
    let mut out = Vec::new();
    let mut fastest = f64::INFINITY;
    for c in by_peak {
        if c.makespan < fastest - TOLERANCE {
            fastest = c.makespan;
            let expression = format!("recompute({}, memory={})", c.expression, tidy(limit));
            out.push((expression, "recompute".to_string()));
        }
        if out.len() == RELIEVED_CHUNK_OFFLOADS {
            break;
        }
    }
    out
}

/// `evaluated` by peak, then makespan, then listing order in `expressions`.
fn sorted(
    mut evaluated: Vec<(String, Candidate)>,
    expressions: &[String],
) -> Vec<(String, Candidate)> {
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
    evaluated: Vec<(String, Candidate)>,
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
            family: family.clone(),
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

/// The frontier as an SVG picture: makespan against peak memory, one line per ladder family,
/// fixed schedules and the residency stage's plans as dots (recompute and offload coloured),
/// the frontier's points ringed and joined as a step line.
pub fn frontier_svg(frontier: &Frontier, title: &str) -> String {
    const W: f64 = 900.0;
    const H: f64 = 460.0;
    const LEFT: f64 = 80.0;
    const RIGHT: f64 = 340.0;
    const TOP: f64 = 40.0;
    const BOTTOM: f64 = 60.0;
    let all = &frontier.evaluated;
    let best = frontier.frontier.last().map_or(1.0, |p| p.makespan);
    // The picture shows what matters: up to 1.25 times the fastest point's peak, and makespans up
    // to three times the fastest (the tightest limits run far slower and would flatten the rest).
    // Wide enough for 1F1B's peak too, so the named schedules stay in view where the frontier's
    // fastest point needs far less memory.
    let f1b_peak = all
        .iter()
        .find(|(_, c)| c.expression == "f1b(gpipe)")
        .map_or(0.0, |(_, c)| c.peak_activations * 1.1);
    let max_x = frontier
        .frontier
        .last()
        .map_or(1.0, |p| p.peak_activations * 1.25)
        .max(f1b_peak)
        .max(1e-9);
    let max_y = all
        .iter()
        .map(|(_, c)| c.makespan)
        .filter(|m| *m <= best * 3.0)
        .fold(best, f64::max);
    // Low enough for the limit under the frontier where it is within a fifth of the fastest.
    let floor = frontier
        .limit
        .as_ref()
        .map_or(best, |l| l.any)
        .max(best * 0.8);
    let min_y = best.min(floor) * 0.95;
    let shown =
        |c: &Candidate| c.makespan <= max_y + TOLERANCE && c.peak_activations <= max_x + TOLERANCE;
    let x = |v: f64| LEFT + (v / max_x) * (W - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - (v - min_y) / (max_y - min_y).max(1e-9)) * (H - TOP - BOTTOM);
    // The legend's entry `row` (from the top), right of the plot.
    let legend_row = |row: u32, colour: &str, name: &str| {
        legend_entry(W - RIGHT + 16.0, TOP + 18.0 * f64::from(row), colour, name)
    };
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{LEFT}\" y=\"22\" font-size=\"14\">{}</text>\n",
        escape(title)
    );
    let (x0, y0, x1, y1) = (x(0.0), y(min_y), x(max_x), y(max_y));
    svg.push_str(&format!(
        "<line x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x1:.1}\" y2=\"{y0:.1}\" stroke=\"black\"/>\n\
         <line x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x0:.1}\" y2=\"{y1:.1}\" stroke=\"black\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">peak activations per rank</text>\n\
         <text x=\"18\" y=\"{:.1}\" transform=\"rotate(-90 18 {:.1})\" text-anchor=\"middle\">makespan</text>\n",
        (x0 + x1) / 2.0,
        H - 18.0,
        (y0 + y1) / 2.0,
        (y0 + y1) / 2.0
    ));
    for k in 0..=4 {
        let v = min_y + (max_y - min_y) * f64::from(k) / 4.0;
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.1}</text>\n",
            x0 - 6.0,
            y(v) + 4.0
        ));
        let m = max_x * f64::from(k) / 4.0;
        svg.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{m:.1}</text>\n",
            x(m),
            y0 + 16.0
        ));
    }
    let colours = ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"];
    let mut legend = 0;
    for (i, family) in LADDER_FAMILIES.iter().enumerate() {
        let name = format!("auto on {family}");
        let mut line: Vec<(f64, f64)> = all
            .iter()
            .filter(|(f, c)| *f == name && shown(c))
            .map(|(_, c)| (c.peak_activations, c.makespan))
            .collect();
        line.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        line.dedup_by(|a, b| (a.0 - b.0).abs() < TOLERANCE);
        if line.is_empty() {
            continue;
        }
        let path: Vec<String> = line
            .iter()
            .map(|&(px, py)| format!("{:.1},{:.1}", x(px), y(py)))
            .collect();
        let colour = colours[i % colours.len()];
        svg.push_str(&polyline(
            &path,
            &format!("stroke=\"{colour}\" stroke-width=\"1.5\""),
        ));
        svg.push_str(&legend_row(legend, colour, &name));
        legend += 1;
    }
    // Fixed schedules grey; recompute and offload in colours of their own.
    let dot = |family: &str| match family {
        "recompute" => "#8c564b",
        "offload" => "#e377c2",
        CHUNK_OFFLOAD_FAMILY => "#17becf",
        _ => "#7f7f7f",
    };
    for (family, c) in all
        .iter()
        .filter(|(f, c)| !f.starts_with("auto on ") && shown(c))
    {
        let title = if moves_activations(family) {
            &c.expression
        } else {
            family
        };
        svg.push_str(&format!(
            "<g><title>{}: {} at {}</title><circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"/></g>\n",
            escape(title),
            c.makespan,
            c.peak_activations,
            x(c.peak_activations),
            y(c.makespan),
            dot(family)
        ));
        if let Some((_, name)) = NAMED_SCHEDULES.iter().find(|(e, _)| *e == c.expression) {
            svg.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{name}</text>\n",
                x(c.peak_activations) + 5.0,
                y(c.makespan) - 5.0
            ));
        }
    }
    for (name, family) in [
        ("fixed schedules", ""),
        ("recompute(...)", "recompute"),
        ("offload(...)", "offload"),
        ("offload(block, chunks=K)", CHUNK_OFFLOAD_FAMILY),
    ] {
        svg.push_str(&legend_row(legend, dot(family), name));
        legend += 1;
    }
    let mut steps = Vec::new();
    for (i, p) in frontier.frontier.iter().enumerate() {
        if p.makespan > max_y + TOLERANCE {
            continue;
        }
        steps.push(format!("{:.1},{:.1}", x(p.peak_activations), y(p.makespan)));
        let next = frontier
            .frontier
            .get(i + 1)
            .map_or(max_x, |n| n.peak_activations);
        steps.push(format!("{:.1},{:.1}", x(next), y(p.makespan)));
        svg.push_str(&format!(
            "<g><title>{}: {} at {}</title><circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/></g>\n",
            escape(&p.expression),
            p.makespan,
            p.peak_activations,
            x(p.peak_activations),
            y(p.makespan)
        ));
    }
    svg.push_str(&polyline(
        &steps,
        "stroke=\"#d62728\" stroke-dasharray=\"4 3\"",
    ));
    svg.push_str(&legend_row(legend, "#d62728", "frontier"));
    legend += 1;
    if let Some(limit) = &frontier.limit {
        let (keeping, any) = limit_lines(limit, max_x, min_y, &x, &y);
        svg.push_str(&polyline(
            &keeping,
            "stroke=\"#000000\" stroke-width=\"1.5\"",
        ));
        svg.push_str(&legend_row(
            legend,
            "#000000",
            "the limit (keeping activations)",
        ));
        legend += 1;
        svg.push_str(&polyline(
            &any,
            "stroke=\"#000000\" stroke-dasharray=\"1 3\"",
        ));
        svg.push_str(&legend_row(
            legend,
            "#555555",
            "the limit (recompute, offload)",
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

/// The limit's two lines in picture coordinates: keeping activations as steps (a bound at a
/// limit holds for every peak up to it, so it is drawn from the limit before), and any
/// schedule's as a level line; bounds below the picture sit on its floor.
fn limit_lines(
    limit: &FrontierLimit,
    max_x: f64,
    min_y: f64,
    x: &dyn Fn(f64) -> f64,
    y: &dyn Fn(f64) -> f64,
) -> (Vec<String>, Vec<String>) {
    let mut keeping = Vec::new();
    let shown = limit
        .points
        .iter()
        .filter(|p| p.memory_limit <= max_x + TOLERANCE);
    let mut before = 0.0;
    for p in shown {
        let level = y(p.keeping_activations.max(min_y));
        keeping.push(format!("{:.1},{level:.1}", x(before)));
        keeping.push(format!("{:.1},{level:.1}", x(p.memory_limit)));
        before = p.memory_limit;
    }
    let level = y(limit.any.max(min_y));
    let any = vec![
        format!("{:.1},{level:.1}", x(0.0)),
        format!("{:.1},{level:.1}", x(max_x)),
    ];
    (keeping, any)
}

/// An unfilled line through `points` (`x,y` each), drawn with the stroke attributes `stroke`.
fn polyline(points: &[String], stroke: &str) -> String {
    format!(
        "<polyline points=\"{}\" fill=\"none\" {stroke}/>\n",
        points.join(" ")
    )
}

fn legend_entry(x: f64, y: f64, colour: &str, name: &str) -> String {
    format!(
        "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"4\" fill=\"{colour}\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n",
        y - 4.0,
        x + 18.0,
        y + 1.0,
        escape(name)
    )
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
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
            .filter(|p| moves_activations(&p.family))
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
                    !moves_activations(f)
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
        // Nothing fits a limit of 0.67 but what moves activations, at the limit itself.
        let expressions = residency_expressions(&[], 1.0, Some(0.67));
        assert!(expressions
            .iter()
            .any(|(e, _)| e == "offload(vpp(f1b(gpipe), chunks=3), memory=0.67)"));
    }

    #[test]
    fn residency_rungs_sit_below_the_knee_and_the_fastest() {
        let point = |peak: f64, makespan: f64| FrontierPoint {
            memory_limit: peak,
            expression: format!("e{peak}"),
            makespan,
            peak_activations: peak,
            family: String::new(),
        };
        let kept = [point(1.0, 500.0), point(4.0, 110.0), point(8.0, 100.0)];
        assert_eq!(knee(&kept, KNEES[0]).unwrap().peak_activations, 4.0);
        assert_eq!(knee(&kept, KNEES[1]).unwrap().peak_activations, 4.0);
        // The least peak 1, quarters of the knee (1, 2, 3), of the fastest above the knee (6).
        assert_eq!(residency_rungs(&kept, 1.0, None), [1.0, 2.0, 3.0, 6.0]);
        assert_eq!(residency_rungs(&kept, 1.0, Some(2.5)), [1.0, 2.0, 2.5]);
        let expressions = residency_expressions(&kept, 1.0, None);
        assert!(expressions.contains(&(
            "recompute(e4, memory=2)".to_string(),
            "recompute".to_string()
        )));
        assert!(expressions.contains(&("offload(e8, memory=6)".to_string(), "offload".to_string())));
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

    #[test]
    fn the_ladder_steps_by_half_a_microbatch_up_to_twice_1f1b() {
        assert_eq!(
            ladder(2, 1.0, None),
            [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
        );
        assert_eq!(ladder(2, 1.0, Some(1.2)), [0.5, 1.0]);
    }
}
