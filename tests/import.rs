//! Importing schedules: every reference file (as PyTorch CSV) imports and checks cleanly;
//! deadlocking and malformed files give precise errors, never a panic or a hang.

mod common;

use common::*;
use pipeweave::core_ir::formats::csv::{import_csv, lowered_csv};
use pipeweave::core_ir::{check_programs, project, verify, CoreError, ProjectionOptions};
use pipeweave::{build_plan, simulate, PipelineConfig, StageCosts};

fn import(text: &str) -> Result<pipeweave::core_ir::formats::csv::Imported, CoreError> {
    import_csv(text, StageCosts::default(), 0.0)
}

#[test]
fn every_reference_file_imports_and_checks_cleanly() {
    let files = references("");
    assert!(files.len() >= 19);
    for (name, file) in files {
        let Some(order) = file["order"].as_array() else {
            continue;
        };
        let csv: String = order
            .iter()
            .map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap())
                    .collect::<Vec<_>>()
                    .join(",")
                    + "\n"
            })
            .collect();
        let imported = import(&csv).unwrap_or_else(|e| panic!("{name}: {e}"));
        let plan = imported.plan;
        verify(&plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        let placement: Vec<u64> = plan
            .problem()
            .stage_to_rank()
            .iter()
            .map(|r| u64::from(r.get()))
            .collect();
        let expected: Vec<u64> = file["stage_to_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(placement, expected, "{name}: placement from the rows");
        assert_eq!(
            plan.problem().microbatches(),
            field(&file, "microbatches"),
            "{name}"
        );
        if let Some(routes) = file["routes"].as_array() {
            assert_eq!(
                plan.problem().routes().len(),
                routes.len(),
                "{name}: routes inferred"
            );
        }
        let programs = project(&plan, ProjectionOptions::default()).unwrap();
        check_programs(plan.problem(), &programs).unwrap_or_else(|e| panic!("{name}: {e}"));
        simulate(&plan).unwrap();
        // And the lowered form of it imports and checks too.
        let lowered = import(&lowered_csv(&programs)).unwrap();
        check_programs(lowered.plan.problem(), &lowered.programs.unwrap()).unwrap();
    }
}

#[test]
fn a_deadlocking_compute_csv_is_reported_with_its_cycle() {
    // Rank 1 runs microbatch 1 before microbatch 0, whose backward rank 0 waits for first.
    let text = "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n";
    let imported = import(text).unwrap();
    let err = verify(&imported.plan).unwrap_err().to_string();
    assert!(
        err.contains("deadlock: rank 0 waits at task 1 (0B0) for 1I0 (stage 1, microbatch 0); rank 1 waits at task 0 (1F1) for 0F1 (stage 0, microbatch 1)"),
        "{err}"
    );
}

#[test]
fn a_deadlocking_lowered_csv_is_reported_with_its_cycle() {
    // Both ranks receive before they send what the other waits for.
    let text = "0F0,0SEND_F0,0RECV_B0,0WAIT_SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n";
    let ok = import(text).unwrap();
    check_programs(ok.plan.problem(), &ok.programs.unwrap()).unwrap();
    let bad = "0RECV_B0,0F0,0SEND_F0,0WAIT_SEND_F0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n";
    let imported = import(bad).unwrap();
    let err = check_programs(imported.plan.problem(), &imported.programs.unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("rank 0, instruction 1 (0B0)") || err.contains("deadlock"),
        "{err}"
    );
}

#[test]
fn a_rank_that_never_receives_is_named() {
    let plan = build_plan("f1b(gpipe)", &PipelineConfig::new(2, 2).unwrap()).unwrap();
    let programs = project(&plan, ProjectionOptions::default()).unwrap();
    let text = lowered_csv(&programs).replace("1RECV_F1,", "");
    let imported = import(&text).unwrap();
    let err = check_programs(imported.plan.problem(), &imported.programs.unwrap())
        .unwrap_err()
        .to_string();
    // The imported program keeps the file's WAIT_SEND and UNSHARD cells as instructions (index 7
    // counts one of each).
    assert_eq!(err, "rank 1, instruction 7 (1F1): needs act(stage 0 -> 1, mb 1) from rank 0, which it never received before");
}

#[test]
fn malformed_files_name_line_and_column() {
    let cases = [
        ("", "line 1, column 1: the file has no rows"),
        ("0F0,0B0\n\n1F0,1B0\n", "line 2, column 1: empty line"),
        ("0F0,0X0\n", "line 1, column 2: `0X0`: unknown action `X`; PyTorch's actions are F, I, W, B, OVERLAP_F_B, WAIT_SEND_F"),
        ("0F0,0f0\n", "line 1, column 2: `0f0`: no action name after the stage number"),
        ("0F0,1WAIT_REDUCE\n", "line 1, column 2: `1WAIT_REDUCE`: unknown action `WAIT_REDUCE`"),
        ("0F0,(0F1;1I0)OVERLAP_F_B\n", "line 1, column 2: `(0F1;1I0)OVERLAP_F_B`: an overlap pairs one forward (F) with one full backward (B)"),
        ("0F0,hello\n", "line 1, column 2: `hello`: an action starts with its stage number, e.g. 2F0"),
        ("0F0,0B99999999999\n", "line 1, column 2: `0B99999999999`: the microbatch 99999999999 is too large"),
        ("0F0,0SEND_Fx\n", "line 1, column 2: the microbatch must be a decimal number"),
        ("0F0,0B0\n1F0,0F1\n", "imported schedule: stage 0 appears on rank 0 (line 1) and on rank 1 (line 2)"),
        ("0F0,0B0,2F0,2B0\n", "imported schedule: stage 1 appears in no row"),
        ("0F0,0B0,0F2,0B2\n", "imported schedule: microbatch 1 appears in no action"),
        ("0F4000000000\n", "microbatches = 4000000001 is out of range"),
        ("0F4294967296\n", "the microbatch 4294967296 is too large"),
        ("0F1048576\n", "microbatches = 1048577 is out of range"),
        ("0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0\n", "line 1, column 2: 0SEND_F0 has no later WAIT_SEND on its rank"),
        ("0F0,0B0\n1F0,1SEND_F0,1WAIT_SEND_F0,1B0\n", "line 2, column 2: stage 1 has no neighbour on microbatch 0's route in that direction"),
        (
            "0F0,0SEND_F0,0RECV_B0,0WAIT_SEND_F0,0B0\n1RECV_F0,1SEND_B0,1WAIT_SEND_B0,1F0,1B0\n",
            "rank 1, instruction 0: send-grad(stage 1, mb 0) to rank 0 is not a message of this plan or comes before its data is computed",
        ),
    ];
    for (text, expected) in cases {
        let err = match import(text) {
            Err(e) => e.to_string(),
            Ok(imported) => match verify(&imported.plan) {
                Err(e) => e.to_string(),
                Ok(()) => match imported
                    .programs
                    .map(|p| check_programs(imported.plan.problem(), &p))
                {
                    Some(Err(e)) => e.to_string(),
                    _ => "accepted".to_string(),
                },
            },
        };
        assert!(err.contains(expected), "{text:?}: {err}");
    }
}

#[test]
fn a_send_without_its_wait_is_rejected() {
    let text = "0F0,0SEND_F0,0B0\n1RECV_F0,1F0,1B0\n";
    let err = import(text).unwrap_err().to_string();
    assert!(
        err.contains("has no later WAIT_SEND on its rank") || err.contains("no neighbour"),
        "{err}"
    );
    let text = "0F0,0B0\n1F0,1B0\n";
    let imported = import(text).unwrap();
    assert_eq!(imported.plan.problem().stages(), 2);
    assert!(
        imported.programs.is_none(),
        "a file without communication actions is a compute file"
    );
}

#[test]
fn pytorchs_own_files_import_with_markers_quotes_and_a_byte_order_mark() {
    let plain = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
    let pytorch = "\u{feff}\"0UNSHARD\",\"0F0\",\"0F1\",0B0,0B1,0REDUCE_GRAD\n1UNSHARD,1F0,1B0,1F1,1B1,1RESHARD,1REDUCE_GRAD\n";
    let a = import(plain).unwrap();
    let b = import(pytorch).unwrap();
    assert_eq!(a.plan.orders(), b.plan.orders());
    assert!(verify(&b.plan).is_ok());
    let err = import("0UNSHARDx,0F0\n").err().unwrap();
    assert!(
        err.to_string()
            .contains("the microbatch must be a decimal number"),
        "{err}"
    );
}

#[test]
fn a_backward_overlapping_its_own_forward_is_refused() {
    let err = import("(0F0;0B0)OVERLAP_F_B\n").err().unwrap();
    assert!(
        err.to_string().contains("cannot overlap its own forward"),
        "{err}"
    );
}

#[test]
fn a_wait_send_that_blocks_on_a_blocked_peer_is_a_rendezvous_deadlock() {
    // PyTorch's lowered rows from issue 10: each rank waits for its send to be received while
    // the peer waits for its own.
    let text = "0F0,0SEND_F0,0WAIT_SEND_F0,0F1,0SEND_F1,0WAIT_SEND_F1,0RECV_B0,0B0,0F2,0RECV_B1,0SEND_F2,0WAIT_SEND_F2,0B1,0RECV_B2,0B2\n\
                1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1RECV_F2,1WAIT_SEND_B1,1F2,1B2,1SEND_B2,1WAIT_SEND_B2\n";
    let imported = import(text).unwrap();
    let err = check_programs(imported.plan.problem(), &imported.programs.unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(
            "deadlock under rendezvous (WAIT_SEND blocks) semantics: rank 0 waits at instruction"
        ),
        "{err}"
    );
    assert!(err.contains("rank 1 waits at instruction"), "{err}");
}
