//! No input panics: random expressions, sizes and option strings give a value or a typed error.

use pipeweave::cli::{parse_activation_memory, parse_costs};
use pipeweave::{build_plan, compile_expression, PipelineConfig};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

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
    #![proptest_config(ProptestConfig {
        cases: 400,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/robustness.txt"))),
        ..ProptestConfig::default()
    })]

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
