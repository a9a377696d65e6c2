//! The programs-checker harness ([`run_programs_checker`]): the communication checker on
//! byte-mutated projected programs, and the threaded run of a mutated set it accepts (see the
//! module doc of the harness).

use super::mutation::{mutate, Bytes};
use super::{project_and_check, recv_policy, CHECKER_EXPRESSIONS};
use pipeweave::backends::numeric::{total_gradients, AffineModel};
use pipeweave::backends::{run_threads, ThreadOptions};
use pipeweave::core_ir::{
    check_programs, CheckedPrograms, Instr, ProgramSet, ProjectionOptions, TOLERANCE,
};
use pipeweave::{build_plan, PipelineConfig, Plan, RankId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// The receive timeout of threaded runs: far above what the few microseconds of an affine run take,
/// so a timeout means the programs are stuck.
const THREAD_TIMEOUT: Duration = Duration::from_secs(5);

/// A valid plan and its checked projection, per (expression, ranks, microbatches, options).
type Built = Option<(Plan, ProgramSet)>;

thread_local! {
    static BUILT: RefCell<HashMap<(usize, u32, u32, u8), Built>> = RefCell::new(HashMap::new());
}

/// The valid plan of `CHECKER_EXPRESSIONS[expression]` at these sizes and its checked projection
/// under `options` (bit 0: just-in-time receives, bit 1: forward only), built once per thread;
/// None when the expression needs more ranks or microbatches.
fn built(expression: usize, ranks: u32, microbatches: u32, options: u8) -> Built {
    let key = (expression, ranks, microbatches, options);
    if let Some(hit) = BUILT.with(|b| b.borrow().get(&key).cloned()) {
        return hit;
    }
    let text = CHECKER_EXPRESSIONS[expression];
    let config = PipelineConfig::new(ranks, microbatches).expect("small sizes are valid");
    // Some expressions need more ranks or microbatches than the sizes give: no plan then.
    let value = build_plan(text, &config).ok().map(|plan| {
        let options = ProjectionOptions {
            recv: recv_policy(options & 1 != 0),
            forward_only: options & 2 != 0,
        };
        let context = format!("`{text}` P={ranks} M={microbatches}");
        let programs = project_and_check(&plan, options, &context);
        (plan, programs)
    });
    BUILT.with(|b| b.borrow_mut().insert(key, value.clone()));
    value
}

/// The instructions of a program other than sends and receives.
fn non_comm(set: &ProgramSet) -> Vec<(RankId, Vec<&Instr>)> {
    set.programs
        .iter()
        .map(|p| {
            (
                p.rank,
                p.instrs
                    .iter()
                    .filter(|i| !matches!(i, Instr::Comm(_)))
                    .collect(),
            )
        })
        .collect()
}

/// The programs, one line per rank, for failure messages.
fn render(set: &ProgramSet) -> String {
    let mut out = format!(
        "forward_only: {}, semantics: {:?}\n",
        set.forward_only, set.semantics
    );
    for program in &set.programs {
        let instrs: Vec<String> = program.instrs.iter().map(|i| i.to_string()).collect();
        out.push_str(&format!("rank {}: {}\n", program.rank, instrs.join(" | ")));
    }
    out
}

/// Most mutations one input applies.
const MAX_MUTATIONS: usize = 32;

/// The checker on byte-mutated projected programs. See the module doc.
pub fn run_programs_checker(data: &[u8]) {
    if data.len() < 4 {
        return;
    }
    let expression = usize::from(data[0]) % CHECKER_EXPRESSIONS.len();
    let ranks = u32::from(data[1] % 4) + 1;
    let microbatches = u32::from(data[2] % 8) + 1;
    let options = data[3] & 3;
    let Some((plan, original)) = built(expression, ranks, microbatches, options) else {
        return;
    };
    let problem = plan.problem();
    let mut set = original.clone();
    let mut bytes = Bytes::new(&data[4..]);
    for _ in 0..MAX_MUTATIONS {
        if bytes.is_empty() {
            break;
        }
        mutate(
            &mut set,
            &mut bytes,
            problem.stages(),
            problem.microbatches(),
        );
    }
    let report = check_programs(problem, &set);
    let Ok(_) = report else {
        let _ = report.map_err(|e| e.to_string());
        return;
    };
    // Accepted. If only communication moved, the programs still compute the plan's step: they
    // must run to the end on the threaded backend and give the single-device gradients.
    if set == original || non_comm(&set) != non_comm(&original) {
        return;
    }
    let context = format!(
        "`{}` P={ranks} M={microbatches} options={options}",
        CHECKER_EXPRESSIONS[expression]
    );
    let model = AffineModel::new(problem);
    let stages = run_threads(
        &CheckedPrograms::check(problem, set.clone()).unwrap(),
        |_| model.stage(|_| Duration::ZERO),
        ThreadOptions {
            receive_timeout: THREAD_TIMEOUT,
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{context}: programs the checker accepts fail on the threaded backend: {e}\n{}",
            render(&set)
        )
    });
    if !original.forward_only {
        let reference = model.sequential_gradients(problem);
        let error = AffineModel::max_relative_error(&total_gradients(&stages), &reference);
        assert!(
            error <= TOLERANCE,
            "{context}: programs the checker accepts give wrong gradients (relative error {error})"
        );
    }
}
