//! ZB-V against sail-sg's: on every configuration of `tests/fixtures/zbv_sailsg.json` (8 ranks with
//! few and many microbatches, with and without communication latency, under unit and the paper's
//! 6.2B costs; the arXiv paper's ZB-V rows at 16, 24 and 32 stages), the CLI's ZB-V expression at
//! its default memory limit is no slower than sail-sg's scheduler (makespan, and the longest
//! per-rank span the paper's bubble rate is measured on) at no more peak memory. The fixture holds
//! the figures of sail-sg's own code, run by `tools/zbv_sailsg.py` (its docstring says how).

mod common;

use common::{costed, peak, read_json, split_costs};
use pipeweave::core_ir::TOLERANCE;
use pipeweave::{build_plan, simulate, Simulation};
use serde_json::Value;

/// The expression `pipeweave plan` users write for ZB-V.
const ZB_V: &str = "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))";

fn fixture() -> Value {
    read_json(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/zbv_sailsg.json"
    ))
}

fn number(value: &Value, key: &str) -> f64 {
    value[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing in {value}"))
}

/// Our ZB-V of one fixture configuration, simulated.
fn ours(config: &Value) -> Simulation {
    let costs = &config["costs"];
    let share = split_costs(number(costs, "F"), number(costs, "I"), number(costs, "W"));
    let ranks = number(config, "ranks") as u32;
    let microbatches = number(config, "microbatches") as u32;
    let pipeline = costed(ranks, microbatches, share, number(costs, "comm"));
    simulate(&build_plan(ZB_V, &pipeline).unwrap()).unwrap()
}

/// `ours <= theirs` up to floating-point noise (figures reach 1e7 in the paper's microseconds).
fn at_most(ours: f64, theirs: f64) -> bool {
    ours <= theirs + TOLERANCE * (1.0 + theirs.abs())
}

/// Ours against every version of sail-sg's scheduler that schedules the configuration.
fn check(config: &Value) {
    let name = config["name"].as_str().unwrap();
    let sim = ours(config);
    let peak = peak(&sim);
    let versions = config["sailsg"].as_object().unwrap();
    let mut compared = 0;
    for (version, theirs) in versions.iter().filter(|(_, v)| !v.is_null()) {
        compared += 1;
        let label = format!("{name} vs sail-sg {version}");
        let their_peak = number(theirs, "peak").min(number(theirs, "peak_own_model"));
        assert!(
            at_most(sim.makespan(), number(theirs, "makespan")),
            "{label}: makespan {} > {}",
            sim.makespan(),
            number(theirs, "makespan")
        );
        assert!(
            at_most(sim.max_span(), number(theirs, "max_span")),
            "{label}: longest span {} > {}",
            sim.max_span(),
            number(theirs, "max_span")
        );
        assert!(
            at_most(peak, their_peak),
            "{label}: peak {peak} > {their_peak}"
        );
    }
    assert!(compared > 0, "{name}: no sail-sg figures");
}

#[test]
fn zbv_matches_or_beats_sailsg_on_every_fixture_configuration() {
    let fixture = fixture();
    let configs = fixture["configs"].as_array().unwrap();
    for config in configs {
        check(config);
    }
}

#[test]
fn the_fixture_covers_the_issue_s_configurations() {
    let fixture = fixture();
    let names: Vec<&str> = fixture["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for m in [8, 10, 12, 16, 24] {
        for comm in ["0", "0.1", "1"] {
            let name = format!("unit_p8_m{m}_comm{comm}");
            assert!(names.contains(&name.as_str()), "{name} missing");
        }
        for comm in ["0", "0.0194"] {
            let name = format!("paper6b_p8_m{m}_comm{comm}");
            assert!(names.contains(&name.as_str()), "{name} missing");
        }
    }
    for m in [48, 64, 128] {
        let name = format!("arxiv_p16_m{m}");
        assert!(names.contains(&name.as_str()), "{name} missing");
    }
}

/// The paper's ZB-V column (bubble rate on the longest span) is matched or beaten at 16, 24 and
/// 32 stages.
#[test]
fn the_paper_s_zbv_column_is_matched_or_beaten() {
    let fixture = fixture();
    let rows = fixture["configs"].as_array().unwrap().iter();
    let mut seen = 0;
    for row in rows.filter(|c| c["name"].as_str().unwrap().starts_with("arxiv_")) {
        seen += 1;
        let ours = ours(row).bubble_rate();
        let paper = number(&row["sailsg"]["arxiv"], "bubble_rate");
        assert!(
            ours <= paper + TOLERANCE,
            "{}: bubble rate {ours} > {paper}",
            row["name"]
        );
    }
    assert_eq!(seen, 9);
}
