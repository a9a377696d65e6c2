//! The programs of a lowered file's rows: its computes (with the losses), its sends and
//! receives grouped as they stand, and every send waited for where the file waits for it.

use super::{comm_name, csv_error, Action, CommAction};
use crate::error::CoreError;
use crate::ir::ids::{MicrobatchId, RankId, StageId};
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::problem::Problem;
use crate::spmd::program::{
    CommGroup, CommOp, Direction, Instr, Message, ProgramSet, RankProgram, Semantics,
};

/// Builds programs from the rows of a lowered file.
pub(super) fn lower_rows(problem: &Problem, rows: &[Vec<Action>]) -> Result<ProgramSet, CoreError> {
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
