//! Where a mixture of experts' all-to-alls fall around a task's computes ([`A2aPhases`]).
//!
//! A stage whose share holds MoE layers runs, in a forward: attention and routing, the
//! **dispatch** (an all-to-all sending each token to its experts), the experts, then the
//! **combine** (an all-to-all bringing their outputs back). A backward runs them in reverse: the
//! combine's backward (output gradients to the experts), the experts' backward, the dispatch's
//! backward (input gradients back), the attention's backward. The all-to-alls run on a
//! communication resource beside the rank's computes; each of the two takes half the stage's
//! `a2a` (see [`crate::ir::cost`]), the experts a share `s` of each compute.
//!
//! - **A forward** (and a recompute, which redoes its dispatch and combine): the experts wait for
//!   the dispatch, so it lies inside the task's span, the rank idle; the combine is issued
//!   asynchronously once the experts end (the **tail**): the rank goes on with its next task while
//!   it runs, and what needs the forward's output waits for it.
//! - **An input-gradient or full backward**: the combine's backward is issued as soon as the
//!   output gradient arrives (the **head**), while the rank may still run an earlier task; the
//!   dispatch's backward lies inside the span (the attention's backward waits for it).
//! - **A weight-gradient backward** has none (the experts' weights are local).
//! - **An overlapped F&B** (DualPipe's pair) interleaves the two halves as DeepSeek-V3 does
//!   (report section 3.2.1): four slots, each a compute of one half beside an all-to-all of the
//!   other (forward attention | backward combine; backward experts | forward dispatch; forward
//!   experts | backward dispatch; backward attention | forward combine). A slot lasts the longer
//!   of the two, so each all-to-all is hidden up to its partner's compute.
//!
//! A recompute of a W's inputs (`RW`) redoes a forward and an input gradient: both inside.
//! The all-to-alls of different tasks may overlap one another (the network carries them at once).
//!
//! [`A2aPhases`] gives their durations; [`TaskAllToAlls`] names the same all-to-alls one by one
//! ([`AllToAll`]: a (stage, microbatch) and its [`AllToAllPhase`]) with the same placement, which
//! the projected programs state as instructions and the checker holds them to.

use crate::ir::ids::StageId;
use crate::ir::op::{Task, Work};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt;

/// Which of the four all-to-alls of one (stage, microbatch) of a mixture of experts.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub enum AllToAllPhase {
    /// The forward's: each token to its experts.
    Dispatch,
    /// The forward's: the experts' outputs back.
    Combine,
    /// The backward's first: the output gradients to the experts (the combine's backward).
    CombineBackward,
    /// The backward's second: the experts' input gradients back (the dispatch's backward).
    DispatchBackward,
}

impl AllToAllPhase {
    /// The name in programs and messages.
    pub fn name(self) -> &'static str {
        match self {
            AllToAllPhase::Dispatch => "dispatch",
            AllToAllPhase::Combine => "combine",
            AllToAllPhase::CombineBackward => "combine-backward",
            AllToAllPhase::DispatchBackward => "dispatch-backward",
        }
    }
}

/// One all-to-all: the (stage, microbatch) whose experts exchange, and which exchange. It is a
/// collective of the expert ranks of the stage's pipeline rank (each runs the same program).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct AllToAll {
    /// The stage and microbatch.
    pub work: Work,
    /// Which of the four.
    pub phase: AllToAllPhase,
}

impl AllToAll {
    /// The all-to-all `phase` of `work`.
    pub fn new(work: Work, phase: AllToAllPhase) -> AllToAll {
        AllToAll { work, phase }
    }
}

impl fmt::Display for AllToAll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}(stage {}, mb {})",
            self.phase.name(),
            self.work.stage,
            self.work.microbatch
        )
    }
}

/// A task's all-to-alls, one by one, where [`A2aPhases`] places them: the same head, span and
/// tail (each figure of [`A2aPhases`] is non-zero exactly where its part here is non-empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskAllToAlls {
    /// Issued once the task's output gradient is there, waited for before its compute: an
    /// input-gradient or full backward's combine-backward.
    pub head: Option<AllToAll>,
    /// Inside the task's span, each issued and waited for before the next is issued, in the
    /// order its parts run them (an overlapped pair: DeepSeek-V3's four slots).
    pub span: SmallVec<[AllToAll; 4]>,
    /// Issued when the compute ends, waited for before anything needs the task's output: a
    /// forward's combine.
    pub tail: Option<AllToAll>,
}

impl TaskAllToAlls {
    /// The all-to-alls of `task`, whose stages have experts where `experts` says so (a stage
    /// without has none: a pair on one stage with experts and one without runs only that
    /// half's).
    pub fn of(task: &Task, experts: impl Fn(StageId) -> bool) -> TaskAllToAlls {
        use AllToAllPhase::{Combine, CombineBackward, Dispatch, DispatchBackward};
        let of = |w: Work, phases: &[AllToAllPhase]| -> SmallVec<[AllToAll; 4]> {
            if experts(w.stage) {
                phases.iter().map(|&p| AllToAll::new(w, p)).collect()
            } else {
                SmallVec::new()
            }
        };
        let one = |w: Work, phase| experts(w.stage).then(|| AllToAll::new(w, phase));
        let mut all = TaskAllToAlls::default();
        match *task {
            Task::Forward(w) => {
                all.span = of(w, &[Dispatch]);
                all.tail = one(w, Combine);
            }
            Task::InputGrad(w) | Task::Backward(w) => {
                all.head = one(w, CombineBackward);
                all.span = of(w, &[DispatchBackward]);
            }
            Task::Recompute(w) => all.span = of(w, &[Dispatch, Combine]),
            Task::RecomputeWeightGrad(w) => {
                all.span = of(w, &[Dispatch, Combine, CombineBackward, DispatchBackward]);
            }
            Task::Overlapped { forward, backward } => {
                // Slot 1: forward attention | backward combine; 2: backward experts | forward
                // dispatch; 3: forward experts | backward dispatch; 4: backward attention |
                // forward combine.
                let slots = [
                    one(backward, CombineBackward),
                    one(forward, Dispatch),
                    one(backward, DispatchBackward),
                    one(forward, Combine),
                ];
                all.span = slots.into_iter().flatten().collect();
            }
            Task::WeightGrad(_) | Task::Offload(_) | Task::Reload(_) => {}
        }
        all
    }

    /// Whether the task has none.
    pub fn is_empty(&self) -> bool {
        self.head.is_none() && self.span.is_empty() && self.tail.is_none()
    }
}

/// A task's all-to-alls against its computes: what precedes them (`head`), what lies inside its
/// span and how much of that the rank waits for (`inside_exposed`), and what follows (`tail`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct A2aPhases {
    /// Issued when the task's inputs arrive, before its compute can start.
    pub head: f64,
    /// Inside the task's span.
    pub inside: f64,
    /// The part of `inside` the rank's compute waits for (the rest runs under the other half of
    /// an overlapped pair).
    pub inside_exposed: f64,
    /// Issued when its compute ends; what needs the task's output waits for it.
    pub tail: f64,
}

impl A2aPhases {
    /// No all-to-all.
    pub const NONE: A2aPhases = A2aPhases {
        head: 0.0,
        inside: 0.0,
        inside_exposed: 0.0,
        tail: 0.0,
    };

    /// A forward with all-to-alls `a2a` (dispatch and combine): the dispatch inside, the combine
    /// after.
    pub fn forward(a2a: f64) -> A2aPhases {
        A2aPhases {
            head: 0.0,
            inside: a2a / 2.0,
            inside_exposed: a2a / 2.0,
            tail: a2a / 2.0,
        }
    }

    /// A backward (input gradient or whole) with all-to-alls `a2a`: the combine's backward
    /// before, the dispatch's inside.
    pub fn backward(a2a: f64) -> A2aPhases {
        A2aPhases {
            head: a2a / 2.0,
            inside: a2a / 2.0,
            inside_exposed: a2a / 2.0,
            tail: 0.0,
        }
    }

    /// Every all-to-all of the task inside its span, waited for (a recompute).
    pub fn inside(a2a: f64) -> A2aPhases {
        A2aPhases {
            head: 0.0,
            inside: a2a,
            inside_exposed: a2a,
            tail: 0.0,
        }
    }

    /// An overlapped F&B: the forward's computes `forward` and all-to-alls `forward_a2a`, the
    /// backward's `backward` and `backward_a2a`, the experts a share `share` of each compute,
    /// in DeepSeek's four slots (see the module doc).
    pub fn overlapped(
        forward: f64,
        forward_a2a: f64,
        backward: f64,
        backward_a2a: f64,
        share: f64,
    ) -> A2aPhases {
        let slots = [
            ((1.0 - share) * forward, backward_a2a / 2.0),
            (share * backward, forward_a2a / 2.0),
            (share * forward, backward_a2a / 2.0),
            ((1.0 - share) * backward, forward_a2a / 2.0),
        ];
        let exposed: f64 = slots.iter().map(|(c, a)| (a - c).max(0.0)).sum();
        A2aPhases {
            head: 0.0,
            inside: forward_a2a + backward_a2a,
            inside_exposed: exposed,
            tail: 0.0,
        }
    }

    /// The same pair with its halves run one after the other: every all-to-all waited for.
    pub fn sequential(self) -> A2aPhases {
        A2aPhases {
            inside_exposed: self.inside,
            ..self
        }
    }

    /// Every all-to-all of the task.
    pub fn total(&self) -> f64 {
        self.head + self.inside + self.tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forward_waits_for_its_dispatch_and_leaves_its_combine_behind() {
        let f = A2aPhases::forward(1.0);
        assert_eq!((f.head, f.inside_exposed, f.tail), (0.0, 0.5, 0.5));
        let b = A2aPhases::backward(1.0);
        assert_eq!((b.head, b.inside_exposed, b.tail), (0.5, 0.5, 0.0));
        assert_eq!(f.total(), 1.0);
    }

    #[test]
    fn each_all_to_all_lies_where_its_phases_put_time() {
        use crate::ir::cost::{CostModel, StageCostsSpec};
        let with = StageCostsSpec::builder()
            .a2a(1.0)
            .build()
            .validate()
            .unwrap();
        let costs = CostModel::per_stage(vec![with, Default::default()], 0.0).unwrap();
        let experts = |s: StageId| s.index() == 0;
        for notation in [
            "0F1",
            "0I1",
            "0B1",
            "0W1",
            "0R1",
            "0RW1",
            "0OFFLOAD1",
            "1F1",
            "1B1",
        ] {
            let task: Task = notation.parse().unwrap();
            let (phases, all) = (costs.a2a_phases(&task), TaskAllToAlls::of(&task, experts));
            assert_eq!(phases.head > 0.0, all.head.is_some(), "{notation}");
            assert_eq!(phases.inside > 0.0, !all.span.is_empty(), "{notation}");
            assert_eq!(phases.tail > 0.0, all.tail.is_some(), "{notation}");
            // Each all-to-all of a stage takes half its `a2a`.
            let count =
                all.span.len() + usize::from(all.head.is_some()) + usize::from(all.tail.is_some());
            assert_eq!(phases.total(), count as f64 / 2.0, "{notation}");
        }
        let pair = Task::Overlapped {
            forward: Work::new(0, 2),
            backward: Work::new(0, 1),
        };
        let names: Vec<String> = TaskAllToAlls::of(&pair, experts)
            .span
            .iter()
            .map(AllToAll::to_string)
            .collect();
        assert_eq!(
            names,
            [
                "combine-backward(stage 0, mb 1)",
                "dispatch(stage 0, mb 2)",
                "dispatch-backward(stage 0, mb 1)",
                "combine(stage 0, mb 2)"
            ]
        );
        // Half a pair on a stage without experts: the other half's only.
        let half = Task::Overlapped {
            forward: Work::new(1, 2),
            backward: Work::new(0, 1),
        };
        assert_eq!(TaskAllToAlls::of(&half, experts).span.len(), 2);
    }

    #[test]
    fn a_pair_hides_each_all_to_all_under_the_other_half_s_compute() {
        // F = 1, B = 2, half in the experts: the slots' computes are 0.5, 1, 0.5, 1; all-to-alls
        // of a quarter each hide entirely.
        let pair = A2aPhases::overlapped(1.0, 0.5, 2.0, 0.5, 0.5);
        assert_eq!((pair.inside, pair.inside_exposed), (1.0, 0.0));
        // All-to-alls of one each: 0.5 + 0 + 0.5 + 0 exposed where the slot's compute is 0.5.
        let slow = A2aPhases::overlapped(1.0, 2.0, 2.0, 2.0, 0.5);
        assert_eq!(slow.inside_exposed, 1.0);
        assert_eq!(slow.sequential().inside_exposed, 4.0);
    }
}
