//! The dependency rule between ops, shared by the verifier, the simulator, the projection and the
//! checker.
//!
//! - F of a microbatch on a stage needs F of that microbatch on the previous stage of its route.
//! - I needs F on the same stage and I on the next stage of the route.
//! - W needs I on the same stage.
//! - Sequence chunks (a problem with `seq_chunks` k > 1, Seq1F1B): chunk `c`'s F also needs
//!   chunk `c - 1`'s F on the same stage (its attention reads their keys and values), and chunk
//!   `c - 1`'s I needs chunk `c`'s I on the same stage (the gradients of those keys and values
//!   flow back from the later chunk). Both sit on one stage, so one rank: no message travels.
//!
//! A full backward (B) is an I and its W; its dependencies are the I's.
//!
//! [`predecessors`] states the rule on a [`Problem`]; [`Links`] is the same rule over dense tables
//! (per route and stage, the stages before and after it), built once by the analyses that visit
//! every op, so that their inner loops look neighbours up instead of searching routes.

use crate::ir::ids::{MicrobatchId, RankId, StageId};
use crate::ir::op::{Op, OpKind};
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use smallvec::{smallvec, SmallVec};
use std::ops::ControlFlow;

/// The ops `op` depends on. `op` must be on an existing (stage, microbatch) pair; for any other
/// op the result is empty.
pub fn predecessors(problem: &Problem, op: Op) -> SmallVec<[Op; 3]> {
    let Some(route) = problem.route_of(op.microbatch) else {
        return SmallVec::new();
    };
    let (earlier, later) = chunk_neighbours(problem.seq_chunks(), op.microbatch);
    let mut deps: SmallVec<[Op; 3]> = SmallVec::new();
    match op.kind {
        OpKind::Forward => {
            if let Some(prev) = route.prev(op.stage) {
                deps.push(Op::new(OpKind::Forward, prev, op.microbatch));
            }
            if let Some(earlier) = earlier {
                deps.push(Op::new(OpKind::Forward, op.stage, earlier));
            }
        }
        OpKind::InputGrad => {
            deps.push(Op::new(OpKind::Forward, op.stage, op.microbatch));
            if let Some(next) = route.next(op.stage) {
                deps.push(Op::new(OpKind::InputGrad, next, op.microbatch));
            }
            if let Some(later) = later {
                deps.push(Op::new(OpKind::InputGrad, op.stage, later));
            }
        }
        OpKind::WeightGrad => deps = smallvec![Op::new(OpKind::InputGrad, op.stage, op.microbatch)],
    }
    deps
}

/// The chunks before and after `microbatch` in its sample group's sequence, with `chunks` per
/// group (none without a split).
#[inline]
fn chunk_neighbours(
    chunks: u32,
    microbatch: MicrobatchId,
) -> (Option<MicrobatchId>, Option<MicrobatchId>) {
    if chunks <= 1 {
        return (None, None);
    }
    let c = microbatch.get() % chunks;
    let earlier = (c > 0).then(|| MicrobatchId::new(microbatch.get() - 1));
    let later = (c + 1 < chunks).then(|| MicrobatchId::new(microbatch.get() + 1));
    (earlier, later)
}

/// Marks "no stage on this side" (a route's first or last stage) in [`Links`].
const END: u32 = u32::MAX;
/// Marks "the stage is not on this route" in [`Links`].
const OFF_ROUTE: u32 = u32::MAX - 1;

/// The dependency rule and placement of one problem as dense tables: per microbatch its route,
/// per (route, stage) the previous and next stage on that route, per stage its rank.
#[derive(Clone, Debug)]
pub struct Links {
    slots: OpSlots,
    stages: usize,
    /// Microbatch -> route index.
    route_of: Vec<u32>,
    /// (route · stages + stage) -> [previous stage, next stage], `END` or `OFF_ROUTE`.
    around: Vec<[u32; 2]>,
    /// Stage -> rank.
    owner: Vec<RankId>,
    /// Sequence chunks per sample group (1: no split).
    seq_chunks: u32,
}

impl Links {
    /// The tables of `problem` (linear in its stages and microbatches, not in its ops).
    pub fn of(problem: &Problem) -> Links {
        let stages = problem.stages() as usize;
        let mut route_of = vec![0u32; problem.microbatches() as usize];
        let mut around = vec![[OFF_ROUTE; 2]; stages * problem.routes().len()];
        for (index, route) in problem.routes().iter().enumerate() {
            route_of[route.first().index()..route.end().index()].fill(index as u32);
            let row = &mut around[index * stages..(index + 1) * stages];
            let on_route = route.stages();
            for (position, stage) in on_route.iter().enumerate() {
                let prev = position.checked_sub(1).map_or(END, |p| on_route[p].get());
                let next = on_route.get(position + 1).map_or(END, |s| s.get());
                row[stage.index()] = [prev, next];
            }
        }
        Links {
            slots: OpSlots::of(problem),
            stages,
            route_of,
            around,
            owner: problem.stage_to_rank().to_vec(),
            seq_chunks: problem.seq_chunks(),
        }
    }

    /// The numbering of the problem's ops.
    pub fn slots(&self) -> OpSlots {
        self.slots
    }

    /// The stages before and after `stage` on `microbatch`'s route, or None when the pair does
    /// not exist (out of range, or the stage is off the route).
    #[inline]
    fn around(&self, stage: StageId, microbatch: MicrobatchId) -> Option<[u32; 2]> {
        if stage.index() >= self.stages {
            return None;
        }
        let route = *self.route_of.get(microbatch.index())? as usize;
        let links = self.around[route * self.stages + stage.index()];
        (links[0] != OFF_ROUTE).then_some(links)
    }

    /// Whether the (stage, microbatch) pair exists: both in range and the stage on the route.
    #[inline]
    pub fn has_work(&self, stage: StageId, microbatch: MicrobatchId) -> bool {
        self.around(stage, microbatch).is_some()
    }

    /// Dense index of an existing op, or None when its pair does not exist.
    #[inline]
    pub fn slot(&self, op: Op) -> Option<usize> {
        self.around(op.stage, op.microbatch)?;
        self.slots.op(op)
    }

    /// The stage before `stage` on `microbatch`'s route (None at its start or for no pair).
    #[inline]
    pub fn prev(&self, stage: StageId, microbatch: MicrobatchId) -> Option<StageId> {
        let [prev, _] = self.around(stage, microbatch)?;
        (prev != END).then_some(StageId::new(prev))
    }

    /// The stage after `stage` on `microbatch`'s route (None at its end or for no pair).
    #[inline]
    pub fn next(&self, stage: StageId, microbatch: MicrobatchId) -> Option<StageId> {
        let [_, next] = self.around(stage, microbatch)?;
        (next != END).then_some(StageId::new(next))
    }

    /// The rank that owns `stage`, or None when it is out of range.
    #[inline]
    pub fn owner(&self, stage: StageId) -> Option<RankId> {
        self.owner.get(stage.index()).copied()
    }

    /// [`predecessors`] from the tables: the ops `op` depends on. Like [`predecessors`], for an
    /// op whose pair does not exist it names the dependencies on its own stage (none when its
    /// microbatch is out of range), so a checker given a bogus op finds what it lacks.
    #[inline]
    pub fn predecessors(&self, op: Op) -> Deps {
        let mut deps = Deps::default();
        if op.microbatch.index() < self.route_of.len() {
            let around = self.around(op.stage, op.microbatch).unwrap_or([END; 2]);
            let chunks = chunk_neighbours(self.seq_chunks, op.microbatch);
            let _ = each_dep(op, around, chunks, |dep| {
                deps.push(dep);
                ControlFlow::<()>::Continue(())
            });
        }
        deps
    }

    /// Locates an existing op and calls `need` with each op it depends on and that op's slot
    /// until it breaks (one table lookup for all, nothing collected): the op's slot and how the
    /// visit ended, or None when the op's pair does not exist.
    #[inline]
    pub fn try_for_each_dep<B>(
        &self,
        op: Op,
        mut need: impl FnMut(Op, usize) -> ControlFlow<B>,
    ) -> Option<(usize, ControlFlow<B>)> {
        let around = self.around(op.stage, op.microbatch)?;
        // The dependencies of an existing op exist: their slots need no range check.
        let microbatches = self.route_of.len();
        let slot_of =
            |o: Op| (o.stage.index() * microbatches + o.microbatch.index()) * 3 + o.kind.index();
        let chunks = chunk_neighbours(self.seq_chunks, op.microbatch);
        let flow = each_dep(op, around, chunks, |dep| need(dep, slot_of(dep)));
        Some((slot_of(op), flow))
    }

    /// An existing op's dense slot and the ops it depends on with theirs, or None when its pair
    /// does not exist: [`Links::try_for_each_dep`], collected.
    pub fn locate(&self, op: Op) -> Option<Located> {
        let mut deps = Vec::with_capacity(2);
        let (slot, _) = self.try_for_each_dep(op, |dep, slot| {
            deps.push((dep, slot));
            ControlFlow::<()>::Continue(())
        })?;
        Some(Located { slot, deps })
    }
}

/// The dependency rule on the tables: calls `need` with each op `op` depends on, given the
/// stages before and after it on its route (`END` at an end) and the chunks before and after it
/// in its sequence, until it breaks.
#[inline]
fn each_dep<B>(
    op: Op,
    [prev, next]: [u32; 2],
    (earlier, later): (Option<MicrobatchId>, Option<MicrobatchId>),
    mut need: impl FnMut(Op) -> ControlFlow<B>,
) -> ControlFlow<B> {
    let on = |kind, stage: u32| Op::new(kind, StageId::new(stage), op.microbatch);
    match op.kind {
        OpKind::Forward => {
            if prev != END {
                need(on(OpKind::Forward, prev))?;
            }
            match earlier {
                Some(chunk) => need(Op::new(OpKind::Forward, op.stage, chunk)),
                None => ControlFlow::Continue(()),
            }
        }
        OpKind::InputGrad => {
            need(Op::new(OpKind::Forward, op.stage, op.microbatch))?;
            if next != END {
                need(on(OpKind::InputGrad, next))?;
            }
            match later {
                Some(chunk) => need(Op::new(OpKind::InputGrad, op.stage, chunk)),
                None => ControlFlow::Continue(()),
            }
        }
        OpKind::WeightGrad => need(Op::new(OpKind::InputGrad, op.stage, op.microbatch)),
    }
}

/// An existing op as [`Links::locate`] finds it: its dense slot, and the ops it depends on with
/// their slots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// The op's slot.
    pub slot: usize,
    /// The ops it depends on, with their slots.
    pub deps: Vec<(Op, usize)>,
}

/// The at most three ops one op depends on, without an allocation ([`Links::predecessors`]).
#[derive(Clone, Copy, Debug)]
pub struct Deps {
    ops: [Op; 3],
    len: u8,
    at: u8,
}

impl Default for Deps {
    fn default() -> Deps {
        let none = Op::new(OpKind::Forward, StageId::new(0), MicrobatchId::new(0));
        Deps {
            ops: [none; 3],
            len: 0,
            at: 0,
        }
    }
}

impl Deps {
    fn push(&mut self, op: Op) {
        self.ops[usize::from(self.len)] = op;
        self.len += 1;
    }
}

impl Iterator for Deps {
    type Item = Op;

    #[inline]
    fn next(&mut self) -> Option<Op> {
        (self.at < self.len).then(|| {
            self.at += 1;
            self.ops[usize::from(self.at - 1)]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::problem::ProblemSpec;

    #[test]
    fn links_follow_the_rule_on_every_op() {
        for problem in [
            ProblemSpec::dualpipe(3, 6).validate().unwrap(),
            ProblemSpec::builder()
                .ranks(2)
                .microbatches(3)
                .stage_to_rank(vec![0, 1, 1, 0])
                .build()
                .validate()
                .unwrap(),
            ProblemSpec::builder()
                .ranks(2)
                .microbatches(6)
                .stage_to_rank(vec![0, 1, 1, 0])
                .seq_chunks(3)
                .build()
                .validate()
                .unwrap(),
        ] {
            let links = Links::of(&problem);
            for stage in 0..problem.stages() + 1 {
                for mb in 0..problem.microbatches() + 1 {
                    let (s, m) = (StageId::new(stage), MicrobatchId::new(mb));
                    assert_eq!(links.has_work(s, m), problem.has_work(s, m));
                    for kind in OpKind::ALL {
                        let op = Op::new(kind, s, m);
                        let expected: Vec<Op> = predecessors(&problem, op).into_iter().collect();
                        assert_eq!(links.predecessors(op).collect::<Vec<_>>(), expected);
                        let slot = problem.has_work(s, m).then(|| OpSlots::of(&problem).op(op));
                        assert_eq!(links.slot(op), slot.flatten());
                        let located = links.locate(op).map(|l| (l.slot, l.deps));
                        let with_slots = |k| {
                            let slots = OpSlots::of(&problem);
                            let deps = expected.iter().map(|&d| (d, slots.op(d).unwrap()));
                            (k, deps.collect::<Vec<_>>())
                        };
                        assert_eq!(located, slot.flatten().map(with_slots));
                        let mut visited = Vec::new();
                        let visit = links.try_for_each_dep(op, |dep, k| {
                            visited.push((dep, k));
                            ControlFlow::<()>::Continue(())
                        });
                        assert_eq!(visit.map(|(k, _)| (k, visited)), located);
                    }
                }
            }
        }
    }

    #[test]
    fn sequence_chunks_depend_on_their_neighbours_on_the_same_stage() {
        let problem = ProblemSpec::builder()
            .ranks(2)
            .microbatches(4)
            .seq_chunks(2)
            .build()
            .validate()
            .unwrap();
        let op = |kind, s: u32, m: u32| Op::new(kind, StageId::new(s), MicrobatchId::new(m));
        let deps = |o| predecessors(&problem, o).into_vec();
        use OpKind::{Forward as F, InputGrad as I};
        // Chunk 1 of group 0 reads chunk 0's keys and values; group 1 starts afresh.
        assert_eq!(deps(op(F, 1, 1)), vec![op(F, 0, 1), op(F, 1, 0)]);
        assert_eq!(deps(op(F, 0, 2)), vec![]);
        // Chunk 0's input gradient waits for chunk 1's (their key and value gradients).
        assert_eq!(
            deps(op(I, 0, 0)),
            vec![op(F, 0, 0), op(I, 1, 0), op(I, 0, 1)]
        );
        assert_eq!(deps(op(I, 1, 1)), vec![op(F, 1, 1)]);
        let odd = ProblemSpec::builder()
            .ranks(2)
            .microbatches(3)
            .seq_chunks(2)
            .build();
        let err = odd.validate().unwrap_err().to_string();
        assert!(
            err.contains("not whole groups of 2 sequence chunks"),
            "{err}"
        );
        let zero = ProblemSpec::builder()
            .ranks(2)
            .microbatches(3)
            .seq_chunks(0)
            .build();
        assert!(zero
            .validate()
            .unwrap_err()
            .to_string()
            .contains("seq_chunks = 0"));
    }
}
