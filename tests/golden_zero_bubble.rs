//! Golden tests of `dual` and `zero_bubble` against DeepSeek's and sail-sg's schedules in
//! ../shared/reference: orders op for op where the peer's schedule is deterministic by rule, and
//! the files' figures (makespan, idle time, peak activations) under their cost models.

mod common;

use common::*;
use pipeweave::core_ir::TOLERANCE;
use pipeweave::{build_plan, simulate, PipelineConfig, Simulation, StageCostsSpec};
use serde_json::Value;

/// The reference file's costs as the costs of a rank's share (`per_stage_factor` converts costs
/// given per stage into a rank's share holding that many stages' worth).
fn config(file: &Value, per_stage_factor: f64, memory_limit: Option<f64>) -> PipelineConfig {
    let c = &file["expect"]["costs"];
    let get = |k: &str| c[k].as_f64().map(|v| v * per_stage_factor);
    let costs = StageCostsSpec::builder()
        .forward(get("F").unwrap())
        .input_grad(get("I").unwrap())
        .weight_grad(get("W").unwrap())
        .overlapped_opt(get("OVERLAP_F_B"))
        .build();
    let comm = c["comm"].as_f64().unwrap_or(0.0);
    let (ranks, microbatches) = (field(file, "ranks"), field(file, "microbatches"));
    costed(ranks, microbatches, costs, comm).with_memory_limit(memory_limit)
}

fn numbers(file: &Value, key: &str) -> Vec<f64> {
    f64s(&file["expect"][key])
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 2e-6 * (1.0 + b.abs())
}

/// Makespan and idle time equal the file's; peaks equal after converting our units (a rank's
/// share) into the file's (`peak_factor` stages per share).
fn assert_figures(name: &str, sim: &Simulation, file: &Value, peak_factor: f64) {
    let expect_makespan = file["expect"]["makespan"].as_f64().unwrap();
    assert!(
        close(sim.makespan(), expect_makespan),
        "{name}: makespan {} != {expect_makespan}",
        sim.makespan()
    );
    // Rank by rank, ours (in the file's units) against the file's `key`.
    let per_rank = |what: &str, key: &str, ours: Vec<f64>| {
        for (r, (ours, theirs)) in ours.into_iter().zip(numbers(file, key)).enumerate() {
            assert!(
                close(ours, theirs),
                "{name}: rank {r} {what} {ours} != {theirs}"
            );
        }
    };
    let figures = sim.ranks().iter();
    let idle = figures.clone().map(|r| r.idle).collect();
    per_rank("idle", "idle_per_rank", idle);
    let peaks = figures.map(|r| r.peak_activations * peak_factor).collect();
    per_rank("peak", "peak_activations_per_rank", peaks);
    if let Some(rate) = file["expect"]["bubble_rate"].as_f64() {
        assert!(
            (sim.bubble_rate() - rate).abs() < 1e-5,
            "{name}: bubble rate {} != {rate}",
            sim.bubble_rate()
        );
    }
}

#[test]
fn dualpipe_is_zero_bubble_of_dual_1f1b() {
    let files = references("dualpipe_");
    assert!(!files.is_empty());
    for (name, file) in files {
        let plan = build_plan("zero_bubble(dual(f1b(gpipe)))", &config(&file, 1.0, None)).unwrap();
        assert_eq!(
            plan.problem().tied_stages().len(),
            field(&file, "ranks") as usize
        );
        assert_same_order(&name, &plan, &file);
        assert_figures(&name, &simulate(&plan).unwrap(), &file, 1.0);
    }
}

#[test]
fn dualpipev_is_zero_bubble_of_dual_interleaved() {
    let files = references("dualpipev_");
    assert!(!files.is_empty());
    for (name, file) in files {
        // The file's costs are per stage; a rank's share is two stages.
        let plan = build_plan(
            "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
            &config(&file, 2.0, None),
        )
        .unwrap();
        assert_same_order(&name, &plan, &file);
        assert_figures(&name, &simulate(&plan).unwrap(), &file, 2.0);
        // The V layout as input gives the same DualPipeV.
        let from_v = build_plan(
            "zero_bubble(dual(vpp(f1b(gpipe), chunks=2, layout=v)))",
            &config(&file, 2.0, None),
        )
        .unwrap();
        assert_eq!(
            plan_orders(&from_v),
            plan_orders(&plan),
            "{name}: from the V layout"
        );
    }
}

#[test]
fn zb_h1_and_h2_are_reproduced_op_for_op() {
    for (prefix, policy) in [("zb-h1_", "h1"), ("zb-h2_", "h2")] {
        let files = references(prefix);
        assert!(!files.is_empty());
        for (name, file) in files {
            let expr = format!("zero_bubble(f1b(gpipe), policy={policy})");
            let plan = build_plan(&expr, &config(&file, 1.0, None)).unwrap();
            assert_same_order(&name, &plan, &file);
            assert_figures(&name, &simulate(&plan).unwrap(), &file, 1.0);
        }
    }
}

/// ZB-V and ZB-2p come from heuristics; ours must match or beat their makespan at no more memory.
#[test]
fn zb_v_and_zb_2p_are_matched_or_beaten_at_no_more_memory() {
    let cases = [
        ("zb-v_", "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))"),
        ("zb-2p_", "zero_bubble(f1b(gpipe), policy=auto)"),
    ];
    for (prefix, expr) in cases {
        let files = references(prefix);
        assert!(!files.is_empty());
        for (name, file) in files {
            let theirs_peak = max_of(&file["expect"]["peak_activations_per_rank"]);
            let plan = build_plan(expr, &config(&file, 1.0, Some(theirs_peak))).unwrap();
            let sim = simulate(&plan).unwrap();
            let theirs = file["expect"]["makespan"].as_f64().unwrap();
            assert!(
                sim.makespan() <= theirs + 1e-6,
                "{name}: makespan {} > {theirs}",
                sim.makespan()
            );
            for (r, figures) in sim.ranks().iter().enumerate() {
                assert!(
                    figures.peak_activations <= theirs_peak + TOLERANCE,
                    "{name}: rank {r} peak {}",
                    figures.peak_activations
                );
            }
        }
    }
}

/// The Zero Bubble paper's table: 1F1B, ZB-H1 and ZB-H2 reproduced, and `auto` at p (resp. 2p)
/// activations no worse than the paper's ZB-1p (resp. ZB-2p) column, at the table's precision.
#[test]
fn paper_table_is_matched_or_beaten() {
    let path = reference_dir().join("zb_paper_table.json");
    let table = pipeweave::paper_table::read_table(path.to_str().unwrap()).unwrap();
    assert_eq!(table.rows.len(), 12);
    let rounded = |x: f64| (x * 1e4).round() / 1e4;
    for row in &table.rows {
        let ours = row.ours().unwrap();
        let paper = |k: &str| row.bubble_rate[k];
        let label = format!("p={} m={} T_W={}", row.p, row.m, row.t_w);
        assert_eq!(rounded(ours.one_f_one_b), paper("1F1B"), "{label}: 1F1B");
        assert_eq!(rounded(ours.h1), paper("ZB-H1"), "{label}: ZB-H1");
        assert_eq!(rounded(ours.h2), paper("ZB-H2"), "{label}: ZB-H2");
        assert!(
            rounded(ours.auto_1p) <= paper("ZB-1p"),
            "{label}: ZB-1p {} > {}",
            ours.auto_1p,
            paper("ZB-1p")
        );
        assert!(
            rounded(ours.auto_2p) <= paper("ZB-2p"),
            "{label}: ZB-2p {} > {}",
            ours.auto_2p,
            paper("ZB-2p")
        );
    }
}
