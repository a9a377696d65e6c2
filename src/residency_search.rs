//! The residency stage of the search: from the frontier of the schedules that keep their
//! activations (the first stage), the expressions that fit a base to a lower limit by moving
//! activations: `recompute(BASE, memory=r)` and `offload(BASE, memory=r)` at a few rungs below
//! the kept frontier's knees and at the config's limit itself ([`residency_expressions`]), and
//! recomputes of PipeOffload's whole-chunk offloads whose peaks are just above a limit
//! ([`relieved_chunk_offloads`]).

use crate::frontier_point::FrontierPoint;
use crate::report::tidy;
use crate::search_space::{Family, LIMIT_BASES, RESIDENCY_PASSES, WHOLE_BACKWARDS_BASE};
use crate::tune::Candidate;
use pipeweave_core::TOLERANCE;

/// How much slower than the fastest point the knees of a kept frontier may be: its least peak
/// within a quarter of the fastest makespan, and within a half.
pub const KNEES: [f64; 2] = [1.25, 1.5];

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
) -> Vec<(String, Family)> {
    let mut out: Vec<(String, Family)> = Vec::new();
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
    out: &mut Vec<(String, Family)>,
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
fn push_residency(out: &mut Vec<(String, Family)>, bases: &[&str], rung: f64) {
    for family in RESIDENCY_PASSES {
        let Some(pass) = family.residency_pass() else {
            continue;
        };
        for base in bases {
            let expression = format!("{pass}({base}, memory={rung})");
            if !out.iter().any(|(e, _)| *e == expression) {
                out.push((expression, family));
            }
        }
    }
}

/// How many of the whole-chunk offloads just above a limit the residency stage relieves at it.
pub const RELIEVED_CHUNK_OFFLOADS: usize = 6;

/// `recompute(E, memory=limit)` for the first [`RELIEVED_CHUNK_OFFLOADS`] points of the frontier
/// of `above` (whole-chunk offloads whose peaks exceed `limit`), from the least peak up: what
/// the link could not hide is recomputed (PipeOffload's slow-link points at their least memory).
pub fn relieved_chunk_offloads(above: &[(Family, Candidate)], limit: f64) -> Vec<(String, Family)> {
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
            out.push((expression, Family::Recompute));
        }
        if out.len() == RELIEVED_CHUNK_OFFLOADS {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(expressions.contains(&("recompute(e4, memory=2)".to_string(), Family::Recompute)));
        assert!(expressions.contains(&("offload(e8, memory=6)".to_string(), Family::Offload)));
    }

    #[test]
    fn a_limit_below_every_kept_schedule_gets_the_whole_backward_bases_at_the_limit() {
        // Nothing fits a limit of 0.67 but what moves activations, at the limit itself.
        let expressions = residency_expressions(&[], 1.0, Some(0.67));
        assert!(expressions
            .iter()
            .any(|(e, _)| e == "offload(vpp(f1b(gpipe), chunks=3), memory=0.67)"));
    }
}
