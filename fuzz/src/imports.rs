//! The file-import harnesses ([`run_csv_import`], [`run_reference_json`]): a file -> plan ->
//! verify -> project -> check -> simulate (see the module doc of the harness).

use super::{project_and_check, MAX_INPUT};
use pipeweave::core_ir::formats::csv::import_csv;
use pipeweave::core_ir::{check_programs, ProgramSet, ProjectionOptions, RecvPolicy};
use pipeweave::{simulate, verify, Plan, StageCosts};

/// The checks shared by the two file importers, on a plan read from a file and the programs the
/// file itself lowered, if any.
fn check_imported(plan: &Plan, programs: Option<&ProgramSet>, context: &str) {
    if let Some(programs) = programs {
        // From the file: may be wrong, must not crash the checker.
        if let Err(e) = check_programs(plan.problem(), programs) {
            let _ = e.to_string();
        }
    }
    if let Err(e) = verify(plan) {
        let _ = e.to_string();
        return;
    }
    if let Err(e) = simulate(plan) {
        panic!("{context}: simulating a verified plan failed: {e}");
    }
    project_and_check(
        plan,
        ProjectionOptions {
            recv: RecvPolicy::Early,
            forward_only: false,
        },
        context,
    );
}

/// CSV -> import -> verify -> project -> check -> simulate. See the module doc.
pub fn run_csv_import(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    match import_csv(&text, StageCosts::default(), 0.0) {
        Ok(imported) => check_imported(&imported.plan, imported.programs.as_ref(), "imported CSV"),
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Reference JSON -> plan -> verify -> project -> check -> simulate. See the module doc.
pub fn run_reference_json(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    match pipeweave::reference::read_reference("fuzz.json", &text, StageCosts::default(), 0.0) {
        Ok(plan) => check_imported(&plan, None, "reference JSON"),
        Err(e) => {
            let _ = e.to_string();
        }
    }
}
