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
//! Neither have a mixture of experts' all-to-alls (`IssueAllToAll`, `WaitAllToAll`, which the
//! programs of plans with all-to-all costs hold): PyTorch's schedules run them inside a stage's
//! forward and backward, so a lowered file leaves them out, and a file read back has none.
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
//!
//! The parts: reading cells and rows ([`parse_action`], [`parse_rows`]), importing a file's
//! problem and plan ([`import_csv`]) and, for a lowered file, its programs (`lower.rs`), and
//! writing plans and programs ([`compute_csv`], [`lowered_csv`]; [`pytorch_expressible`]).

mod export;
mod import;
mod lower;
mod parse;

pub use export::{compute_csv, lowered_csv, pytorch_expressible, residency_left_out};
pub use import::{import_csv, Imported};
pub use parse::{parse_action, parse_rows};

use crate::error::CoreError;
use crate::ir::ids::{MicrobatchId, StageId};
use crate::ir::op::Task;
use crate::spmd::program::{Direction, ParamAction};

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
