//! How much of a step's all-to-all time (a mixture of experts', see [`crate::ir::all_to_all`])
//! runs under computes and how much the computes wait for, from a simulated timeline.
//!
//! Per task: the part of its in-span all-to-alls that runs under the other half of an overlapped
//! pair is hidden, the rest exposed; its head (before its compute) and tail (after it) are hidden
//! where they overlap the rank's other tasks, exposed where the rank has nothing to run beside
//! them. The makespan with each pair's halves in turn is the simulator's
//! ([`crate::analysis::simulate::sequential_pairs_makespan`]).

use crate::analysis::replay::TimedTask;
use crate::ir::op::Task;
use crate::ir::plan::Plan;

/// The all-to-all figures of one simulated step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct A2aFigures {
    /// Every all-to-all of the step, summed over ranks.
    pub total: f64,
    /// The part that runs under a compute of its rank.
    pub hidden: f64,
    /// The part the computes wait for (`total - hidden`).
    pub exposed: f64,
    /// The share of forwards and backwards that run in overlapped F&B pairs.
    pub paired_ops: f64,
}

impl A2aFigures {
    /// The share of the step's all-to-all time that is hidden (0 without any).
    pub fn hidden_fraction(&self) -> f64 {
        if self.total > 0.0 {
            self.hidden / self.total
        } else {
            0.0
        }
    }
}

/// The figures of `plan` run along `timeline`; None where its costs have no all-to-all.
pub fn a2a_figures(plan: &Plan, timeline: &[Vec<TimedTask>]) -> Option<A2aFigures> {
    let costs = plan.costs();
    if !costs.has_a2a() {
        return None;
    }
    let mut figures = A2aFigures::default();
    let (mut paired, mut computes) = (0usize, 0usize);
    for tasks in timeline {
        let computes_here: Vec<&TimedTask> = tasks.iter().filter(|t| !t.task.on_link()).collect();
        for (k, timed) in computes_here.iter().enumerate() {
            let phases = costs.a2a_phases(&timed.task);
            match timed.task {
                Task::Overlapped { .. } => {
                    paired += 2;
                    computes += 2;
                }
                Task::Forward(_) | Task::Backward(_) | Task::InputGrad(_) => computes += 1,
                _ => {}
            }
            figures.total += phases.total();
            figures.hidden += phases.inside - phases.inside_exposed;
            let head = (timed.start - phases.head, timed.start);
            figures.hidden += covered(head, computes_here[..k].iter().rev(), |o| o.end <= head.0);
            let tail = (timed.end, timed.end + phases.tail);
            figures.hidden += covered(tail, computes_here[k + 1..].iter(), |o| o.start >= tail.1);
        }
    }
    figures.exposed = (figures.total - figures.hidden).max(0.0);
    figures.paired_ops = if computes > 0 {
        paired as f64 / computes as f64
    } else {
        0.0
    };
    Some(figures)
}

/// How much of `(from, to)` the tasks `others` cover, walked outwards from the interval until
/// one is `past` it (a rank's tasks do not overlap one another).
fn covered<'a>(
    (from, to): (f64, f64),
    others: impl Iterator<Item = &'a &'a TimedTask>,
    past: impl Fn(&TimedTask) -> bool,
) -> f64 {
    let mut sum = 0.0;
    for other in others {
        if past(other) {
            break;
        }
        sum += (other.end.min(to) - other.start.max(from)).max(0.0);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::op::Work;

    #[test]
    fn gpipe_hides_each_forward_s_combine_under_the_next_forward() {
        use crate::ir::cost::{CostModel, StageCostsSpec};
        use crate::ir::memory::StageMemory;
        use crate::testing::{costs, plan_on, problem};
        let plan = plan_on(
            problem(2, 3),
            costs(1.0, 1.0, 1.0),
            StageMemory::default(),
            &["0F0 0F1 0F2 0B2 0B1 0B0", "1F0 1F1 1F2 1B2 1B1 1B0"],
        );
        let plain = crate::simulate(&plan).unwrap().makespan();
        let a2a = StageCostsSpec::builder()
            .a2a(0.5)
            .build()
            .validate()
            .unwrap();
        let moe = plan
            .clone()
            .reshaped(
                Some((
                    plan.problem().clone(),
                    CostModel::uniform(2, a2a, 0.0).unwrap(),
                    plan.memory().clone(),
                )),
                plan.orders().to_vec(),
                plan.facts(),
            )
            .unwrap();
        let sim = crate::simulate(&moe).unwrap();
        let figures = sim.a2a().unwrap();
        // 2 ranks x 3 microbatches x a forward and a backward of 0.5.
        assert!((figures.total - 6.0).abs() < 1e-9, "{figures:?}");
        assert!((figures.hidden + figures.exposed - figures.total).abs() < 1e-9);
        // The first rank's combines of F0 and F1 run under its next forward.
        assert!(figures.hidden >= 0.5 - 1e-9, "{figures:?}");
        assert!(sim.makespan() > plain);
        assert_eq!(figures.paired_ops, 0.0);
        assert!(crate::simulate(&plan).unwrap().a2a().is_none());
    }

    #[test]
    fn an_interval_is_covered_by_the_tasks_beside_it() {
        let task = |start, end| TimedTask {
            task: Task::WeightGrad(Work::new(0, 0)),
            start,
            end,
            sequence: 0,
        };
        let before = [task(0.0, 1.0), task(1.5, 2.0)];
        let refs: Vec<&TimedTask> = before.iter().collect();
        // A head of 1 before 2.2: 0.5 of the task at 1.5..2.0 (nearest first), none of 0..1.
        let head = covered((1.2, 2.2), refs.iter().rev(), |o| o.end <= 1.2);
        assert!((head - 0.5).abs() < 1e-12);
        let after = [task(3.0, 4.0), task(4.0, 6.0)];
        let refs: Vec<&TimedTask> = after.iter().collect();
        let tail = covered((2.5, 4.5), refs.iter(), |o| o.start >= 4.5);
        assert!((tail - 1.5).abs() < 1e-12);
    }
}
