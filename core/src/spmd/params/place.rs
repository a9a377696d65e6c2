//! Placement of PyTorch's parameter actions on one rank's compute order, by its own lowering
//! rules (the placement rules of [`crate::spmd::params`]).

use crate::ir::ids::StageId;
use crate::ir::op::{OpKind, Task};
use crate::spmd::program::ParamAction;
use smallvec::SmallVec;

/// PyTorch's default `max_active_stages`: how many stages' parameters may be unsharded at once.
pub const MAX_ACTIVE_STAGES: usize = 3;

/// Where a placed action goes relative to its compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slot {
    /// Right before the compute (unshard, reshard).
    Before,
    /// Right after the compute and its sends (reductions).
    After,
}

/// One placed action: (index of the compute in the rank's order, slot, action, stage). Index
/// `tasks.len()` with [`Slot::Before`] is the end of the program.
pub type Placed = (usize, Slot, ParamAction, StageId);

/// The distinct stages of a task, in PyTorch's sub-action order (an overlap's forward first).
fn task_stages(task: &Task) -> SmallVec<[StageId; 2]> {
    let mut stages: SmallVec<[StageId; 2]> = SmallVec::new();
    for op in task.ops() {
        if !stages.contains(&op.stage) {
            stages.push(op.stage);
        }
    }
    stages
}

/// Per compute, the stages resident from it on: the distinct stages of the computes from it,
/// whole computes at a time, until `count` are found. Walked backwards with the stages ordered by
/// their next use (each compute moves its stages to the front).
pub(super) fn resident_stages(tasks: &[Task], count: usize) -> Vec<SmallVec<[StageId; 4]>> {
    let mut by_next_use: Vec<(StageId, usize)> = Vec::new();
    let mut resident = vec![SmallVec::new(); tasks.len()];
    for (i, task) in tasks.iter().enumerate().rev() {
        let stages = task_stages(task);
        by_next_use.retain(|(s, _)| !stages.contains(s));
        for (k, &s) in stages.iter().enumerate() {
            by_next_use.insert(k, (s, i));
        }
        let here = &mut resident[i];
        let mut group = usize::MAX;
        for &(s, first) in &by_next_use {
            if here.len() >= count && first != group {
                break;
            }
            group = first;
            here.push(s);
        }
    }
    resident
}

/// The parameter actions of one rank's compute order (see [`crate::spmd::params`]), sorted by
/// (compute, slot). Forward-only orders get residency alone.
pub fn place(tasks: &[Task], forward_only: bool) -> Vec<Placed> {
    let mut placed = Vec::new();
    let resident = resident_stages(tasks, MAX_ACTIVE_STAGES);
    let last_weight = last_weight_tasks(tasks);
    let mut active: SmallVec<[StageId; 4]> = SmallVec::new();
    for (i, task) in tasks.iter().enumerate() {
        let now = &resident[i];
        for &s in active.iter().filter(|s| !now.contains(s)) {
            placed.push((i, Slot::Before, ParamAction::Reshard, s));
        }
        active.retain(|s| now.contains(s));
        for &s in now {
            if !active.contains(&s) {
                active.push(s);
                placed.push((i, Slot::Before, ParamAction::Unshard, s));
            }
        }
        if forward_only {
            continue;
        }
        let _ = task.try_for_each_op(|op| {
            let last = last_weight.iter().any(|&(s, at)| s == op.stage && at == i);
            if op.kind == OpKind::WeightGrad && last {
                placed.push((i, Slot::After, ParamAction::ReduceGrad, op.stage));
                placed.push((i, Slot::After, ParamAction::WaitReduceGrad, op.stage));
            }
            std::ops::ControlFlow::<()>::Continue(())
        });
    }
    for &s in &active {
        placed.push((tasks.len(), Slot::Before, ParamAction::Reshard, s));
    }
    placed
}

/// Per stage with weight gradients on the rank, the index of its last compute holding one.
fn last_weight_tasks(tasks: &[Task]) -> SmallVec<[(StageId, usize); 4]> {
    let mut last: SmallVec<[(StageId, usize); 4]> = SmallVec::new();
    for (i, task) in tasks.iter().enumerate() {
        for op in task.ops().iter().filter(|o| o.kind == OpKind::WeightGrad) {
            match last.iter_mut().find(|(s, _)| *s == op.stage) {
                Some(entry) => entry.1 = i,
                None => last.push((op.stage, i)),
            }
        }
    }
    last
}
