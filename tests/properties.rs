//! Property tests over random sizes: every pass prefix verifies, and simulated figures match the
//! closed forms where they exist.

mod common;

use common::{close, persisted, uniform_config};
use pipeweave::core_ir::TOLERANCE;
use pipeweave::Error;
use pipeweave::{build_plan, simulate, TransformError};
use proptest::prelude::*;

/// Whether Megatron accepts this interleaving (its rules on the group size).
fn megatron_accepts(p: u32, m: u32, g: u32) -> bool {
    p <= g && g <= m && (m % g == 0 || m % g >= p)
}

proptest! {
    #![proptest_config(persisted(512, "proptest-regressions/properties.txt"))]

    #[test]
    fn interleaving_takes_every_microbatch_count(p in 1u32..=8, m in 1u32..=40, v in 1u32..=4) {
        let c = uniform_config(p, m, 1.0, 1.0, 1.0, None);
        let plan = build_plan(&format!("vpp(f1b(gpipe), chunks={v})"), &c).unwrap();
        let sim = simulate(&plan).unwrap();
        // Never slower than one group of all microbatches, one of the orders it chooses from.
        if m >= p && v >= 2 {
            let one_group = build_plan(&format!("vpp(f1b(gpipe), chunks={v}, group={m})"), &c).unwrap();
            let one_group = simulate(&one_group).unwrap();
            prop_assert!(sim.makespan() <= one_group.makespan() + TOLERANCE, "{} > {}", sim.makespan(), one_group.makespan());
        }
        if v == 2 {
            build_plan("zero_bubble(vpp(f1b(gpipe), chunks=2))", &c).unwrap();
        }
    }

    #[test]
    fn dualpipev_takes_every_microbatch_count_and_is_never_slower_than_1f1b(p in 1u32..=8, m in 1u32..=24) {
        let c = uniform_config(p, m, 1.0, 1.0, 1.0, None);
        let f1b = simulate(&build_plan("f1b(gpipe)", &c).unwrap()).unwrap().makespan();
        for expr in ["dual(vpp(f1b(gpipe), chunks=2))", "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))"] {
            let plan = build_plan(expr, &c).unwrap();
            let makespan = simulate(&plan).unwrap().makespan();
            prop_assert!(makespan <= f1b + TOLERANCE, "{}: {} > {}", expr, makespan, f1b);
        }
    }

    #[test]
    fn every_pass_prefix_verifies(p in 1u32..=16, m in 1u32..=64, v in 1u32..=4, extra in 0u32..=4) {
        let c = uniform_config(p, m, 1.0, 1.0, 1.0, None);
        for expr in ["gpipe", "f1b(gpipe)"] {
            let plan = build_plan(expr, &c).unwrap();
            prop_assert_eq!(plan.passes().len(), if expr == "gpipe" { 1 } else { 2 });
            simulate(&plan).unwrap();
        }
        let plan = build_plan(&format!("vpp(gpipe, chunks={v})"), &c).unwrap();
        prop_assert_eq!(plan.problem().stages(), if v == 1 { p } else { p * v });
        let g = p + extra;
        let expr = format!("vpp(f1b(gpipe), chunks={v}, group={g})");
        match build_plan(&expr, &c) {
            Ok(plan) => {
                prop_assert!(v == 1 || megatron_accepts(p, m, g), "{} accepted against Megatron's rules", expr);
                simulate(&plan).unwrap();
            }
            Err(Error::Transform(TransformError::Precondition { pass, .. })) => {
                prop_assert_eq!(pass, "vpp");
                prop_assert!(v > 1 && !megatron_accepts(p, m, g));
            }
            Err(other) => prop_assert!(false, "{}: {}", expr, other),
        }
        for inner in ["gpipe", "f1b(gpipe)"] {
            let expr = format!("vpp({inner}, chunks=2, layout=v)");
            match build_plan(&expr, &c) {
                Ok(plan) => {
                    prop_assert_eq!(plan.problem().stage_to_rank()[(2 * p - 1) as usize].get(), 0);
                    simulate(&plan).unwrap();
                }
                Err(other) => prop_assert!(false, "{}: {}", expr, other),
            }
        }
    }

    #[test]
    fn one_f_one_b_and_gpipe_match_closed_forms(
        p in 1u32..=16, m in 1u32..=64, f in 1u32..=4, i in 1u32..=4, w in 0u32..=4,
    ) {
        let (f, i, w) = (f as f64, i as f64, w as f64);
        let c = uniform_config(p, m, f, i, w, None);
        let expected = f64::from(m + p - 1) * (f + i + w);
        for expr in ["gpipe", "f1b(gpipe)"] {
            let sim = simulate(&build_plan(expr, &c).unwrap()).unwrap();
            prop_assert!(close(sim.makespan(), expected), "{}: makespan {} != {}", expr, sim.makespan(), expected);
        }
        let sim = simulate(&build_plan("f1b(gpipe)", &c).unwrap()).unwrap();
        for (r, figures) in sim.ranks().iter().enumerate() {
            let expected = f64::from((p - r as u32).min(m));
            prop_assert!(close(figures.peak_activations, expected), "rank {}: peak {} != {}", r, figures.peak_activations, expected);
        }
    }

    #[test]
    fn interleaved_idle_fraction_matches_megatron(
        p in 1u32..=8, k in 1u32..=6, v in 2u32..=4, f in 1u32..=3, b in 1u32..=4,
    ) {
        let m = p * k;
        let c = uniform_config(p, m, f as f64, b as f64, 0.0, None);
        let sim = simulate(&build_plan(&format!("vpp(f1b(gpipe), chunks={v})"), &c).unwrap()).unwrap();
        let expected = f64::from(p - 1) / f64::from(v * m + p - 1);
        for figures in sim.ranks() {
            let fraction = figures.idle / sim.makespan();
            prop_assert!(close(fraction, expected), "idle fraction {} != {}", fraction, expected);
        }
    }
}
