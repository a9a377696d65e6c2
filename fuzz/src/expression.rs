//! The expression harness ([`run_expression`]): expression -> plan -> verify, simulate, project,
//! check, CSV round trips (see the module doc of the harness).

use super::{project_and_check, recv_policy, MAX_INPUT};
use pipeweave::core_ir::formats::csv::{compute_csv, import_csv, lowered_csv};
use pipeweave::core_ir::{check_programs, ProjectionOptions, RecvPolicy};
use pipeweave::{build_plan, simulate, verify, PipelineConfig, StageCosts};
use pipeweave_core::testing::costs;

/// Cost sets the expression harness picks from: unit, the Zero Bubble paper's 6.2B ratios, a
/// slow W, and zero-cost ops (ties everywhere).
fn cost_set(selector: u8) -> (StageCosts, f64) {
    let share = match selector & 3 {
        0 => costs(1.0, 1.0, 1.0),
        1 => costs(1.0, 0.988, 0.655),
        2 => costs(1.0, 1.2, 2.5),
        _ => costs(0.0, 0.0, 0.0),
    };
    let comm = match (selector >> 2) & 3 {
        0 => 0.0,
        1 => 0.019,
        2 => 0.5,
        _ => 3.0,
    };
    (share, comm)
}

/// Expression -> plan -> verify, simulate, project, check, CSV round trips. See the module doc.
pub fn run_expression(data: &[u8]) {
    if data.len() < 3 || data.len() > MAX_INPUT {
        return;
    }
    let ranks = u32::from(data[0] % 8) + 1;
    let microbatches = u32::from(data[1] % 32) + 1;
    let selector = data[2];
    let expression = String::from_utf8_lossy(&data[3..]);
    let (share, comm) = cost_set(selector);
    let config = PipelineConfig::new(ranks, microbatches)
        .and_then(|c| c.with_costs(share, comm))
        .expect("small sizes and valid costs make a valid config");
    let plan = match build_plan(&expression, &config) {
        Ok(plan) => plan,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let context = format!("`{expression}` P={ranks} M={microbatches} costs={share:?} comm={comm}");
    if let Err(e) = verify(&plan) {
        panic!("{context}: build_plan returned a plan that does not verify: {e}");
    }
    if let Err(e) = simulate(&plan) {
        panic!("{context}: simulating a verified plan failed: {e}");
    }
    let forward_only = selector & 0x10 != 0;
    let mut lowered = None;
    for recv in [RecvPolicy::Early, RecvPolicy::JustInTime] {
        let programs = project_and_check(&plan, ProjectionOptions { recv, forward_only }, &context);
        if !forward_only && recv == recv_policy(selector & 0x20 != 0) {
            lowered = Some(programs);
        }
    }
    // Our own files must read back (CLI.md: `pipeweave check` reads ours).
    let csv = compute_csv(&plan);
    let imported = import_csv(&csv, share, comm)
        .unwrap_or_else(|e| panic!("{context}: our compute CSV does not import: {e}\n{csv}"));
    if let Err(e) = verify(&imported.plan) {
        panic!("{context}: our compute CSV imports to a plan that does not verify: {e}\n{csv}");
    }
    if let Some(programs) = lowered {
        let csv = lowered_csv(&programs);
        let imported = import_csv(&csv, share, comm)
            .unwrap_or_else(|e| panic!("{context}: our lowered CSV does not import: {e}\n{csv}"));
        match imported.programs {
            Some(programs) => {
                if let Err(e) = check_programs(imported.plan.problem(), &programs) {
                    panic!("{context}: the programs of our lowered CSV do not check: {e}\n{csv}");
                }
            }
            // A file without communication actions reads as compute-only: fine when the plan
            // has no cross-rank message (one rank, say).
            None => assert!(
                !csv.contains("SEND") && !csv.contains("RECV"),
                "{context}: our lowered CSV imports without programs\n{csv}"
            ),
        }
    }
}
