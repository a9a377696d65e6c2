//! Writing schedule files: the compute-only CSV of a plan, the lowered CSV of its programs, and
//! whether PyTorch's format can express a plan at all.

use super::{comm_name, CommAction};
use crate::error::CoreError;
use crate::ir::ids::{push_decimal, MicrobatchId, StageId};
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use crate::spmd::program::{CommOp, Direction, Instr, ProgramSet, Semantics};

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
    if problem.is_seq_split() {
        return refuse(format!(
            "its microbatches are split into {} sequence chunks, and PyTorch's runtime keeps no \
             state between the microbatches of a stage (a chunk's attention needs the keys and \
             values of the chunks before it); --json or --programs write this plan",
            problem.seq_chunks()
        ));
    }
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
            Task::Recompute(_) | Task::RecomputeWeightGrad(_) => recomputes += 1,
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
/// semantics, at the end of the rank's row otherwise. Markers and all-to-alls have no action in
/// the format and are left out (see the module doc of [`super`]).
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
