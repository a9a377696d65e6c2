//! Text-grid snapshots (rank x time) of small schedules, and the reference files' figures.
//!
//! The grids live in `tests/snapshots/*.txt`; run with `UPDATE_SNAPSHOTS=1` to rewrite them after
//! an intended change, then read the diff.

mod common;

use pipeweave::{build_plan, render_grid, simulate, PipelineConfig};

fn check(name: &str, expression: &str, ranks: u32, microbatches: u32) {
    let plan = build_plan(
        expression,
        &PipelineConfig::new(ranks, microbatches).unwrap(),
    )
    .unwrap();
    let sim = simulate(&plan).unwrap();
    let actual = format!(
        "{expression} at {ranks} ranks, {microbatches} microbatches, unit costs\n{}makespan {}\n",
        render_grid(&plan, &sim),
        sim.makespan()
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(format!("{name}.txt"));
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_SNAPSHOTS=1 to create it)",
            path.display()
        )
    });
    assert_eq!(actual, expected, "snapshot {name} changed");
}

#[test]
fn gpipe_grid() {
    check("gpipe_p2_m3", "gpipe", 2, 3);
}

#[test]
fn one_f_one_b_grids() {
    check("f1b_p2_m3", "f1b(gpipe)", 2, 3);
    check("f1b_p4_m8", "f1b(gpipe)", 4, 8);
}

#[test]
fn vpp_grid_snapshot() {
    check("vpp_f1b_p2_m4", "vpp(f1b(gpipe), chunks=2)", 2, 4);
    check("vpp_f1b_p4_m8", "vpp(f1b(gpipe), chunks=2)", 4, 8);
    check("vpp_gpipe_p2_m4", "vpp(gpipe, chunks=2)", 2, 4);
    check(
        "vpp_f1b_v_p4_m8",
        "vpp(f1b(gpipe), chunks=2, layout=v)",
        4,
        8,
    );
}

#[test]
fn dual_grid() {
    check("dual_f1b_p2_m4", "dual(f1b(gpipe))", 2, 4);
    check(
        "zero_bubble_dual_f1b_p4_m8",
        "zero_bubble(dual(f1b(gpipe)))",
        4,
        8,
    );
    check(
        "zero_bubble_dual_vpp_p4_m8",
        "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
        4,
        8,
    );
}

#[test]
fn zero_bubble_grids() {
    check(
        "zero_bubble_h1_p4_m8",
        "zero_bubble(f1b(gpipe), policy=h1)",
        4,
        8,
    );
    check(
        "zero_bubble_h2_p4_m8",
        "zero_bubble(f1b(gpipe), policy=h2)",
        4,
        8,
    );
    check(
        "zero_bubble_v_p4_m8",
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
        4,
        8,
    );
}

#[test]
fn textbook_one_f_one_b_matches_the_reference_figures() {
    let file = common::reference("1f1b_pp4_m8_unit.json");
    let plan = build_plan("f1b(gpipe)", &PipelineConfig::new(4, 8).unwrap()).unwrap();
    assert_eq!(common::plan_orders(&plan), common::reference_orders(&file));
    let sim = simulate(&plan).unwrap();
    let expect = &file["expect"];
    assert_eq!(sim.makespan(), expect["makespan"].as_f64().unwrap());
    assert!((sim.bubble_rate() - expect["bubble_rate"].as_f64().unwrap()).abs() < 1e-6);
    let idle: Vec<f64> = sim.ranks().iter().map(|r| r.idle).collect();
    let peaks: Vec<f64> = sim.ranks().iter().map(|r| r.peak_activations).collect();
    let json = |k: &str| -> Vec<f64> {
        expect[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    assert_eq!(idle, json("idle_per_rank"));
    assert_eq!(peaks, json("peak_activations_per_rank"));
}
