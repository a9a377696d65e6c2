//! Fuzz harnesses of `pipeweave`: every call the fuzz targets make into the library lives in this
//! file, so that a moved path is fixed in one place. It builds on stable Rust and knows nothing of
//! libFuzzer: the targets in `fuzz/fuzz_targets/` are one-line wrappers, and the stable test
//! `tests/fuzz_corpus.rs` includes this file with `#[path]` and replays the committed corpus.
//!
//! Every harness takes arbitrary bytes. Returning normally means "no bug"; a panic (a failed
//! assertion included) is a bug in the library. Library errors (`Err`) are expected for bad input
//! and are only formatted (their `Display` must not panic either).
//!
//! # `run_expression`: expression -> plan -> verify / simulate / project / check
//! Input: byte 0 chooses the ranks (1..=8), byte 1 the microbatches (1..=32), byte 2 the cost set,
//! the cross-rank latency and the projection options; the rest is the expression (UTF-8, lossy).
//! Inputs longer than [`MAX_INPUT`] are ignored (as in every harness).
//! Asserts, for every expression that `build_plan` accepts:
//! - `verify(&plan)` is `Ok` and `simulate(&plan)` is `Ok` (`build_plan` promises a verified plan);
//! - `project(&plan, ..)` is `Ok` with both receive policies, and `check_programs` accepts the
//!   programs (with the chosen `forward_only`);
//! - the compute-only CSV of the plan imports back (`import_csv`) into a plan that verifies, and
//!   the lowered CSV of the projected programs imports back into programs the checker accepts
//!   (`pipeweave check` must read our own files, see CLI.md).
//!
//! # `run_csv_import`: CSV -> import -> verify -> project -> check -> simulate
//! Input: the CSV text (UTF-8, lossy). `import_csv` and `verify` may fail. Asserts, for an
//! imported plan that verifies: `simulate` is `Ok`, `project` (early receives) is `Ok` and its
//! programs pass `check_programs`. Programs lowered in the file itself are checked too; they may be
//! rejected (they come from the file), but the checker must not panic.
//!
//! # `run_reference_json`: reference JSON -> plan -> verify -> project -> check -> simulate
//! Input: a reference schedule file (`../shared/reference/README.md`), UTF-8, lossy.
//! `read_reference` and `verify` may fail; for a plan that verifies the same assertions as for
//! CSV import hold.
//!
//! # `run_programs_checker`: the communication checker on mutated programs
//! Input: byte 0 chooses an expression of [`CHECKER_EXPRESSIONS`], byte 1 the ranks (1..=4),
//! byte 2 the microbatches (1..=8), byte 3 the projection options. The valid plan is built and
//! projected (both cached per thread); the checker must accept the unmutated programs. The rest of
//! the input is a list of mutations of the `ProgramSet` (swap, drop or duplicate instructions,
//! change a message's microbatch, stage, direction or peer, turn a send into a receive, move
//! an op between groups, change a compute task, renumber or drop a program, flip `semantics` or
//! `forward_only`). Asserts: `check_programs` returns (`Ok` or `Err`) without panicking. When it
//! accepts a mutated set whose non-communication instructions are those of the original (only
//! sends and receives were rearranged), the set is run on the threaded backend with the scalar
//! affine model: it must finish (no receive may time out) and give the single-device gradients.

use pipeweave::backends::numeric::{total_gradients, AffineModel};
use pipeweave::backends::{run_threads, ThreadOptions};
use pipeweave::core_ir::formats::csv::{compute_csv, import_csv, lowered_csv};
use pipeweave::core_ir::{
    check_programs, project, CheckedPrograms, CommGroup, CommOp, Direction, Instr, Message,
    ProgramSet, ProjectionOptions, RecvPolicy, Semantics, TOLERANCE,
};
use pipeweave::{
    build_plan, simulate, verify, MicrobatchId, PipelineConfig, Plan, RankId, StageCosts, StageId,
    Task,
};
use pipeweave_core::testing::costs;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// Inputs longer than this are ignored by every harness, so that one execution stays fast.
/// libFuzzer's default `-max_len` (4096 for these corpora) is far below it; raise `-max_len` to go
/// after deep nesting in expressions or large files.
pub const MAX_INPUT: usize = 64 * 1024;

/// The expressions the programs-checker harness builds its valid plans from.
pub const CHECKER_EXPRESSIONS: &[&str] = &[
    "gpipe",
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe), policy=h2)",
    "dual(f1b(gpipe))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
];

/// The receive timeout of threaded runs: far above what the few microseconds of an affine run take,
/// so a timeout means the programs are stuck.
const THREAD_TIMEOUT: Duration = Duration::from_secs(5);

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

fn recv_policy(bit: bool) -> RecvPolicy {
    if bit {
        RecvPolicy::JustInTime
    } else {
        RecvPolicy::Early
    }
}

/// `project` then `check_programs`, both of which must succeed for a verified plan.
fn project_and_check(plan: &Plan, options: ProjectionOptions, context: &str) -> ProgramSet {
    let programs = project(plan, options).unwrap_or_else(|e| {
        panic!("{context}: projection of a verified plan failed ({options:?}): {e}")
    });
    if let Err(e) = check_programs(plan.problem(), &programs) {
        panic!(
            "{context}: the checker rejects the projection of a verified plan ({options:?}): {e}"
        );
    }
    programs
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

/// A valid plan and its checked projection, per (expression, ranks, microbatches, options).
type Built = Option<(Plan, ProgramSet)>;

thread_local! {
    static BUILT: RefCell<HashMap<(usize, u32, u32, u8), Built>> = RefCell::new(HashMap::new());
}

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

/// Reads the mutation bytes one at a time; 0 once they run out.
struct Bytes<'a> {
    data: &'a [u8],
}

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }
    fn index(&mut self, len: usize) -> usize {
        let raw = usize::from(self.next()) << 8 | usize::from(self.next());
        if len == 0 {
            0
        } else {
            raw % len
        }
    }
    /// A small id: mostly in range (below `limit`), sometimes just past it, sometimes huge.
    fn id(&mut self, limit: u32) -> u32 {
        let b = self.next();
        match b >> 6 {
            3 if b & 1 == 1 => u32::MAX - u32::from(b & 0x3e),
            3 => limit + u32::from(b & 3),
            _ => u32::from(b) % limit.max(1),
        }
    }
}

/// The positions (rank, instruction, op) of every send and receive.
fn comm_positions(set: &ProgramSet) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for (r, program) in set.programs.iter().enumerate() {
        for (i, instr) in program.instrs.iter().enumerate() {
            if let Instr::Comm(group) = instr {
                out.extend((0..group.ops.len()).map(|k| (r, i, k)));
            }
        }
    }
    out
}

/// A send or receive of `set` that `bytes` picks (none when there is none): its group and its
/// index there.
fn pick_comm<'a>(
    set: &'a mut ProgramSet,
    bytes: &mut Bytes<'_>,
) -> Option<(&'a mut CommGroup, usize)> {
    let positions = comm_positions(set);
    if positions.is_empty() {
        return None;
    }
    let (r, i, k) = positions[bytes.index(positions.len())];
    let Instr::Comm(group) = &mut set.programs[r].instrs[i] else {
        unreachable!("comm_positions lists comm instructions")
    };
    Some((group, k))
}

fn message_mut(op: &mut CommOp) -> &mut Message {
    match op {
        CommOp::Send { message, .. } | CommOp::Recv { message, .. } => message,
    }
}

/// Applies one byte-driven mutation to `set`.
fn mutate(set: &mut ProgramSet, bytes: &mut Bytes<'_>, stages: u32, microbatches: u32) {
    let ranks = set.programs.len() as u32;
    let op = bytes.next() % 16;
    let rank = bytes.index(set.programs.len());
    match op {
        // Swap two instructions of one rank.
        0 => {
            if let Some(p) = set.programs.get_mut(rank) {
                let (i, j) = (bytes.index(p.instrs.len()), bytes.index(p.instrs.len()));
                if !p.instrs.is_empty() {
                    p.instrs.swap(i, j);
                }
            }
        }
        // Drop one.
        1 => {
            if let Some(p) = set.programs.get_mut(rank) {
                if !p.instrs.is_empty() {
                    let i = bytes.index(p.instrs.len());
                    p.instrs.remove(i);
                }
            }
        }
        // Duplicate one at another place.
        2 => {
            if let Some(p) = set.programs.get_mut(rank) {
                if !p.instrs.is_empty() {
                    let i = bytes.index(p.instrs.len());
                    let at = bytes.index(p.instrs.len() + 1);
                    let copy = p.instrs[i].clone();
                    p.instrs.insert(at, copy);
                }
            }
        }
        // Change a message's microbatch, stage, slot or direction, or the peer, or turn a send
        // into a receive (and back).
        3..=8 => {
            let Some((group, k)) = pick_comm(set, bytes) else {
                return;
            };
            let comm = &mut group.ops[k];
            match op {
                3 => message_mut(comm).microbatch = MicrobatchId::new(bytes.id(microbatches)),
                4 => message_mut(comm).from_stage = StageId::new(bytes.id(stages)),
                5 => message_mut(comm).to_stage = StageId::new(bytes.id(stages)),
                6 => {
                    let m = message_mut(comm);
                    *m = match m.direction {
                        Direction::Activation => {
                            Message::gradient(m.from_stage, m.to_stage, m.microbatch)
                        }
                        Direction::Gradient => {
                            Message::activation(m.from_stage, m.to_stage, m.microbatch)
                        }
                    };
                }
                7 => {
                    let peer = RankId::new(bytes.id(ranks));
                    match comm {
                        CommOp::Send { to, .. } => *to = peer,
                        CommOp::Recv { from, .. } => *from = peer,
                    }
                }
                _ => {
                    *comm = match *comm {
                        CommOp::Send { to, message } => CommOp::Recv { from: to, message },
                        CommOp::Recv { from, message } => CommOp::Send { to: from, message },
                    };
                }
            }
        }
        // Move a send or receive to another group (or to a new group at some place).
        9 => {
            let Some((group, k)) = pick_comm(set, bytes) else {
                return;
            };
            let mut ops = group.ops.to_vec();
            let moved = ops.remove(k);
            group.ops = ops.into();
            let target = bytes.index(set.programs.len());
            let program = &mut set.programs[target];
            let at = bytes.index(program.instrs.len() + 1);
            match program.instrs.get_mut(at) {
                Some(Instr::Comm(group)) => {
                    let place = bytes.index(group.ops.len() + 1);
                    let mut ops = group.ops.to_vec();
                    ops.insert(place, moved);
                    group.ops = ops.into();
                }
                _ => program.instrs.insert(
                    at,
                    Instr::Comm(CommGroup {
                        ops: vec![moved].into(),
                    }),
                ),
            }
        }
        // Change a compute task's work, or a marker's.
        10 => {
            if let Some(p) = set.programs.get_mut(rank) {
                if p.instrs.is_empty() {
                    return;
                }
                let i = bytes.index(p.instrs.len());
                let (stage, microbatch) = (bytes.id(stages), bytes.id(microbatches));
                let which = bytes.next();
                match &mut p.instrs[i] {
                    Instr::Compute(task) => {
                        let w = task.work_mut();
                        if which & 1 == 0 {
                            w.stage = StageId::new(stage);
                        } else {
                            w.microbatch = MicrobatchId::new(microbatch);
                        }
                    }
                    Instr::Loss(w)
                    | Instr::FreeOutput(w)
                    | Instr::Drop(w)
                    | Instr::Offload(w)
                    | Instr::Reload(w) => {
                        w.stage = StageId::new(stage);
                        w.microbatch = MicrobatchId::new(microbatch);
                    }
                    Instr::GradSync(s) | Instr::Params { stage: s, .. } => *s = StageId::new(stage),
                    Instr::Comm(_) | Instr::FlushWeightGrads | Instr::WaitSend { .. } => {}
                }
            }
        }
        // Change a compute task's kind.
        11 => {
            if let Some(p) = set.programs.get_mut(rank) {
                if p.instrs.is_empty() {
                    return;
                }
                let i = bytes.index(p.instrs.len());
                let which = bytes.next();
                if let Instr::Compute(task) = &mut p.instrs[i] {
                    let w = task.work();
                    *task = match which % 5 {
                        0 => Task::Forward(w),
                        1 => Task::InputGrad(w),
                        2 => Task::WeightGrad(w),
                        3 => Task::Backward(w),
                        _ => Task::Overlapped {
                            forward: w,
                            backward: w,
                        },
                    };
                }
            }
        }
        // Renumber a program.
        12 => {
            let id = bytes.id(ranks);
            if let Some(p) = set.programs.get_mut(rank) {
                p.rank = RankId::new(id);
            }
        }
        // Drop a program, or swap two.
        13 => {
            if bytes.next() & 1 == 0 {
                if !set.programs.is_empty() {
                    set.programs.remove(rank);
                }
            } else {
                let other = bytes.index(set.programs.len());
                if !set.programs.is_empty() {
                    set.programs.swap(rank, other);
                }
            }
        }
        14 => {
            set.semantics = match set.semantics {
                Semantics::Blocking => Semantics::Batched,
                Semantics::Batched => Semantics::Rendezvous,
                Semantics::Rendezvous => Semantics::Blocking,
            }
        }
        _ => set.forward_only = !set.forward_only,
    }
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
    let mut bytes = Bytes { data: &data[4..] };
    for _ in 0..MAX_MUTATIONS {
        if bytes.data.is_empty() {
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
