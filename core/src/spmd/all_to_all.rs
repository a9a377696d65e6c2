//! The order of a mixture of experts' all-to-all instructions in rank programs (part of the
//! communication checker, [`crate::spmd::check`]): what plans with all-to-all costs project to
//! ([`Instr::IssueAllToAll`], [`Instr::WaitAllToAll`]), checked on the programs themselves,
//! whatever built them. An all-to-all is a collective of the expert ranks that run one program,
//! so no other rank takes part: what can go wrong is its place in the program.
//!
//! A stage has experts when any all-to-all instruction of the set names it. Per rank program:
//! - every all-to-all names a stage of the rank and a microbatch of the problem;
//! - every issue is waited for exactly once: after it, before the same all-to-all is issued
//!   again (a recompute redoes its forward's), and by the end of the program;
//! - a task on stages with experts runs its all-to-alls where the plan places them
//!   ([`TaskAllToAlls`]): its span right after its `Compute`, each issued and waited for in
//!   order, then a forward's combine issued, with nothing else between (an overlapped pair's
//!   four lie inside the pair, in DeepSeek-V3's slots); a dispatch, a dispatch-backward or a
//!   combine is issued nowhere else;
//! - a backward's combine-backward outside a span (its head) is issued once the backward's
//!   output gradient is on the rank (received, given by a compute of the rank or by the loss)
//!   and waited for before the backward's compute; every head waited for belongs to a backward
//!   that comes after it;
//! - a forward's combine is waited for before anything that needs the forward's output: the
//!   send of its activation, its loss, the compute of an op that depends on it (a drop or an
//!   offload of what the forward saved need not wait: the plan issues them at the compute's end).

use crate::ir::all_to_all::{AllToAll, AllToAllPhase, TaskAllToAlls};
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{OpKind, Task, Work};
use crate::ir::problem::Problem;
use crate::spmd::program::{CommOp, Direction, Instr, ProgramSet};
use smallvec::SmallVec;
use std::collections::{HashMap, HashSet};
use std::fmt;

/// What is wrong with a program's all-to-all instructions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum A2aFault {
    /// It names a stage another rank holds (or none), or a microbatch out of range.
    NotOnRank {
        /// The all-to-all.
        a2a: AllToAll,
    },
    /// Issued while its earlier issue is not waited for.
    IssuedAgain {
        /// The all-to-all.
        a2a: AllToAll,
    },
    /// Waited for without an issue pending.
    NotIssued {
        /// The all-to-all.
        a2a: AllToAll,
    },
    /// Issued and never waited for.
    NeverWaited {
        /// The all-to-all.
        a2a: AllToAll,
    },
    /// The span of `task` (right after its compute) lacks `expected` at this place.
    SpanBroken {
        /// The task.
        task: Task,
        /// The instruction its span needs here.
        expected: Instr,
    },
    /// An all-to-all that runs inside its task's span is issued outside it.
    OutsideSpan {
        /// The all-to-all.
        a2a: AllToAll,
    },
    /// A backward's head is issued before its output gradient is on the rank.
    BeforeGradient {
        /// The all-to-all.
        a2a: AllToAll,
    },
    /// `needed_by` needs the result of an all-to-all that is not waited for yet.
    Pending {
        /// The all-to-all.
        a2a: AllToAll,
        /// The instruction that needs it, as written.
        needed_by: String,
    },
    /// A backward computes without its head issued and waited for before it.
    NoHead {
        /// The backward.
        task: Task,
        /// Its head.
        a2a: AllToAll,
    },
    /// A head waited for that no backward after it needs.
    UnusedHead {
        /// The all-to-all.
        a2a: AllToAll,
    },
}

impl fmt::Display for A2aFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            A2aFault::NotOnRank { a2a } => write!(
                f,
                "{a2a} names a stage this rank does not hold or a microbatch out of range"
            ),
            A2aFault::IssuedAgain { a2a } => {
                write!(
                    f,
                    "{a2a} is issued again before its earlier issue is waited for"
                )
            }
            A2aFault::NotIssued { a2a } => write!(f, "{a2a} is waited for but not issued"),
            A2aFault::NeverWaited { a2a } => write!(f, "{a2a} is issued and never waited for"),
            A2aFault::SpanBroken { task, expected } => write!(
                f,
                "the span of {task} needs {expected} here (its all-to-alls follow its compute, \
                 in order)"
            ),
            A2aFault::OutsideSpan { a2a } => {
                write!(f, "{a2a} runs inside its task's span, not on its own")
            }
            A2aFault::BeforeGradient { a2a } => write!(
                f,
                "{a2a} is issued before its output gradient is on the rank"
            ),
            A2aFault::Pending { a2a, needed_by } => {
                write!(f, "{needed_by} needs {a2a}, which is not waited for yet")
            }
            A2aFault::NoHead { task, a2a } => {
                write!(f, "{task} needs {a2a} issued and waited for before it")
            }
            A2aFault::UnusedHead { a2a } => {
                write!(f, "{a2a} is waited for but no backward after it needs it")
            }
        }
    }
}

/// A fault with where it is: (rank, instruction index).
pub type Located = (RankId, usize, A2aFault);

/// The all-to-all an instruction names, if any.
fn named(instr: &Instr) -> Option<AllToAll> {
    match instr {
        Instr::IssueAllToAll(a) | Instr::WaitAllToAll(a) => Some(*a),
        _ => None,
    }
}

/// Checks the all-to-all instructions of every program (see the module doc). Programs without
/// any pass at once.
pub fn check_all_to_alls(problem: &Problem, set: &ProgramSet) -> Result<(), Located> {
    let mut experts = vec![false; problem.stages() as usize];
    let mut any = false;
    for program in &set.programs {
        for (i, a) in program
            .instrs
            .iter()
            .enumerate()
            .filter_map(|(i, instr)| Some((i, named(instr)?)))
        {
            let here = problem.rank_of(a.work.stage) == Some(program.rank)
                && a.work.microbatch.get() < problem.microbatches();
            if !here {
                return Err((program.rank, i, A2aFault::NotOnRank { a2a: a }));
            }
            experts[a.work.stage.index()] = true;
            any = true;
        }
    }
    if !any {
        return Ok(());
    }
    let links = Links::of(problem);
    for program in &set.programs {
        let walk = Walk {
            links: &links,
            experts: &experts,
            rank: program.rank,
            pending: HashMap::new(),
            heads: HashMap::new(),
            gradients: HashSet::new(),
        };
        walk.run(&program.instrs)?;
    }
    Ok(())
}

/// One program's walk.
struct Walk<'a> {
    links: &'a Links,
    /// Per stage, whether it has experts.
    experts: &'a [bool],
    rank: RankId,
    /// The all-to-alls issued and not waited for, with the index of their issue.
    pending: HashMap<AllToAll, usize>,
    /// The heads waited for whose backward has not run, with the index of the wait.
    heads: HashMap<AllToAll, usize>,
    /// The works whose output gradient is on the rank.
    gradients: HashSet<Work>,
}

/// A forward's combine.
fn combine(work: Work) -> AllToAll {
    AllToAll::new(work, AllToAllPhase::Combine)
}

impl Walk<'_> {
    fn run(mut self, instrs: &[Instr]) -> Result<(), Located> {
        let mut i = 0;
        while i < instrs.len() {
            let instr = &instrs[i];
            match instr {
                Instr::Compute(task) => {
                    i = self.compute(task, instrs, i)?;
                    continue;
                }
                Instr::IssueAllToAll(a) => {
                    let outside = match a.phase {
                        AllToAllPhase::CombineBackward => None,
                        _ => Some(A2aFault::OutsideSpan { a2a: *a }),
                    };
                    let early = !self.gradients.contains(&a.work);
                    let fault = outside.or(early.then_some(A2aFault::BeforeGradient { a2a: *a }));
                    if let Some(fault) = fault {
                        return Err((self.rank, i, fault));
                    }
                    self.issue(*a, i)?;
                }
                Instr::WaitAllToAll(a) => {
                    self.wait(*a, i)?;
                    if a.phase == AllToAllPhase::CombineBackward {
                        if let Some(earlier) = self.heads.insert(*a, i) {
                            return Err((self.rank, earlier, A2aFault::UnusedHead { a2a: *a }));
                        }
                    }
                }
                Instr::Comm(group) => {
                    for op in group.ops.iter() {
                        match *op {
                            CommOp::Send { message, .. }
                                if message.direction == Direction::Activation =>
                            {
                                self.needs(combine(message.source()), instr, i)?;
                            }
                            CommOp::Recv { message, .. }
                                if message.direction == Direction::Gradient =>
                            {
                                self.gradients.insert(message.consumer());
                            }
                            _ => {}
                        }
                    }
                }
                Instr::Loss(work) => {
                    self.needs(combine(*work), instr, i)?;
                    self.gradients.insert(*work);
                }
                _ => {}
            }
            i += 1;
        }
        let first = |map: &HashMap<_, usize>| map.iter().map(|(k, i)| (*i, *k)).min();
        if let Some((i, a2a)) = first(&self.pending) {
            return Err((self.rank, i, A2aFault::NeverWaited { a2a }));
        }
        if let Some((i, a2a)) = first(&self.heads) {
            return Err((self.rank, i, A2aFault::UnusedHead { a2a }));
        }
        Ok(())
    }

    /// The compute of `task` at `i` and its span after it; the index after the span.
    fn compute(&mut self, task: &Task, instrs: &[Instr], i: usize) -> Result<usize, Located> {
        let instr = &instrs[i];
        for op in task.ops() {
            for dep in self.links.predecessors(op) {
                if dep.kind == OpKind::Forward && !task.runs(dep) {
                    let work = Work {
                        stage: dep.stage,
                        microbatch: dep.microbatch,
                    };
                    self.needs(combine(work), instr, i)?;
                }
            }
        }
        let all = TaskAllToAlls::of(task, |s| {
            self.experts.get(s.index()).copied().unwrap_or(false)
        });
        if let Some(head) = all.head {
            self.needs(head, instr, i)?;
            if self.heads.remove(&head).is_none() {
                let fault = A2aFault::NoHead {
                    task: *task,
                    a2a: head,
                };
                return Err((self.rank, i, fault));
            }
        }
        let span = all
            .span
            .iter()
            .flat_map(|&a| [Instr::IssueAllToAll(a), Instr::WaitAllToAll(a)]);
        let expected: SmallVec<[Instr; 9]> =
            span.chain(all.tail.map(Instr::IssueAllToAll)).collect();
        for (k, want) in expected.iter().enumerate() {
            let at = i + 1 + k;
            if instrs.get(at) != Some(want) {
                let fault = A2aFault::SpanBroken {
                    task: *task,
                    expected: want.clone(),
                };
                return Err((self.rank, at, fault));
            }
            match *want {
                Instr::WaitAllToAll(a) => self.wait(a, at)?,
                Instr::IssueAllToAll(a) => self.issue(a, at)?,
                _ => {}
            }
        }
        // The gradients it gives a backward of this rank.
        for op in task
            .ops()
            .into_iter()
            .filter(|op| op.kind == OpKind::InputGrad)
        {
            let prev = self.links.prev(op.stage, op.microbatch);
            if let Some(stage) = prev.filter(|&s| self.links.owner(s) == Some(self.rank)) {
                self.gradients.insert(Work {
                    stage,
                    microbatch: op.microbatch,
                });
            }
        }
        Ok(i + 1 + expected.len())
    }

    fn issue(&mut self, a2a: AllToAll, i: usize) -> Result<(), Located> {
        if self.pending.insert(a2a, i).is_some() {
            return Err((self.rank, i, A2aFault::IssuedAgain { a2a }));
        }
        Ok(())
    }

    fn wait(&mut self, a2a: AllToAll, i: usize) -> Result<(), Located> {
        match self.pending.remove(&a2a) {
            Some(_) => Ok(()),
            None => Err((self.rank, i, A2aFault::NotIssued { a2a })),
        }
    }

    /// `instr` at `i` needs `a2a` waited for, if it was issued.
    fn needs(&self, a2a: AllToAll, instr: &Instr, i: usize) -> Result<(), Located> {
        if self.pending.contains_key(&a2a) {
            let fault = A2aFault::Pending {
                a2a,
                needed_by: instr.to_string(),
            };
            return Err((self.rank, i, fault));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::cost::StageCostsSpec;
    use crate::ir::memory::StageMemory;
    use crate::spmd::project::{project, ProjectionOptions};
    use crate::testing::{placed, plan_on, problem};

    /// `orders` on `problem` with all-to-alls of half a forward, projected (receives early).
    fn projected(problem: Problem, orders: &[&str]) -> ProgramSet {
        let costs = StageCostsSpec::builder()
            .a2a(0.5)
            .build()
            .validate()
            .unwrap();
        let plan = plan_on(problem, costs, StageMemory::default(), orders);
        project(&plan, ProjectionOptions::default()).unwrap()
    }

    /// Two ranks, three microbatches: 1F1B with an overlapped pair on rank 0.
    fn fixture() -> (Problem, ProgramSet) {
        let orders = [
            "0F0 0F1 (0F2;0B0)OVERLAP_F_B 0B1 0B2",
            "1F0 1B0 1F1 1B1 1F2 1B2",
        ];
        (problem(2, 3), projected(problem(2, 3), &orders))
    }

    /// The index of the instruction written `text` in `instrs`.
    fn at(instrs: &[Instr], text: &str) -> usize {
        instrs
            .iter()
            .position(|i| i.to_string() == text)
            .unwrap_or_else(|| panic!("no {text}"))
    }

    fn a2a(phase: AllToAllPhase, stage: u32, microbatch: u32) -> AllToAll {
        AllToAll::new(Work::new(stage, microbatch), phase)
    }

    /// Rank `rank`'s program edited by `edit` fails with `expected`.
    fn check(
        (problem, set): &(Problem, ProgramSet),
        rank: usize,
        edit: impl FnOnce(&mut Vec<Instr>),
        expected: &str,
    ) {
        let mut broken = set.clone();
        edit(&mut broken.programs[rank].instrs);
        let (rank, instr, fault) = check_all_to_alls(problem, &broken).unwrap_err();
        assert_eq!(
            format!("rank {rank}, instruction {instr}: {fault}"),
            expected
        );
    }

    /// Moves the instruction written `what` to just before the one written `before`.
    fn moved(what: &'static str, before: &'static str) -> impl FnOnce(&mut Vec<Instr>) {
        move |instrs| {
            let moving = instrs.remove(at(instrs, what));
            instrs.insert(at(instrs, before), moving);
        }
    }

    /// Inserts `new` at `index` (from the end where negative).
    fn inserted(index: isize, new: Vec<Instr>) -> impl FnOnce(&mut Vec<Instr>) {
        move |instrs| {
            let at = if index < 0 {
                instrs.len() - index.unsigned_abs()
            } else {
                index.unsigned_abs()
            };
            instrs.splice(at..at, new);
        }
    }

    #[test]
    fn projected_programs_pass() {
        let (problem, set) = fixture();
        check_all_to_alls(&problem, &set).unwrap();
    }

    #[test]
    fn each_rule_broken_is_named_with_its_rank_and_instruction() {
        use AllToAllPhase::{Combine, CombineBackward, Dispatch};
        use Instr::{IssueAllToAll as Issue, WaitAllToAll as Wait};
        let f = fixture();
        let flush = f.1.programs[0].instrs.len() - 1;
        check(
            &f,
            0,
            inserted(0, vec![Issue(a2a(Dispatch, 1, 0))]),
            "rank 0, instruction 0: dispatch(stage 1, mb 0) names a stage this rank does not \
             hold or a microbatch out of range",
        );
        check(
            &f,
            0,
            inserted(0, vec![Issue(a2a(Dispatch, 0, 0))]),
            "rank 0, instruction 0: dispatch(stage 0, mb 0) runs inside its task's span, not on \
             its own",
        );
        check(
            &f,
            0,
            |instrs| instrs.swap(2, 3),
            "rank 0, instruction 2: the span of 0F0 needs issue-dispatch(stage 0, mb 0) here \
             (its all-to-alls follow its compute, in order)",
        );
        // A pair's all-to-all moved out of the pair.
        check(
            &f,
            0,
            moved("wait-combine(stage 0, mb 2)", "free-output(stage 0, mb 2)"),
            "rank 0, instruction 23: the span of (0F2;0B0)OVERLAP_F_B needs \
             wait-combine(stage 0, mb 2) here (its all-to-alls follow its compute, in order)",
        );
        // The activation sent before its combine is waited for.
        check(
            &f,
            0,
            moved("wait-combine(stage 0, mb 0)", "free-output(stage 0, mb 0)"),
            "rank 0, instruction 9: [send-act(stage 0, mb 0) to rank 1] needs combine(stage 0, \
             mb 0), which is not waited for yet",
        );
        check(
            &f,
            0,
            |instrs| instrs.drain(26..28).for_each(drop),
            "rank 0, instruction 26: 0B1 needs combine-backward(stage 0, mb 1) issued and waited \
             for before it",
        );
        check(
            &f,
            0,
            moved("wait-combine-backward(stage 0, mb 1)", "flush-weight-grads"),
            "rank 0, instruction 27: 0B1 needs combine-backward(stage 0, mb 1), which is not \
             waited for yet",
        );
        check(
            &f,
            0,
            moved(
                "issue-combine-backward(stage 0, mb 1)",
                "[send-act(stage 0, mb 2) to rank 1, recv-grad(stage 0, mb 1) from rank 1]",
            ),
            "rank 0, instruction 24: combine-backward(stage 0, mb 1) is issued before its output \
             gradient is on the rank",
        );
        check(
            &f,
            0,
            inserted(26, vec![Issue(a2a(CombineBackward, 0, 1))]),
            "rank 0, instruction 27: combine-backward(stage 0, mb 1) is issued again before its \
             earlier issue is waited for",
        );
        check(
            &f,
            0,
            inserted(9, vec![Wait(a2a(Combine, 0, 0))]),
            "rank 0, instruction 10: combine(stage 0, mb 0) is waited for but not issued",
        );
        check(
            &f,
            0,
            inserted(-1, vec![Issue(a2a(CombineBackward, 0, 2))]),
            &format!(
                "rank 0, instruction {flush}: combine-backward(stage 0, mb 2) is issued and \
                 never waited for"
            ),
        );
        let head = a2a(CombineBackward, 0, 2);
        check(
            &f,
            0,
            inserted(-1, vec![Issue(head), Wait(head)]),
            &format!(
                "rank 0, instruction {}: combine-backward(stage 0, mb 2) is waited for but no \
                 backward after it needs it",
                flush + 1
            ),
        );
        // The loss before its forward's combine is waited for.
        check(
            &f,
            1,
            moved("wait-combine(stage 1, mb 0)", "1B0"),
            "rank 1, instruction 6: loss(stage 1, mb 0) needs combine(stage 1, mb 0), which is \
             not waited for yet",
        );
    }

    #[test]
    fn a_forward_on_the_same_rank_waits_for_the_combine_before_it() {
        let two_stages = placed(1, vec![0, 0]);
        let set = projected(two_stages.clone(), &["0F0 1F0 1B0 0B0"]);
        let f = (two_stages, set);
        check_all_to_alls(&f.0, &f.1).unwrap();
        let text: Vec<String> = f.1.programs[0]
            .instrs
            .iter()
            .map(Instr::to_string)
            .collect();
        assert_eq!(
            text[..9],
            [
                "unshard(stage 0)",
                "unshard(stage 1)",
                "0F0",
                "issue-dispatch(stage 0, mb 0)",
                "wait-dispatch(stage 0, mb 0)",
                "issue-combine(stage 0, mb 0)",
                "wait-combine(stage 0, mb 0)",
                "1F0",
                "issue-dispatch(stage 1, mb 0)",
            ]
        );
        check(
            &f,
            0,
            moved("wait-combine(stage 0, mb 0)", "wait-combine(stage 1, mb 0)"),
            "rank 0, instruction 6: 1F0 needs combine(stage 0, mb 0), which is not waited for \
             yet",
        );
    }

    #[test]
    fn the_checker_reports_them_as_its_own_error() {
        let (problem, mut set) = fixture();
        set.programs[1]
            .instrs
            .retain(|i| !matches!(i, Instr::WaitAllToAll(_)));
        let err = crate::spmd::check::check_programs(&problem, &set).unwrap_err();
        assert!(matches!(
            err,
            crate::spmd::check::CommError::AllToAll { .. }
        ));
        assert_eq!(
            err.to_string(),
            "rank 1, instruction 4: the span of 1F0 needs wait-dispatch(stage 1, mb 0) here (its \
             all-to-alls follow its compute, in order)"
        );
    }
}
