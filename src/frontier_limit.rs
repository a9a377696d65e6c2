//! The limit under the frontier (`tune --frontier`): for each memory limit, no schedule of the
//! placements the frontier searches is faster.
//!
//! The placements: those of [`crate::search_space::LIMIT_BASES`] (1F1B and 2- to 8-chunk
//! interleaving), the V layout and DualPipe's two routes on 1F1B and 2-chunk interleaving. For
//! each, the relaxation's bound ([`pipeweave_core::lower_bound`]: every schedule, recomputes and
//! offloads included) and, at each limit, what the limit forces on the schedules that keep
//! their activations ([`pipeweave_transforms::schedules::exact::MemoryBound`]). Two lines
//! follow:
//! - **keeping activations**: at each limit, the least over the placements of the larger of the
//!   two: no schedule that keeps its activations within the limit is faster;
//! - **any**: the least relaxation's bound: no schedule at all, recomputing or offloading ones
//!   included, is faster at any limit.

use crate::compile::build_plan;
use crate::config::PipelineConfig;
use crate::report::tidy;
use crate::search_space::LIMIT_BASES;
use pipeweave_core::{lower_bound, TOLERANCE};
use pipeweave_transforms::schedules::exact::MemoryBound;
use serde::Serialize;

/// The placements beside [`LIMIT_BASES`]: the V layout and DualPipe's two routes.
const OTHER_PLACEMENTS: [&str; 3] = [
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "dual(f1b(gpipe))",
    "dual(vpp(f1b(gpipe), chunks=2))",
];

/// The limit at one memory limit.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct LimitPoint {
    /// Activations per rank.
    pub memory_limit: f64,
    /// No schedule that keeps its activations within `memory_limit` is faster (limits where
    /// none fits are left out).
    pub keeping_activations: f64,
}

/// The limit under a frontier.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FrontierLimit {
    /// By increasing memory.
    pub points: Vec<LimitPoint>,
    /// No schedule of these placements, recomputing or offloading ones included, is faster.
    pub any: f64,
}

/// The limit of `config`'s placements at each of `limits` (see the module doc); placements
/// that do not build at these sizes are left out (None when none builds).
pub fn frontier_limit(config: &PipelineConfig, limits: &[f64]) -> Option<FrontierLimit> {
    let unlimited = config.clone().with_memory_limit(None);
    let mut any = f64::INFINITY;
    let mut keeping = vec![f64::INFINITY; limits.len()];
    for expression in LIMIT_BASES.iter().chain(&OTHER_PLACEMENTS) {
        let Ok(plan) = build_plan(expression, &unlimited) else {
            continue;
        };
        let relaxed = lower_bound(&plan);
        any = any.min(relaxed);
        let mut memory = MemoryBound::new(&plan);
        for (k, &limit) in limits.iter().enumerate() {
            let forced = memory.at(limit);
            keeping[k] = keeping[k].min(relaxed.max(forced));
        }
    }
    if !any.is_finite() {
        return None;
    }
    // A bound at a limit holds at every smaller one; infinite where no placement fits.
    let mut order: Vec<usize> = (0..limits.len()).collect();
    order.sort_by(|&a, &b| limits[b].total_cmp(&limits[a]));
    let mut above: f64 = 0.0;
    for k in order {
        above = above.max(keeping[k]);
        keeping[k] = above;
    }
    let mut points: Vec<LimitPoint> = limits
        .iter()
        .zip(keeping)
        .filter(|(_, bound)| bound.is_finite())
        .map(|(&memory_limit, bound)| LimitPoint {
            memory_limit: tidy(memory_limit),
            keeping_activations: tidy(bound),
        })
        .collect();
    points.sort_by(|a, b| a.memory_limit.total_cmp(&b.memory_limit));
    points.dedup_by(|a, b| (a.memory_limit - b.memory_limit).abs() < TOLERANCE);
    Some(FrontierLimit {
        points,
        any: tidy(any),
    })
}
