//! The byte-driven mutations of a `ProgramSet` the programs-checker harness applies: [`Bytes`]
//! reads the input, [`mutate`] applies one mutation (swap, drop or duplicate instructions, change
//! a message or a peer, move an op between groups, change a compute task, renumber or drop a
//! program, flip `semantics` or `forward_only`).

use pipeweave::core_ir::{
    AllToAll, CommGroup, CommOp, Direction, Instr, Message, ProgramSet, Semantics,
};
use pipeweave::{MicrobatchId, RankId, StageId, Task};

/// Reads the mutation bytes one at a time; 0 once they run out.
pub(super) struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    /// Reads `data`.
    pub(super) fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    /// Whether every byte has been read.
    pub(super) fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

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
pub(super) fn mutate(set: &mut ProgramSet, bytes: &mut Bytes<'_>, stages: u32, microbatches: u32) {
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
                    | Instr::Reload(w)
                    | Instr::IssueAllToAll(AllToAll { work: w, .. })
                    | Instr::WaitAllToAll(AllToAll { work: w, .. }) => {
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
