//! PyTorch pipelining's schedule CSV (`torch.distributed.pipelining`), both directions.
//!
//! Dialect: no header; exactly one row per rank, in rank order; comma-separated cells, one action
//! each, in execution order. Compute files may hold empty cells (bubbles). Lowered files hold the
//! communication too: `<s>SEND_F<m>` (stage `s` sends microbatch `m`'s activation to the next
//! stage), `<s>RECV_F<m>` (stage `s` receives it), `<s>SEND_B<m>` / `<s>RECV_B<m>` (gradients to
//! the previous stage), and `<s>WAIT_SEND_F<m>` / `<s>WAIT_SEND_B<m>`: every send needs a later
//! wait on the same rank; and PyTorch's parameter actions `<s>UNSHARD`, `<s>RESHARD`,
//! `<s>REDUCE_GRAD`, `<s>WAIT_REDUCE_GRAD` ([`ParamAction`], placed by PyTorch's own rules by the
//! projection): a lowered file is the whole program PyTorch's runtime runs, the scaling of the
//! gradients by 1/M (at `REDUCE_GRAD`) included. Our markers (loss, free, gradient sync) have no
//! PyTorch action and are not written; the importer adds the loss and the final flush back.
//!
//! PyTorch's format has one route, through stages 0, 1, 2, ... in order, and no weights shared
//! between stages: [`pytorch_expressible`] says whether a plan fits it. The writers write any
//! plan (pipeweave's `check` reads several routes back); PyTorch loads what they write for plans
//! it accepts.
//!
//! Every action PyTorch 2.15 writes is read: `<stage><NAME>[<microbatch>]` with the names of its
//! `_ComputationType` (compute `F`, `I`, `W`, `B`, `(<F>;<B>)OVERLAP_F_B`; communication; the
//! parameter actions, whose microbatch is optional). A file is lowered when it holds a send, a
//! receive or a wait on a send; then its parameter actions become instructions, whose order the
//! checker holds to PyTorch's runtime's rules. In a compute-only file they are read and left out
//! (PyTorch's lowering adds its own).
//!
//! Import takes the stage placement from the row a stage's actions appear in, the microbatch count
//! from the largest microbatch, and each microbatch's route from the stages its actions touch (in
//! stage order; a microbatch whose stages are a strict subset of another's takes the larger set,
//! so a missing op is reported as missing). Every error names the line and column.

use crate::error::CoreError;
use crate::ir::cost::StageCosts;
use crate::ir::ids::{push_decimal, MicrobatchId, RankId, StageId};
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::plan::Plan;
use crate::ir::problem::{Problem, ProblemSpec, RouteSpec};
use crate::spmd::program::Semantics;
use crate::spmd::program::{
    CommGroup, CommOp, Direction, Instr, Message, ParamAction, ProgramSet, RankProgram,
};
use std::collections::BTreeMap;

/// A communication action of a lowered file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommAction {
    /// `SEND_F` / `SEND_B`.
    Send(Direction),
    /// `RECV_F` / `RECV_B`.
    Recv(Direction),
    /// `WAIT_SEND_F` / `WAIT_SEND_B`.
    WaitSend(Direction),
}

/// One cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A compute action.
    Compute(Task),
    /// A parameter action (`UNSHARD`, `RESHARD`, `REDUCE_GRAD`, `WAIT_REDUCE_GRAD`) on a stage.
    Param {
        /// What.
        action: ParamAction,
        /// The stage named in the action.
        stage: StageId,
    },
    /// A communication action on `stage` for `microbatch`.
    Comm {
        /// What.
        action: CommAction,
        /// The stage named in the action.
        stage: StageId,
        /// The microbatch.
        microbatch: MicrobatchId,
    },
}

const COMM_NAMES: [(&str, CommAction); 6] = [
    ("WAIT_SEND_F", CommAction::WaitSend(Direction::Activation)),
    ("WAIT_SEND_B", CommAction::WaitSend(Direction::Gradient)),
    ("SEND_F", CommAction::Send(Direction::Activation)),
    ("SEND_B", CommAction::Send(Direction::Gradient)),
    ("RECV_F", CommAction::Recv(Direction::Activation)),
    ("RECV_B", CommAction::Recv(Direction::Gradient)),
];

fn comm_name(action: CommAction) -> &'static str {
    COMM_NAMES
        .iter()
        .find(|(_, a)| *a == action)
        .map(|(n, _)| *n)
        .expect("every communication action has a name")
}

fn csv_error(line: usize, column: usize, reason: impl Into<String>) -> CoreError {
    CoreError::Csv {
        line,
        column,
        reason: reason.into(),
    }
}

fn parse_number(text: &str, what: &str, line: usize, column: usize) -> Result<u32, CoreError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(csv_error(
            line,
            column,
            format!("the {what} must be a decimal number"),
        ));
    }
    text.parse()
        .map_err(|_| csv_error(line, column, format!("the {what} {text} is too large")))
}

/// PyTorch's compute names that follow a stage number (`OVERLAP_F_B` wraps its sub-actions).
const COMPUTE_NAMES: [&str; 4] = ["F", "I", "W", "B"];

/// What a name after the stage number stands for.
#[derive(Clone, Copy)]
enum Named {
    Compute,
    Comm(CommAction),
    Param(ParamAction),
}

/// The action a name of PyTorch's `_ComputationType` stands for.
fn named(name: &str) -> Option<Named> {
    if COMPUTE_NAMES.contains(&name) {
        return Some(Named::Compute);
    }
    COMM_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, a)| Named::Comm(a))
        .or_else(|| {
            ParamAction::ALL
                .into_iter()
                .find(|a| a.pytorch_name() == name)
                .map(Named::Param)
        })
}

/// The names PyTorch's cells may hold, for the error on one that is none of them.
fn known_names() -> String {
    let mut names: Vec<&str> = COMPUTE_NAMES.to_vec();
    names.push("OVERLAP_F_B");
    names.extend(COMM_NAMES.iter().map(|(n, _)| *n));
    names.extend(ParamAction::ALL.iter().map(|a| a.pytorch_name()));
    names.join(", ")
}

/// Parses one cell.
pub fn parse_action(cell: &str, line: usize, column: usize) -> Result<Action, CoreError> {
    let compute = |text: &str| {
        text.parse::<Task>()
            .map(Action::Compute)
            .map_err(|e| match e {
                CoreError::Notation { reason, .. } => {
                    csv_error(line, column, format!("`{cell}`: {reason}"))
                }
                other => other,
            })
    };
    if cell.starts_with('(') {
        return compute(cell);
    }
    let digits = cell.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(csv_error(
            line,
            column,
            format!("`{cell}`: an action starts with its stage number, e.g. 2F0 or 1UNSHARD"),
        ));
    }
    let rest = &cell[digits..];
    let length = rest
        .bytes()
        .take_while(|b| b.is_ascii_uppercase() || *b == b'_')
        .count();
    let name = &rest[..length];
    let Some(what) = named(name) else {
        if name.is_empty() {
            return Err(csv_error(
                line,
                column,
                format!(
                    "`{cell}`: no action name after the stage number; PyTorch's actions are {}",
                    known_names()
                ),
            ));
        }
        return Err(csv_error(
            line,
            column,
            format!(
                "`{cell}`: unknown action `{name}`; PyTorch's actions are {}",
                known_names()
            ),
        ));
    };
    let stage = parse_number(&cell[..digits], "stage", line, column)?;
    let microbatch = &rest[length..];
    match what {
        Named::Compute => compute(cell),
        Named::Param(action) => {
            // PyTorch writes none; it reads and ignores one.
            if !microbatch.is_empty() {
                parse_number(microbatch, "microbatch", line, column)?;
            }
            Ok(Action::Param {
                action,
                stage: StageId::new(stage),
            })
        }
        Named::Comm(action) => {
            let microbatch = parse_number(microbatch, "microbatch", line, column)?;
            Ok(Action::Comm {
                action,
                stage: StageId::new(stage),
                microbatch: MicrobatchId::new(microbatch),
            })
        }
    }
}

/// Parses a whole file into one row of actions per rank (empty cells dropped).
pub fn parse_rows(text: &str) -> Result<Vec<Vec<Action>>, CoreError> {
    // A UTF-8 byte-order mark, which PyTorch's reader (and spreadsheet tools) accept.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let raw = raw.trim_end_matches('\r');
        if raw.trim().is_empty() {
            if text.lines().skip(i).all(|l| l.trim().is_empty()) {
                break;
            }
            return Err(csv_error(
                line,
                1,
                "empty line: every rank needs one row, in rank order",
            ));
        }
        let mut row = Vec::new();
        for (c, cell) in raw.split(',').enumerate() {
            let cell = unquoted(cell.trim());
            if cell.is_empty() {
                continue;
            }
            row.push(parse_action(cell, line, c + 1)?);
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(csv_error(1, 1, "the file has no rows"));
    }
    Ok(rows)
}

/// A cell without the double quotes a CSV writer may put around it.
fn unquoted(cell: &str) -> &str {
    cell.strip_prefix('"')
        .and_then(|c| c.strip_suffix('"'))
        .map_or(cell, str::trim)
}

/// What an import produced.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The compute plan (not yet verified).
    pub plan: Plan,
    /// The programs, when the file was lowered.
    pub programs: Option<ProgramSet>,
}

/// Builds the problem of an imported schedule (see the module doc).
fn infer_problem(rows: &[Vec<Action>]) -> Result<Problem, CoreError> {
    let mut owner: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    let mut touched: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (rank, row) in rows.iter().enumerate() {
        for (position, action) in row.iter().enumerate() {
            let Action::Compute(task) = action else {
                continue;
            };
            for op in task.ops() {
                let entry = owner.entry(op.stage.get()).or_insert((rank, position));
                if entry.0 != rank {
                    return Err(CoreError::Import(format!(
                        "stage {} appears on rank {} (line {}) and on rank {rank} (line {})",
                        op.stage,
                        entry.0,
                        entry.0 + 1,
                        rank + 1
                    )));
                }
                touched
                    .entry(op.microbatch.get())
                    .or_default()
                    .push(op.stage.get());
            }
        }
    }
    let Some((&last_stage, _)) = owner.last_key_value() else {
        return Err(CoreError::Import(
            "the file holds no compute action".to_string(),
        ));
    };
    let stages = u64::from(last_stage) + 1;
    if stages > u64::from(crate::ir::problem::MAX_STAGES) {
        return Err(CoreError::SizeOutOfRange {
            what: "stages",
            value: stages,
            constraint: format!("must be at most {}", crate::ir::problem::MAX_STAGES),
        });
    }
    if let Some(missing) = (0..=last_stage).find(|s| !owner.contains_key(s)) {
        return Err(CoreError::Import(format!(
            "stage {missing} appears in no row (stages 0..={last_stage} are used)"
        )));
    }
    let microbatches = touched
        .last_key_value()
        .map_or(0, |(&m, _)| u64::from(m) + 1);
    if microbatches > u64::from(crate::ir::problem::MAX_MICROBATCHES) {
        return Err(CoreError::SizeOutOfRange {
            what: "microbatches",
            value: microbatches,
            constraint: format!("must be at most {}", crate::ir::problem::MAX_MICROBATCHES),
        });
    }
    if let Some(missing) = (0..microbatches as u32).find(|m| !touched.contains_key(m)) {
        return Err(CoreError::Import(format!(
            "microbatch {missing} appears in no action (microbatches 0..{microbatches} are used)"
        )));
    }
    let sets: Vec<Vec<u32>> = (0..microbatches as u32)
        .map(|m| {
            let mut set = touched.remove(&m).unwrap_or_default();
            set.sort_unstable();
            set.dedup();
            set
        })
        .collect();
    // A strict subset of another microbatch's stages is an incomplete microbatch, not a route.
    let mut distinct: Vec<&Vec<u32>> = sets.iter().collect();
    distinct.sort();
    distinct.dedup();
    let widen = |set: &Vec<u32>| -> Vec<u32> {
        distinct
            .iter()
            .filter(|other| {
                other.len() > set.len() && set.iter().all(|s| other.binary_search(s).is_ok())
            })
            .max_by_key(|other| other.len())
            .map_or_else(|| set.clone(), |o| (*o).clone())
    };
    let mut routes: Vec<RouteSpec> = Vec::new();
    for (m, set) in sets.iter().enumerate() {
        let stages = widen(set);
        match routes.last_mut() {
            Some(route) if route.stages == stages => route.end = m as u32 + 1,
            _ => routes.push(RouteSpec {
                first: m as u32,
                end: m as u32 + 1,
                stages,
            }),
        }
    }
    let placement: Vec<u32> = owner.values().map(|&(rank, _)| rank as u32).collect();
    let ranks = rows.len() as u32;
    ProblemSpec::builder()
        .ranks(ranks)
        .microbatches(microbatches as u32)
        .stage_to_rank(placement)
        .routes(routes)
        .build()
        .validate()
}

/// Imports a schedule CSV. `share_costs` are the costs of a rank's whole share (divided among the
/// stages a rank holds), `comm` the cross-rank latency.
pub fn import_csv(text: &str, share_costs: StageCosts, comm: f64) -> Result<Imported, CoreError> {
    let rows = parse_rows(text)?;
    let problem = infer_problem(&rows)?;
    let orders: Vec<Vec<Task>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .filter_map(|a| match a {
                    Action::Compute(t) => Some(*t),
                    Action::Comm { .. } | Action::Param { .. } => None,
                })
                .collect()
        })
        .collect();
    let lowered = rows
        .iter()
        .flatten()
        .any(|a| matches!(a, Action::Comm { .. }));
    let programs = if lowered {
        Some(lower_rows(&problem, &rows)?)
    } else {
        None
    };
    let plan = Plan::from_rank_shares(problem, share_costs, comm, orders)?;
    Ok(Imported { plan, programs })
}

/// Builds programs from the rows of a lowered file.
fn lower_rows(problem: &Problem, rows: &[Vec<Action>]) -> Result<ProgramSet, CoreError> {
    let programs = rows
        .iter()
        .enumerate()
        .map(|(r, row)| lower_row(problem, RankId::new(r as u32), row))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ProgramSet {
        programs,
        forward_only: false,
        // The file's WAIT_SENDs can block: check it as PyTorch runs it.
        semantics: Semantics::Rendezvous,
    })
}

/// A send not yet waited for: (direction, stage, microbatch, column of the send, the send).
type Unwaited = (Direction, StageId, MicrobatchId, usize, CommOp);

/// The operations gathered so far, as one communication group (`ops` left empty).
fn comm_group(ops: &mut Vec<CommOp>) -> Instr {
    Instr::Comm(CommGroup {
        ops: std::mem::take(ops).into(),
    })
}

/// The program of one rank's row: computes (with the loss after a last stage's forward),
/// consecutive sends and receives as one group, and every send waited for later on the row.
fn lower_row(problem: &Problem, rank: RankId, row: &[Action]) -> Result<RankProgram, CoreError> {
    let line = rank.index() + 1;
    let mut instrs = Vec::new();
    let mut group: Vec<CommOp> = Vec::new();
    let mut unwaited: Vec<Unwaited> = Vec::new();
    for (c, action) in row.iter().enumerate() {
        let column = c + 1;
        match *action {
            Action::Param { action, stage } => {
                if !group.is_empty() {
                    instrs.push(comm_group(&mut group));
                }
                instrs.push(Instr::Params { action, stage });
            }
            Action::Compute(task) => {
                if !group.is_empty() {
                    instrs.push(comm_group(&mut group));
                }
                push_compute(problem, task, &mut instrs);
            }
            Action::Comm {
                action: CommAction::WaitSend(direction),
                stage,
                microbatch,
            } => {
                let waited = unwaited
                    .iter()
                    .position(|&(d, s, m, _, _)| d == direction && s == stage && m == microbatch);
                match waited {
                    Some(i) => {
                        let (.., send) = unwaited.remove(i);
                        if let CommOp::Send { to, message } = send {
                            if !group.is_empty() {
                                instrs.push(comm_group(&mut group));
                            }
                            instrs.push(Instr::WaitSend { to, message });
                        }
                    }
                    None => {
                        return Err(csv_error(
                            line,
                            column,
                            format!(
                            "{stage}{}{microbatch} waits for a send that did not happen before it",
                            comm_name(CommAction::WaitSend(direction))
                        ),
                        ))
                    }
                }
            }
            Action::Comm {
                action,
                stage,
                microbatch,
            } => {
                let op = comm_op(problem, rank, action, stage, microbatch, (line, column))?;
                if let CommOp::Send { message, .. } = op {
                    unwaited.push((message.direction, stage, microbatch, column, op));
                }
                group.push(op);
            }
        }
    }
    if let Some(&(d, s, m, column, _)) = unwaited.first() {
        let name = comm_name(CommAction::Send(d));
        return Err(csv_error(
            line,
            column,
            format!("{s}{name}{m} has no later WAIT_SEND on its rank"),
        ));
    }
    if !group.is_empty() {
        instrs.push(comm_group(&mut group));
    }
    instrs.push(Instr::FlushWeightGrads);
    Ok(RankProgram { rank, instrs })
}

/// A compute, followed by the loss of every forward on the last stage of its route.
fn push_compute(problem: &Problem, task: Task, instrs: &mut Vec<Instr>) {
    instrs.push(Instr::Compute(task));
    for op in task.ops() {
        let last = problem
            .route_of(op.microbatch)
            .is_some_and(|route| route.next(op.stage).is_none());
        if op.kind == OpKind::Forward && last {
            instrs.push(Instr::Loss(Work {
                stage: op.stage,
                microbatch: op.microbatch,
            }));
        }
    }
}

/// The send or receive a `SEND_*` / `RECV_*` cell of rank `rank` stands for, its peer taken
/// from the route.
fn comm_op(
    problem: &Problem,
    rank: RankId,
    action: CommAction,
    stage: StageId,
    microbatch: MicrobatchId,
    (line, column): (usize, usize),
) -> Result<CommOp, CoreError> {
    let route = problem.route_of(microbatch).ok_or_else(|| {
        csv_error(
            line,
            column,
            format!("microbatch {microbatch} is out of range"),
        )
    })?;
    if !route.contains(stage) {
        return Err(csv_error(
            line,
            column,
            format!("stage {stage} is not on the route of microbatch {microbatch}"),
        ));
    }
    let (direction, send) = match action {
        CommAction::Send(d) => (d, true),
        CommAction::Recv(d) => (d, false),
        CommAction::WaitSend(_) => {
            return Err(csv_error(line, column, "a wait is not a send or a receive"))
        }
    };
    // The stage on the other side of the boundary.
    let other = match (direction, send) {
        (Direction::Activation, true) | (Direction::Gradient, false) => route.next(stage),
        (Direction::Activation, false) | (Direction::Gradient, true) => route.prev(stage),
    }
    .ok_or_else(|| {
        csv_error(
            line,
            column,
            format!("stage {stage} has no neighbour on microbatch {microbatch}'s route in that direction"),
        )
    })?;
    let message = match (direction, send) {
        (Direction::Activation, true) => Message::activation(stage, other, microbatch),
        (Direction::Activation, false) => Message::activation(other, stage, microbatch),
        (Direction::Gradient, true) => Message::gradient(stage, other, microbatch),
        (Direction::Gradient, false) => Message::gradient(other, stage, microbatch),
    };
    let peer = problem.rank_of(other).expect("route stages are in range");
    if problem.rank_of(stage) != Some(rank) {
        return Err(csv_error(
            line,
            column,
            format!(
                "stage {stage} runs on rank {}, not on rank {rank}",
                problem.rank_of(stage).map_or(0, |r| r.get())
            ),
        ));
    }
    Ok(if send {
        CommOp::Send { to: peer, message }
    } else {
        CommOp::Recv {
            from: peer,
            message,
        }
    })
}

/// Whether PyTorch's schedule format can express `problem`'s plans: one route, through stages
/// 0, 1, 2, ... in order, and no weights tied between stages. Else the reason, naming what to
/// use instead.
pub fn pytorch_expressible(problem: &Problem) -> Result<(), CoreError> {
    let refuse = |reason: String| {
        Err(CoreError::NotExpressible {
            format: "PyTorch's schedule CSV",
            reason,
        })
    };
    let routes = problem.routes();
    if routes.len() > 1 {
        return refuse(format!(
            "the plan has {} routes (DualPipe's two directions) and PyTorch's format has one, \
             through stages 0, 1, 2, ... in order; dual(vpp(f1b(gpipe), chunks=2)) (DualPipeV) \
             expresses the same idea on one route, and --json or --programs write this plan",
            routes.len()
        ));
    }
    let in_order = routes
        .iter()
        .all(|r| r.stages().iter().enumerate().all(|(i, s)| s.index() == i));
    if !in_order
        || routes.iter().map(|r| r.stages().len()).sum::<usize>() != problem.stages() as usize
    {
        return refuse(
            "its route does not pass through stages 0, 1, 2, ... in order, which PyTorch's \
             runtime assumes (stage s feeds stage s + 1)"
                .to_string(),
        );
    }
    if let Some(tied) = problem.tied_stages().first() {
        let tied: Vec<String> = tied.iter().map(StageId::to_string).collect();
        return refuse(format!(
            "stages {} share their weights, which PyTorch's runtime cannot express",
            tied.join(" and ")
        ));
    }
    Ok(())
}

/// The compute-only CSV of a plan. PyTorch's format has no recompute or transfer actions: the
/// file keeps the model's computes in the plan's order and leaves the residency tasks out
/// ([`residency_left_out`] says what), so PyTorch runs the same compute order with every
/// activation kept on the device.
pub fn compute_csv(plan: &Plan) -> String {
    let mut text = CsvText::with_capacity(plan.task_count() * 8 + plan.orders().len());
    for order in plan.orders() {
        for task in order.iter().filter(|t| !t.is_residency()) {
            task.push_notation(text.cell());
        }
        text.end_row();
    }
    text.finish()
}

/// What a schedule file of `plan` leaves out, in a sentence (None when nothing): the recomputes
/// and transfers PyTorch's format cannot express.
pub fn residency_left_out(plan: &Plan) -> Option<String> {
    let (mut recomputes, mut transfers) = (0usize, 0usize);
    for task in plan.orders().iter().flatten() {
        match task {
            Task::Recompute(_) => recomputes += 1,
            Task::Offload(_) | Task::Reload(_) => transfers += 1,
            _ => {}
        }
    }
    if recomputes + transfers == 0 {
        return None;
    }
    Some(format!(
        "the CSV leaves out {recomputes} recompute(s) and {transfers} offload/reload transfer(s): \
         PyTorch's schedule format has no such actions, so PyTorch runs the same compute order \
         with every activation kept on the device (more memory than the plan's peak)"
    ))
}

/// CSV text being written, as bytes: cells separated by commas, rows ended by newlines.
struct CsvText {
    bytes: Vec<u8>,
    row_empty: bool,
}

impl CsvText {
    fn with_capacity(capacity: usize) -> CsvText {
        CsvText {
            bytes: Vec::with_capacity(capacity),
            row_empty: true,
        }
    }

    /// The bytes to append the next cell of the row to (after its separator).
    fn cell(&mut self) -> &mut Vec<u8> {
        if !self.row_empty {
            self.bytes.push(b',');
        }
        self.row_empty = false;
        &mut self.bytes
    }

    fn end_row(&mut self) {
        self.bytes.push(b'\n');
        self.row_empty = true;
    }

    fn finish(self) -> String {
        String::from_utf8(self.bytes).expect("the CSV writers write ASCII")
    }
}

/// A communication cell of a lowered file: `<stage><action><microbatch>`.
#[derive(Clone, Copy)]
struct CommCell {
    action: CommAction,
    stage: StageId,
    microbatch: MicrobatchId,
}

impl CommCell {
    fn new(action: CommAction, stage: StageId, microbatch: MicrobatchId) -> CommCell {
        CommCell {
            action,
            stage,
            microbatch,
        }
    }

    fn push(self, text: &mut CsvText) {
        let out = text.cell();
        push_decimal(out, self.stage.get());
        // The names of [`COMM_NAMES`], as fixed-size appends.
        let name: &[u8] = match self.action {
            CommAction::Send(Direction::Activation) => b"SEND_F",
            CommAction::Send(Direction::Gradient) => b"SEND_B",
            CommAction::Recv(Direction::Activation) => b"RECV_F",
            CommAction::Recv(Direction::Gradient) => b"RECV_B",
            CommAction::WaitSend(Direction::Activation) => b"WAIT_SEND_F",
            CommAction::WaitSend(Direction::Gradient) => b"WAIT_SEND_B",
        };
        debug_assert_eq!(name, comm_name(self.action).as_bytes());
        out.extend_from_slice(name);
        push_decimal(out, self.microbatch.get());
    }
}

/// The cell of a send or receive, and for a send the cell of the wait on it.
fn comm_cells(op: &CommOp) -> (CommCell, Option<CommCell>) {
    let m = op.message();
    let (action, stage) = match op {
        CommOp::Send { .. } => (CommAction::Send(m.direction), m.from_stage),
        CommOp::Recv { .. } => (CommAction::Recv(m.direction), m.to_stage),
    };
    let wait = matches!(op, CommOp::Send { .. })
        .then(|| CommCell::new(CommAction::WaitSend(m.direction), stage, m.microbatch));
    (CommCell::new(action, stage, m.microbatch), wait)
}

/// The lowered CSV of projected programs: compute and communication actions in execution order.
/// Sends are waited for right after their group when the programs are projected for blocking
/// semantics, at the end of the rank's row otherwise.
pub fn lowered_csv(set: &ProgramSet) -> String {
    let instrs: usize = set.programs.iter().map(|p| p.instrs.len()).sum();
    let mut text = CsvText::with_capacity(instrs * 16);
    let mut waits: Vec<CommCell> = Vec::new();
    let mut deferred: Vec<CommCell> = Vec::new();
    for program in &set.programs {
        deferred.clear();
        for instr in &program.instrs {
            match instr {
                Instr::Compute(t) if !t.is_residency() => t.push_notation(text.cell()),
                Instr::Comm(group) => {
                    waits.clear();
                    for op in &group.ops {
                        let (cell, wait) = comm_cells(op);
                        cell.push(&mut text);
                        waits.extend(wait);
                    }
                    match set.semantics {
                        Semantics::Blocking => waits.iter().for_each(|w| w.push(&mut text)),
                        Semantics::Batched => deferred.append(&mut waits),
                        // Imported files carry their waits as instructions.
                        Semantics::Rendezvous => {}
                    }
                }
                Instr::WaitSend { message, .. } => CommCell::new(
                    CommAction::WaitSend(message.direction),
                    message.from_stage,
                    message.microbatch,
                )
                .push(&mut text),
                Instr::Params { action, stage } => {
                    let out = text.cell();
                    push_decimal(out, stage.get());
                    out.extend_from_slice(action.pytorch_name().as_bytes());
                }
                _ => {}
            }
        }
        deferred.iter().for_each(|w| w.push(&mut text));
        text.end_row();
    }
    text.finish()
}
