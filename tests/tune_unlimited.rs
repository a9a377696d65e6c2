//! `tune` without a memory limit is never slower than `tune` with one (issue 45): over random
//! sizes, cost sets with latency and limits (on the ladder's half-microbatch grid and between its
//! rungs), the best makespan the unlimited search returns is at most the best the limited search
//! (the frontier's: `auto` at every rung up to the limit, recompute, offload, PipeOffload's blocks)
//! returns. Both run through [`ConfigRequest::tune`], as `pipeweave tune` and Python do.

mod common;

use common::{depth, persisted, split_costs};
use pipeweave::core_ir::TOLERANCE;
use pipeweave::{ConfigRequest, MemoryLimit};
use proptest::prelude::*;

/// (F, I, W, comm): unit costs, then uneven ones with latency.
const COSTS: &[(f64, f64, f64, f64)] = &[
    (1.0, 1.0, 1.0, 0.0),
    (1.0, 1.0, 1.0, 0.3),
    (2.0, 3.0, 1.0, 0.5),
    (1.0, 1.5, 0.7, 0.2),
    (1.0, 1.0, 0.5, 0.25),
];

fn request(p: u32, m: u32, (f, i, w, comm): (f64, f64, f64, f64)) -> ConfigRequest {
    ConfigRequest {
        costs: split_costs(f, i, w)
            .validate()
            .expect("the cost sets are valid"),
        comm,
        ..ConfigRequest::new(p, m)
    }
}

/// The best makespan `tune` returns for `request` within `limit` (None: no limit); None where
/// nothing fits.
fn best(request: &ConfigRequest, limit: Option<f64>) -> Option<f64> {
    let request = ConfigRequest {
        memory_limit: limit.map(|l| MemoryLimit::units(l).expect("a positive limit")),
        ..request.clone()
    };
    let report = request.tune(&|_| {}).ok()?;
    Some(report.candidates.first()?.makespan)
}

proptest! {
    #![proptest_config(persisted(depth(6, 12), "proptest-regressions/tune_unlimited.txt"))]

    #[test]
    fn without_a_limit_tune_is_never_slower_than_within_one(
        p in 2u32..=5,
        extra in 0u32..=8,
        costs in 0usize..COSTS.len(),
        rung in 1u32..=12,
        between in prop::sample::select(vec![0.0, 0.2, 0.33, 0.45]),
    ) {
        let m = p + extra;
        let request = request(p, m, COSTS[costs]);
        let limit = f64::from(rung) * 0.5 + between;
        let unlimited = best(&request, None).expect("without a limit something always fits");
        if let Some(limited) = best(&request, Some(limit)) {
            prop_assert!(
                unlimited <= limited + TOLERANCE,
                "P={} M={} costs {:?}: {} without a limit, {} within {}",
                p, m, COSTS[costs], unlimited, limited, limit
            );
        }
    }
}

/// The issue's case: P = 4, M = 12 with latency 0.3 gave 39.8 without a limit and 37.9 within 8.
#[test]
fn the_issue_s_case_is_no_slower_unlimited() {
    let request = request(4, 12, (1.0, 1.0, 1.0, 0.3));
    let unlimited = best(&request, None).unwrap();
    let within = best(&request, Some(8.0)).unwrap();
    assert!(unlimited <= within + TOLERANCE, "{unlimited} > {within}");
    assert!((unlimited - 37.9).abs() < 1e-6, "{unlimited}");
}
