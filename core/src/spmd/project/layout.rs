//! Instructions from a rank's events in program order: neighbouring sends and receives become one
//! [`CommGroup`], frees follow the group that sent their output.

use super::events::Event;
use crate::ir::op::{Task, Work};
use crate::spmd::program::{CommGroup, CommOp, Instr};

/// Instructions from events in program order: consecutive sends and receives form one group;
/// frees follow the group that sent the output.
pub(super) struct Layout {
    instrs: Vec<Instr>,
    /// The open group's sends and receives (copied out at its exact size when it closes).
    group: Vec<CommOp>,
    frees: Vec<Work>,
}

impl Layout {
    /// An empty layout with room for `capacity` instructions.
    pub(super) fn with_capacity(capacity: usize) -> Layout {
        Layout {
            instrs: Vec::with_capacity(capacity),
            group: Vec::new(),
            frees: Vec::new(),
        }
    }

    /// Lays out `event` after everything so far.
    pub(super) fn push(&mut self, event: Event) {
        let instr = match event {
            Event::Comm(op) => return self.group.push(op),
            Event::FreeOutput(w) => return self.frees.push(w),
            Event::Compute(t) => Instr::Compute(t),
            Event::Loss(w) => Instr::Loss(w),
            Event::GradSync(s) => Instr::GradSync(s),
            Event::Params(action, stage) => Instr::Params { action, stage },
            Event::Drop(w) => Instr::Drop(w),
            Event::Transfer(Task::Offload(w)) => Instr::Offload(w),
            Event::Transfer(t) => Instr::Reload(t.work()),
            Event::Issue(a) => Instr::IssueAllToAll(a),
            Event::Wait(a) => Instr::WaitAllToAll(a),
        };
        self.flush();
        self.instrs.push(instr);
    }

    /// Closes the open group, then its frees.
    fn flush(&mut self) {
        if !self.group.is_empty() {
            let ops = Box::from(self.group.as_slice());
            self.group.clear();
            self.instrs.push(Instr::Comm(CommGroup { ops }));
        }
        self.instrs
            .extend(self.frees.drain(..).map(Instr::FreeOutput));
    }

    /// The instructions, the open group closed; `FlushWeightGrads` at the end unless the program
    /// runs forwards only.
    pub(super) fn finish(mut self, forward_only: bool) -> Vec<Instr> {
        self.flush();
        if !forward_only {
            self.instrs.push(Instr::FlushWeightGrads);
        }
        self.instrs
    }
}
