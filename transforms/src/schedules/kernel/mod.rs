//! The one list-scheduling kernel: a [`Timeline`] (per-rank clocks, op ends, memory, latency),
//! an [`Agenda`] (the one event heap), and [`run`], the event loop that asks a [`ChoiceRule`]
//! which ready task a rank runs next.
//!
//! The loop: every rank is asked at time 0. The earliest live entry of the agenda comes next (then
//! the lower rank); the rule answers for that rank at that time:
//! - [`Decision::Run`]: a task from a start at or after now; at once if it starts now, else the
//!   decision waits in the agenda until its start and is dropped if the rank is woken before;
//! - [`Decision::At`]: nothing now, ask again at a known time;
//! - [`Decision::Wait`]: nothing known, ask again when woken;
//! - [`Decision::GiveUp`]: the run cannot succeed (a bound is beaten, memory is exhausted).
//!
//! A task that runs is committed by the rule ([`ChoiceRule::commit`] turns the decision into the
//! task and takes it off the rule's queues), placed on the timeline for the plan's duration, and
//! reported back ([`ChoiceRule::ran`]), which names the ranks its results reach and when; those
//! ranks are woken (a rank already asked no later keeps its ask; a decided run is reconsidered),
//! and the rank that ran is asked again when it is free. An [`ChoiceRule::EAGER`] rule decides
//! for the ranks a task touched (and the rank that ran it) right after it ran, and each decision
//! waits in the agenda for its start (the earliest start first, then the lower rank). Because the agenda is processed in time
//! order, when a rank is asked at `t` every task that started before `t` has run, so every result
//! that can reach it by then is known.
//!
//! The rules built on it: [`super::greedy`] (the list scheduler behind `zero_bubble(policy=auto)`)
//! and [`super::counterflow`] (DualPipe's two routes below DeepSeek's sizes). The round-based
//! generators, [`super::zbv_auto`] (sail-sg's ZB-V search) and [`super::controllable`] (V-Half,
//! V-Min), place ops in their generators' own order rather than in time order; they use the same
//! [`Timeline`] and [`Agenda`] for their timing, memory and event order.

pub mod agenda;
pub mod timeline;

pub use agenda::{Agenda, Time};
pub use timeline::{activation, largest_activation, Timeline};

use pipeweave_core::Task;

/// What a rank does when asked.
#[derive(Clone, Copy, Debug)]
pub enum Decision<C> {
    /// Run the rule's choice `choice` from `start` (at or after the time asked).
    Run {
        /// When it starts.
        start: f64,
        /// The rule's own description of the task, committed when it runs.
        choice: C,
    },
    /// Nothing now; ask again at this time.
    At(f64),
    /// Nothing known; ask again when woken.
    Wait,
    /// The run cannot succeed.
    GiveUp,
}

/// Which ready task a rank runs next.
pub trait ChoiceRule {
    /// What the rule decides and later commits.
    type Choice: Copy;

    /// Whether the ranks a task's results reach decide again at once (their decisions then wait
    /// in the agenda for their starts), rather than when the agenda reaches them: for a rule
    /// whose decisions do not depend on the time they are asked at, only on what has run.
    const EAGER: bool = false;

    /// What `rank` does at `now` (the timeline says what has run and when the rank is free).
    fn decide(&mut self, timeline: &Timeline<'_>, rank: usize, now: f64) -> Decision<Self::Choice>;

    /// The task of a decision that runs now, taken off the rule's queues; None to drop it.
    fn commit(&mut self, rank: usize, choice: Self::Choice) -> Option<Task>;

    /// How long `task` runs: the plan's duration of it, unless the rule already knows.
    fn duration(&self, timeline: &Timeline<'_>, task: &Task) -> f64 {
        timeline.plan().costs().task_duration(task)
    }

    /// Book-keeping after a task ran (`placed`, already on the timeline): pushes onto `wake` the
    /// ranks to ask again, with when (at its start at the earliest). False gives the run up.
    fn ran(&mut self, timeline: &Timeline<'_>, placed: Placed, wake: &mut Wakes) -> bool;
}

/// A task the loop placed on the timeline: its rank, and when it runs.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    /// The rank that ran it.
    pub rank: usize,
    /// The task.
    pub task: Task,
    /// When it started.
    pub start: f64,
    /// When it ended.
    pub end: f64,
}

/// The ranks a rule asks the loop to ask again, each with when.
pub type Wakes = Vec<(usize, f64)>;

/// A rank's live entry in the agenda: an ask, or a decided run waiting for its start.
#[derive(Clone, Copy, Debug)]
enum Entry<C> {
    Ask(f64),
    Run(C),
}

/// The agenda and each rank's live entry in it.
struct Pending<C> {
    agenda: Agenda<Time>,
    live: Vec<Option<Entry<C>>>,
}

impl<C: Copy> Pending<C> {
    /// Ask `rank` at `at`.
    fn ask(&mut self, rank: usize, at: f64) {
        self.agenda.push_for(Time(at), rank);
        self.live[rank] = Some(Entry::Ask(at));
    }

    /// Files `decision`, made for `rank`; false when it gives the run up.
    fn file(&mut self, rank: usize, decision: Decision<C>) -> bool {
        match decision {
            Decision::Run { start, choice } => {
                self.agenda.push_for(Time(start), rank);
                self.live[rank] = Some(Entry::Run(choice));
            }
            Decision::At(at) => self.ask(rank, at),
            Decision::Wait => {
                self.agenda.cancel(rank);
                self.live[rank] = None;
            }
            Decision::GiveUp => return false,
        }
        true
    }
}

/// Runs `rule` on `timeline` until no rank has anything left to decide; None when the rule gave
/// up. The timeline then holds every task placed; whether that is every op is the rule's to say.
pub fn run<'p, R: ChoiceRule>(mut timeline: Timeline<'p>, rule: &mut R) -> Option<Timeline<'p>> {
    let ranks = timeline.ranks();
    let mut pending = Pending {
        agenda: Agenda::new(ranks),
        live: vec![None; ranks],
    };
    for r in 0..ranks {
        if R::EAGER {
            let decision = rule.decide(&timeline, r, 0.0);
            if !pending.file(r, decision) {
                return None;
            }
        } else {
            pending.ask(r, 0.0);
        }
    }
    let mut wake = Vec::new();
    while let Some((Time(now), r)) = pending.agenda.pop_current() {
        let (start, choice) = match pending.live[r].take() {
            Some(Entry::Run(choice)) => (now, choice),
            Some(Entry::Ask(_)) | None => match rule.decide(&timeline, r, now) {
                Decision::Run { start, choice } if start > now => {
                    pending.file(r, Decision::Run { start, choice });
                    continue;
                }
                Decision::Run { start, choice } => (start, choice),
                other => {
                    if !pending.file(r, other) {
                        return None;
                    }
                    continue;
                }
            },
        };
        let Some(task) = rule.commit(r, choice) else {
            continue;
        };
        let start = start.max(timeline.free(r));
        let duration = rule.duration(&timeline, &task);
        let end = timeline.place(r, task, start, duration);
        wake.clear();
        let placed = Placed {
            rank: r,
            task,
            start,
            end,
        };
        if !rule.ran(&timeline, placed, &mut wake) {
            return None;
        }
        if R::EAGER {
            wake.push((r, start));
            wake.sort_unstable_by_key(|&(q, _)| q);
            wake.dedup_by_key(|&mut (q, _)| q);
            for &(q, _) in &wake {
                if q < ranks {
                    let decision = rule.decide(&timeline, q, start);
                    if !pending.file(q, decision) {
                        return None;
                    }
                }
            }
            continue;
        }
        pending.ask(r, end);
        for &(q, at) in &wake {
            if q == r || q >= ranks {
                continue;
            }
            let at = at.max(timeline.free(q));
            let keep = matches!(pending.live[q], Some(Entry::Ask(asked)) if asked <= at);
            if !keep {
                pending.ask(q, at);
            }
        }
    }
    Some(timeline)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile_expression;
    use pipeweave_core::testing::{costs, unscheduled_with_latency};
    use pipeweave_core::{simulate, Plan};

    /// Runs each rank's order of the plan as given, every task as early as it can start.
    struct InOrder<'a> {
        plan: &'a Plan,
        next: Vec<usize>,
    }

    impl ChoiceRule for InOrder<'_> {
        type Choice = Task;

        fn decide(&mut self, timeline: &Timeline<'_>, r: usize, _now: f64) -> Decision<Task> {
            let Some(&task) = self.plan.orders()[r].get(self.next[r]) else {
                return Decision::Wait;
            };
            match timeline.ready(&task) {
                Some(ready) => Decision::Run {
                    start: ready.max(timeline.free(r)),
                    choice: task,
                },
                None => Decision::Wait,
            }
        }

        fn commit(&mut self, r: usize, task: Task) -> Option<Task> {
            self.next[r] += 1;
            Some(task)
        }

        fn ran(&mut self, timeline: &Timeline<'_>, placed: Placed, wake: &mut Wakes) -> bool {
            // Any rank may have waited for this task's results.
            wake.extend((0..timeline.ranks()).map(|q| (q, placed.start)));
            true
        }
    }

    fn plan(expression: &str, ranks: u32, microbatches: u32, comm: f64) -> Plan {
        let unscheduled =
            unscheduled_with_latency(ranks, microbatches, costs(1.0, 1.5, 0.75), comm);
        compile_expression(expression)
            .expect("a known expression")
            .run(unscheduled)
            .expect("the passes apply")
    }

    #[test]
    fn the_loop_times_a_plan_s_own_orders_as_the_simulator_does() {
        for expression in [
            "f1b(gpipe)",
            "zero_bubble(f1b(gpipe), policy=h1)",
            "vpp(f1b(gpipe), chunks=2)",
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
            "dual(f1b(gpipe))",
        ] {
            for (ranks, microbatches, comm) in [(2, 3, 0.0), (4, 8, 0.25), (4, 5, 1.0)] {
                let plan = plan(expression, ranks, microbatches, comm);
                let rule = &mut InOrder {
                    plan: &plan,
                    next: vec![0; ranks as usize],
                };
                let timeline = run(Timeline::new(&plan), rule).expect("in order never gives up");
                let (_, makespan) = timeline.spans();
                let simulated = simulate(&plan).expect("the plan runs").makespan();
                assert!(
                    (makespan - simulated).abs() < 1e-9,
                    "{expression} at {ranks} x {microbatches}, comm {comm}: \
                     {makespan} against {simulated}"
                );
                assert_eq!(timeline.into_orders(), plan.orders());
            }
        }
    }
}
