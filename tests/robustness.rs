//! No input panics: random expressions, sizes and option strings give a value or a typed error.

mod common;

use common::persisted;
use pipeweave::cli::{parse_activation_memory, parse_costs};
use pipeweave::{build_plan, compile_expression, PipelineConfig};
use proptest::prelude::*;

const PIECES: &[&str] = &[
    "gpipe",
    "f1b",
    "vpp",
    "dual",
    "zero_bubble",
    "(",
    ")",
    ",",
    "=",
    "chunks",
    "group",
    "layout",
    "v",
    "standard",
    "0",
    "1",
    "2",
    "3",
    "7",
    "-1",
    "1e9",
    "4294967296",
    " ",
    "policy",
    "h1",
    "x",
];

fn expression() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(PIECES), 0..14).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(persisted(6000, "proptest-regressions/robustness.txt"))]

    #[test]
    fn random_expressions_never_panic(text in expression(), p in 0u32..=6, m in 0u32..=12) {
        let _ = compile_expression(&text);
        if let Ok(config) = PipelineConfig::new(p, m) {
            let _ = build_plan(&text, &config);
        }
    }

    #[test]
    fn random_bytes_never_panic(text in ".{0,40}") {
        let _ = compile_expression(&text);
        let _ = parse_costs(&text);
        let _ = parse_activation_memory(&text);
        let _ = text.parse::<pipeweave::Task>();
    }

    #[test]
    fn well_formed_vpp_arguments_give_a_plan_or_a_typed_error(
        p in 1u32..=8, m in 1u32..=24, chunks in 0u32..=70, group in 0u32..=30, v in any::<bool>(),
    ) {
        let layout = if v { ", layout=v" } else { "" };
        let text = format!("vpp(f1b(gpipe), chunks={chunks}, group={group}{layout})");
        let config = PipelineConfig::new(p, m).unwrap();
        if let Err(e) = build_plan(&text, &config) {
            let message = e.to_string();
            prop_assert!(!message.contains("a bug in the pass"), "{}: {}", text, message);
        }
    }
}

const CELLS: &[&str] = &[
    "0F0",
    "1F0",
    "0B0",
    "1B0",
    "0I1",
    "1W1",
    "0SEND_F0",
    "1RECV_F0",
    "1SEND_B0",
    "0RECV_B0",
    "0WAIT_SEND_F0",
    "1WAIT_SEND_B0",
    "(0F1;1B0)OVERLAP_F_B",
    "",
    " ",
    "x",
    "9F9",
    "0F4294967295",
    "0F99999999999",
    "3B",
    "F1",
    "-1F0",
];

fn csv_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::collection::vec(prop::sample::select(CELLS), 0..8),
        0..4,
    )
    .prop_map(|rows| rows.into_iter().map(|r| r.join(",") + "\n").collect())
}

proptest! {
    #![proptest_config(persisted(4000, "proptest-regressions/robustness_csv.txt"))]

    /// Any CSV-like text imports, verifies, projects and checks to a value or a typed error.
    #[test]
    fn random_schedule_files_never_panic(text in csv_text()) {
        use pipeweave::core_ir::{check_programs, formats::csv::import_csv, project, verify, ProjectionOptions};
        if let Ok(imported) = import_csv(&text, pipeweave::StageCosts::default(), 0.0) {
            if let Some(programs) = &imported.programs {
                let _ = check_programs(imported.plan.problem(), programs);
            }
            if verify(&imported.plan).is_ok() {
                let programs = project(&imported.plan, ProjectionOptions::default()).unwrap();
                check_programs(imported.plan.problem(), &programs).unwrap();
            }
        }
    }
}

#[test]
fn absurd_sizes_are_typed_errors() {
    assert!(PipelineConfig::new(0, 1).is_err());
    assert!(PipelineConfig::new(1, 0).is_err());
    assert!(PipelineConfig::new(u32::MAX, 1).is_err());
    assert!(PipelineConfig::new(1, u32::MAX).is_err());
    let big = PipelineConfig::new(2048, 64).unwrap();
    let err = build_plan("vpp(f1b(gpipe), chunks=64)", &big).unwrap_err();
    assert!(err.to_string().contains("too large"), "{err}");
}
