//! A mixture of experts' all-to-alls in the projected programs ([`Experts`]): which tasks run
//! which ([`TaskAllToAlls`], from the cost model's stages with all-to-alls), when a forward's
//! output is ready (its combine's end, where its sends go), and which backwards of a rank wait
//! for a head all-to-all (a combine-backward issued when their gradient arrives).
//!
//! The events they become, on the time line of `events.rs`: a task's span right after its
//! compute (at its start moment, `SpanAllToAll`), then a forward's combine issued; that combine
//! waited for at the moment the replay ends it (`t.end + tail`: `TailWait`, before the sends of
//! the activation, which move there with their frees, and the early receives of the peer with
//! them), except on the last stage of a route, where the loss needs it at once (waited for in
//! the span, before the loss). A backward's head is issued where its gradient is there (after an
//! early receive, after the compute or the loss that produced it on this rank, else right before
//! the backward after a just-in-time receive) and waited for right before the backward
//! (`HeadAllToAll`). Without all-to-all costs none of this runs: the programs are those of a
//! plan without experts, event for event.

use crate::analysis::replay::TimedTask;
use crate::ir::all_to_all::{AllToAll, AllToAllPhase, TaskAllToAlls};
use crate::ir::cost::CostModel;
use crate::ir::ids::StageId;
use crate::ir::op::{Task, Work};
use std::collections::HashSet;

/// The stages with all-to-alls of a plan's cost model and the tails of its tasks.
pub(super) struct Experts<'a> {
    costs: &'a CostModel,
    /// Per stage, whether it has all-to-alls.
    stages: Vec<bool>,
}

impl<'a> Experts<'a> {
    /// The all-to-alls of `costs`; None where no stage has any.
    pub(super) fn of(costs: &'a CostModel) -> Option<Experts<'a>> {
        costs.has_a2a().then(|| Experts {
            costs,
            stages: costs.stages().iter().map(|s| s.a2a() > 0.0).collect(),
        })
    }

    /// Whether `stage` has all-to-alls.
    fn has(&self, stage: StageId) -> bool {
        self.stages.get(stage.index()).copied().unwrap_or(false)
    }

    /// The all-to-alls `task` runs.
    pub(super) fn of_task(&self, task: &Task) -> TaskAllToAlls {
        TaskAllToAlls::of(task, |s| self.has(s))
    }

    /// When the outputs of `t` are ready: its end, after its tail all-to-all (as the replay
    /// engine ends it).
    pub(super) fn outputs_end(&self, t: &TimedTask) -> f64 {
        let tail = self.costs.a2a_phases(&t.task).tail;
        if tail > 0.0 {
            t.end + tail
        } else {
            t.end
        }
    }

    /// The works whose backward on a rank running `tasks` waits for a head all-to-all.
    pub(super) fn heads(&self, tasks: &[TimedTask]) -> HashSet<Work> {
        tasks
            .iter()
            .filter_map(|t| self.of_task(&t.task).head)
            .map(|a| a.work)
            .collect()
    }
}

/// The head all-to-all of `work`'s backward.
pub(super) fn head(work: Work) -> AllToAll {
    AllToAll::new(work, AllToAllPhase::CombineBackward)
}

/// The time a task's outputs are ready with `experts` (its end without).
pub(super) fn outputs_end(experts: Option<&Experts<'_>>, t: &TimedTask) -> f64 {
    experts.map_or(t.end, |e| e.outputs_end(t))
}
