//! PyTorch's own lowered schedules (`compute_comms` dumps of its seven schedule classes at 2 and 4
//! ranks, every M from P to 3P it accepts, written by `tools/pytorch_lowered.py` with torch 2.15
//! into `tests/fixtures/pytorch/lowered/`) are read by `check` with every action PyTorch writes,
//! their communication checked as PyTorch runs it and their parameter actions in order, and
//! their figures are the closed forms of the schedules they are.

mod common;

use common::cli::cli;
use common::read_json;
use pipeweave::core_ir::formats::csv::import_csv;
use pipeweave::core_ir::{check_programs, TOLERANCE};
use pipeweave::{simulate, verify, StageCosts};
use serde_json::Value;
use std::path::PathBuf;

const CLASSES: [&str; 7] = [
    "ScheduleGPipe",
    "Schedule1F1B",
    "ScheduleInterleaved1F1B",
    "ScheduleLoopedBFS",
    "ScheduleInterleavedZeroBubble",
    "ScheduleZBVZeroBubble",
    "ScheduleDualPipeV",
];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pytorch/lowered")
}

fn index() -> Value {
    read_json(dir().join("index.json"))
}

fn names(index: &Value, key: &str) -> Vec<String> {
    index[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_str()
                .or_else(|| v["file"].as_str())
                .unwrap()
                .to_string()
        })
        .collect()
}

/// (class, P, M) of a dump's name.
fn size_of(name: &str) -> (String, u32, u32) {
    let stem = name.trim_end_matches(".csv");
    let mut parts = stem.rsplitn(3, '_');
    let m = parts
        .next()
        .unwrap()
        .trim_start_matches('m')
        .parse()
        .unwrap();
    let p = parts
        .next()
        .unwrap()
        .trim_start_matches("pp")
        .parse()
        .unwrap();
    (parts.next().unwrap().to_string(), p, m)
}

#[test]
fn every_class_and_size_is_dumped_or_refused_by_pytorch_with_a_reason() {
    let index = index();
    let written = names(&index, "written");
    let refused = names(&index, "refused");
    for class in CLASSES {
        for p in [2, 4] {
            for m in p..=3 * p {
                let name = format!("{class}_pp{p}_m{m}.csv");
                assert!(
                    written.contains(&name) ^ refused.contains(&name),
                    "{name}: neither dumped nor refused"
                );
            }
        }
    }
    assert_eq!(written.len(), 86, "dumps of torch 2.15");
    for class in CLASSES {
        assert!(
            written.iter().any(|n| n.starts_with(&format!("{class}_"))),
            "{class} has no dump"
        );
    }
    for entry in index["refused"].as_array().unwrap() {
        assert!(!entry["reason"].as_str().unwrap().is_empty());
    }
}

#[test]
fn check_accepts_every_lowered_dump_of_pytorch_with_its_figures() {
    let index = index();
    for name in names(&index, "written") {
        let text = std::fs::read_to_string(dir().join(&name)).unwrap();
        let imported =
            import_csv(&text, StageCosts::default(), 0.0).unwrap_or_else(|e| panic!("{name}: {e}"));
        verify(&imported.plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let programs = imported.programs.expect("a lowered dump has messages");
        let report = check_programs(imported.plan.problem(), &programs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            report.params.residency && report.params.reductions,
            "{name}: PyTorch's lowering holds both kinds"
        );
        let makespan = simulate(&imported.plan).unwrap().makespan();
        let (class, p, m) = size_of(&name);
        let (p, m) = (f64::from(p), f64::from(m));
        // Unit costs of a rank's share (F = I = W = 1): GPipe and 1F1B take (M + P - 1)(F + B);
        // interleaved 1F1B with two chunks M (F + B) + (P - 1)(F + B) / 2 where M is a multiple
        // of P (Megatron's formula).
        let expected = match class.as_str() {
            "ScheduleGPipe" | "Schedule1F1B" => Some(3.0 * (m + p - 1.0)),
            "ScheduleInterleaved1F1B" if m % p == 0.0 => Some(3.0 * m + 1.5 * (p - 1.0)),
            _ => None,
        };
        if let Some(expected) = expected {
            assert!(
                (makespan - expected).abs() < TOLERANCE,
                "{name}: makespan {makespan}, expected {expected}"
            );
        }
    }
}

#[test]
fn the_cli_checks_a_dump_and_names_its_parameter_actions() {
    let path = dir().join("ScheduleDualPipeV_pp4_m8.csv");
    let report = cli("check").arg(path).line("--format json").json();
    assert_eq!(
        report["parameter_actions"],
        serde_json::json!(["unshard/reshard", "gradient reduction"])
    );
    assert_eq!(report["microbatches"], 8);
}

#[test]
fn an_unknown_action_in_a_dump_is_named_with_its_cell() {
    let text = std::fs::read_to_string(dir().join("ScheduleGPipe_pp2_m2.csv")).unwrap();
    let text = text.replacen("0REDUCE_GRAD", "0REDUCE_GRADS", 1);
    let err = import_csv(&text, StageCosts::default(), 0.0)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("line 1, column ")
            && err.contains("`0REDUCE_GRADS`: unknown action `REDUCE_GRADS`"),
        "{err}"
    );
}
