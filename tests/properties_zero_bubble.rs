//! Property tests of `dual` and `zero_bubble` over random sizes: every pass prefix verifies, the
//! memory cap holds, and the closed forms of DualPipe and ZB-H1 hold under uniform costs.

mod common;

use common::{close, depth, peak, persisted, uniform_config};
use pipeweave::core_ir::TOLERANCE;
use pipeweave::{build_plan, simulate};
use proptest::prelude::*;

proptest! {
    #![proptest_config(persisted(depth(60, 360), "proptest-regressions/properties_zero_bubble.txt"))]

    /// DualPipe under uniform costs (F = I = W, F&B = F + B, as in DeepSeek's own figures): idle
    /// per rank (makespan - busy) is (PP/2 - 1)(F&B + B - 3W), peak PP + 1.
    #[test]
    fn dualpipe_closed_forms(half in 1u32..=5, extra in 0u32..=6, unit in 1u32..=3) {
        let p = 2 * half;
        let m = 2 * p + 2 * extra;
        let (f, i, w) = (unit as f64, unit as f64, unit as f64);
        let fb = f + i + w;
        let c = uniform_config(p, m, f, i, w, Some(fb));
        for expr in ["dual(f1b(gpipe))", "zero_bubble(dual(f1b(gpipe)))"] {
            let plan = build_plan(expr, &c).unwrap();
            let sim = simulate(&plan).unwrap();
            if expr.starts_with("zero") {
                let expected = f64::from(p / 2 - 1) * (fb + (i + w) - 3.0 * w);
                for (r, figures) in sim.ranks().iter().enumerate() {
                    prop_assert!(close(figures.idle, expected), "P={} M={} rank {}: idle {} != {}", p, m, r, figures.idle, expected);
                    prop_assert!(close(figures.peak_activations, f64::from(p + 1)), "rank {} peak {}", r, figures.peak_activations);
                }
            }
        }
    }

    /// DualPipeV is DualPipe cut in half: PP = 2P, with stage costs half a rank's share.
    #[test]
    fn dualpipev_closed_forms(p in 1u32..=6, extra in 0u32..=8, unit in 1u32..=3) {
        let m = 2 * p + extra;
        let (f, i, w) = (2.0 * unit as f64, 2.0 * unit as f64, 2.0 * unit as f64);
        let fb = f + i + w;
        let c = uniform_config(p, m, f, i, w, Some(fb));
        // The V layout takes any microbatch count; the standard one only Megatron's.
        let plan = build_plan("zero_bubble(dual(vpp(f1b(gpipe), chunks=2, layout=v)))", &c).unwrap();
        let sim = simulate(&plan).unwrap();
        let (i, w, fb) = (i / 2.0, w / 2.0, fb / 2.0);
        let expected = f64::from(p - 1) * (fb + (i + w) - 3.0 * w);
        for (r, figures) in sim.ranks().iter().enumerate() {
            prop_assert!(close(figures.idle, expected), "P={} M={} rank {}: idle {} != {}", p, m, r, figures.idle, expected);
            // Peak 2P + 1 stages of half a share each.
            prop_assert!(close(figures.peak_activations * 2.0, f64::from(2 * p + 1)), "rank {} peak {}", r, figures.peak_activations);
        }
    }

    /// ZB-H1 with W no longer than F and I (the paper's regime): idle per rank (P - 1)(F + I - W),
    /// and no more memory than 1F1B.
    #[test]
    fn zb_h1_closed_form(p in 1u32..=8, k in 1u32..=4, f in 1u32..=3, i in 1u32..=3, w in 1u32..=3) {
        let m = p * k;
        let (f, i, w) = (f as f64, i as f64, w as f64);
        prop_assume!(w <= f && w <= i);
        let plan = build_plan("zero_bubble(f1b(gpipe), policy=h1)", &uniform_config(p, m, f, i, w, None)).unwrap();
        let sim = simulate(&plan).unwrap();
        let expected = f64::from(p - 1) * (f + i - w);
        for (r, figures) in sim.ranks().iter().enumerate() {
            prop_assert!(close(figures.idle, expected), "P={} M={} rank {}: idle {} != {}", p, m, r, figures.idle, expected);
            prop_assert!(figures.peak_activations <= f64::from(p.min(m)) + TOLERANCE);
        }
    }

    /// Every prefix of the client's composition verifies; auto keeps its memory cap and is never
    /// worse than ZB-H1 at ZB-H1's memory.
    #[test]
    fn compositions_verify_and_auto_keeps_its_promises(
        p in 1u32..=6, extra in 0u32..=6, f in 1u32..=3, i in 1u32..=3, w in 1u32..=3, slack in 0u32..=4,
    ) {
        let m = 2 * p + extra;
        let c = uniform_config(p, m, f as f64, i as f64, w as f64, None);
        for expr in [
            "zero_bubble(f1b(gpipe), policy=h1)",
            "zero_bubble(f1b(gpipe), policy=h2)",
            "zero_bubble(f1b(gpipe))",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=h1)",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=h2)",
            "dual(vpp(f1b(gpipe), chunks=2, layout=v))",
            "zero_bubble(dual(vpp(f1b(gpipe), chunks=2, layout=v)))",
            "zero_bubble(dual(vpp(f1b(gpipe), chunks=2, layout=v)), policy=auto)",
        ] {
            let plan = build_plan(expr, &c).unwrap_or_else(|e| panic!("{expr} at P={p} M={m}: {e}"));
            simulate(&plan).unwrap();
        }
        if p % 2 == 0 {
            for expr in ["dual(f1b(gpipe))", "zero_bubble(dual(f1b(gpipe)))", "zero_bubble(dual(f1b(gpipe)), policy=auto)"] {
                let m = m + m % 2;
                build_plan(expr, &uniform_config(p, m, f as f64, i as f64, w as f64, None)).unwrap();
            }
        }
        // On dual plans auto never does worse than DeepSeek's order.
        let deepseek = simulate(&build_plan("zero_bubble(dual(vpp(f1b(gpipe), chunks=2, layout=v)))", &c).unwrap()).unwrap();
        let auto_dual = simulate(&build_plan("zero_bubble(dual(vpp(f1b(gpipe), chunks=2, layout=v)), policy=auto)", &c).unwrap()).unwrap();
        prop_assert!(auto_dual.max_span() <= deepseek.max_span() + TOLERANCE, "auto {} worse than DeepSeek {}", auto_dual.max_span(), deepseek.max_span());
        let h1 = simulate(&build_plan("zero_bubble(f1b(gpipe), policy=h1)", &c).unwrap()).unwrap();
        let h1_peak = peak(&h1);
        let limit = h1_peak + f64::from(slack);
        let auto = build_plan(&format!("zero_bubble(f1b(gpipe), policy=auto, memory={limit})"), &c).unwrap();
        let auto_sim = simulate(&auto).unwrap();
        for figures in auto_sim.ranks() {
            prop_assert!(figures.peak_activations <= limit + TOLERANCE);
        }
        prop_assert!(auto_sim.max_span() <= h1.max_span() + TOLERANCE, "auto {} worse than h1 {}", auto_sim.max_span(), h1.max_span());
    }
}
