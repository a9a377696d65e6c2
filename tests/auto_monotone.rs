//! `zero_bubble(..., policy=auto, memory=N)` over a ladder of N (issue 18, item 2): its makespan
//! never increases as N grows, and no handcrafted schedule of the same layout that fits N is
//! faster (1F1B or interleaving as given, ZB-H1, ZB-H2, ZB-V, V-Half, V-Min), over random sizes
//! and costs with communication latency.

mod common;

use common::{costed, depth, persisted, split_costs};
use pipeweave::core_ir::{max_peak, TOLERANCE};
use pipeweave::{build_plan, simulate, PipelineConfig};
use proptest::prelude::*;

/// The layouts `auto` runs on, with the handcrafted schedules of each.
const LAYOUTS: &[(&str, &[&str])] = &[
    (
        "f1b(gpipe)",
        &[
            "f1b(gpipe)",
            "zero_bubble(f1b(gpipe), policy=h1)",
            "zero_bubble(f1b(gpipe), policy=h2)",
        ],
    ),
    ("vpp(f1b(gpipe), chunks=2)", &["vpp(f1b(gpipe), chunks=2)"]),
    (
        "vpp(f1b(gpipe), chunks=2, layout=v)",
        &[
            "vpp(f1b(gpipe), chunks=2, layout=v)",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=v_half)",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=v_min)",
        ],
    ),
];

/// (F, I, W, comm).
const COSTS: &[(f64, f64, f64, f64)] = &[
    (1.0, 1.0, 1.0, 0.0),
    (1.0, 1.0, 1.0, 0.1),
    (2.0, 3.0, 1.0, 0.5),
    (1.0, 1.0, 0.5, 0.25),
];

fn config(p: u32, m: u32, (f, i, w, comm): (f64, f64, f64, f64)) -> PipelineConfig {
    costed(p, m, split_costs(f, i, w), comm)
}

proptest! {
    #![proptest_config(persisted(depth(2, 24), "proptest-regressions/auto_monotone.txt"))]

    #[test]
    fn auto_never_slows_as_memory_grows_and_beats_what_fits(
        p in 2u32..=6,
        extra in 0u32..=12,
        layout in 0usize..LAYOUTS.len(),
        costs in 0usize..COSTS.len(),
    ) {
        let m = p + extra;
        let c = config(p, m, COSTS[costs]);
        let (inner, handcrafted) = LAYOUTS[layout];
        let fixed: Vec<(String, f64, f64)> = handcrafted
            .iter()
            .filter_map(|e| {
                let plan = build_plan(e, &c).ok()?;
                Some((e.to_string(), max_peak(&plan), simulate(&plan).ok()?.makespan()))
            })
            .collect();
        let mut previous: Option<(f64, f64)> = None;
        for k in 1..=(4 * p) {
            let n = f64::from(k) * 0.5;
            let expression = format!("zero_bubble({inner}, policy=auto, memory={n})");
            let Ok(plan) = build_plan(&expression, &c) else {
                prop_assert!(previous.is_none(), "{} fails after a smaller limit fit", expression);
                continue;
            };
            let makespan = simulate(&plan).unwrap().makespan();
            prop_assert!(max_peak(&plan) <= n + TOLERANCE);
            if let Some((smaller, before)) = previous {
                prop_assert!(makespan <= before + TOLERANCE, "P={} M={}: {} takes {} at {} but {} at {}", p, m, expression, makespan, n, before, smaller);
            }
            for (name, peak, fixed_makespan) in &fixed {
                if *peak <= n + TOLERANCE {
                    prop_assert!(makespan <= fixed_makespan + TOLERANCE, "P={} M={}: {} takes {}, {} (peak {}) {}", p, m, expression, makespan, name, peak, fixed_makespan);
                }
            }
            previous = Some((n, makespan));
        }
    }
}
