//! The machinery of the relief pass ([`crate::passes::Relief`]) that `recompute` and `offload`
//! share: where a rank's memory bound breaks, which (stage, microbatch) pairs hold activations
//! there, the greedy loop that relieves the breaks ([`relieve`]), and the pass's limit, floor and
//! errors ([`target_limit`], [`floor`], [`stuck_error`]).
//!
//! The loop: find the first task, in rank order, during which a rank holds more than the limit
//! (a [`Break`], from [`held_per_task`]); the pairs whose activations are held across it (their
//! forward before it, their input-gradient backward after it, no residency task yet) are the
//! candidates ([`Window`]s), and, for a strategy that reaches them ([`Reach::WeightGrads`]: an
//! offload), the pairs whose W keeps memory across it (their I before it, their W after it). The pass's strategy proposes one rewrite per candidate with an
//! estimate of the time it costs; with one try per step (both built-in strategies) the estimates
//! decide and every break of the rank is relieved in one sweep, with more the cheapest few are
//! simulated and the fastest is kept. A relieved pair holds nothing at the break any more and no
//! task holds more than before, so breaks only disappear: the loop ends within one step per pair,
//! fitted or stuck at a break no candidate spans.
//!
//! The plan so far is never rebuilt nor replayed whole between steps: a
//! [`Retimer`] holds its orders and keeps its replay
//! and slack up to date as each step inserts into one rank's order (re-timing only what the
//! insertions reach, with the same results as a full replay), and the plan is built once at the
//! end. A step costs about what its rank's order and the tasks it delays cost, not the plan: at a
//! thousand ranks, fitting takes about as long as building the plan it starts from.
//!
//! Written against the public API of `pipeweave-core` alone, as a researcher's pass would be.

use crate::error::TransformError;
use pipeweave_core::analysis::peak::held_along;
use pipeweave_core::analysis::retime::Retimer;
use pipeweave_core::{
    held_per_task, max_peak, Facts, OpKind, Plan, Residency, Task, TimedTask, Work, TOLERANCE,
};
use std::collections::{HashMap, HashSet};

/// The workspace's one tolerance under the name `offload` imports (`passes/offload.rs`).
pub(crate) const EPSILON: f64 = TOLERANCE;

/// The first task during which a rank holds more than the limit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Break {
    /// The rank.
    pub rank: usize,
    /// The task's position in the rank's order.
    pub position: usize,
    /// What the rank holds while it runs.
    pub held: f64,
}

/// What a window's pair holds in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Span {
    /// Its activations, from its forward to its input-gradient backward.
    Activations,
    /// What its weight gradient needs, from its input-gradient backward to its W (a split
    /// backward only).
    WeightGrad,
}

/// A pair whose memory a rank holds from one of its tasks to a later one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// The pair.
    pub work: Work,
    /// Position of the task after which it is held: its forward (its input-gradient backward
    /// for [`Span::WeightGrad`]).
    pub forward: usize,
    /// Position of the task that needs it: its input-gradient backward (its W for
    /// [`Span::WeightGrad`]).
    pub backward: usize,
    /// What is held.
    pub span: Span,
}

/// Which windows a relief pass may take: activations only (a recompute), or the memory kept for
/// weight gradients too (an offload can move it out between a split backward's I and W).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Forward to input-gradient backward.
    Activations,
    /// Those, and input-gradient backward to W.
    WeightGrads,
}

/// A rewrite one candidate proposes: its estimated cost in time, what it frees and where, and
/// the tasks it inserts into the break's rank's order.
pub struct Proposal {
    /// Estimated added time (lower is better; ties keep the first).
    pub estimate: f64,
    /// The memory it frees at the break.
    pub relieves: f64,
    /// The positions of the rank's order whose tasks run with that much less held.
    pub frees: std::ops::Range<usize>,
    /// The pair it relieves.
    pub work: Work,
    /// The tasks it inserts, each before the task at its position of the rank's order as it is
    /// (see [`with_inserted`]).
    pub inserted: Vec<(usize, Task)>,
}

/// The rank and first task at which `held` (per rank, per task) exceeds `limit`; ranks in order.
pub fn first_break(held: &[Vec<f64>], limit: f64) -> Option<Break> {
    held.iter().enumerate().find_map(|(rank, tasks)| {
        let position = tasks.iter().position(|&h| h > limit + TOLERANCE)?;
        Some(Break {
            rank,
            position,
            held: tasks[position],
        })
    })
}

/// Every pair on `order` (a rank's order) with its forward's and backward's positions; with
/// [`Reach::WeightGrads`], also every pair whose split backward's I and W run apart, from the I to
/// the W. A window that already has a residency task is left out.
pub fn windows(order: &[Task], reach: Reach) -> Vec<Window> {
    let mut forward: HashMap<Work, usize> = HashMap::new();
    let mut input: HashMap<Work, usize> = HashMap::new();
    let mut managed: HashSet<(Work, Span)> = HashSet::new();
    let mut out = Vec::new();
    for (position, task) in order.iter().enumerate() {
        if task.is_residency() {
            let work = task.work();
            let span = if input.contains_key(&work) {
                Span::WeightGrad
            } else {
                Span::Activations
            };
            managed.insert((work, span));
            continue;
        }
        for op in task.ops() {
            let work = Work {
                stage: op.stage,
                microbatch: op.microbatch,
            };
            match op.kind {
                OpKind::Forward => {
                    forward.insert(work, position);
                }
                OpKind::InputGrad => {
                    if let Some(&at) = forward.get(&work) {
                        out.push(Window {
                            work,
                            forward: at,
                            backward: position,
                            span: Span::Activations,
                        });
                    }
                    input.insert(work, position);
                }
                OpKind::WeightGrad => match input.get(&work) {
                    Some(&at) if reach == Reach::WeightGrads && at < position => out.push(Window {
                        work,
                        forward: at,
                        backward: position,
                        span: Span::WeightGrad,
                    }),
                    _ => {}
                },
            }
        }
    }
    out.retain(|w| !managed.contains(&(w.work, w.span)));
    out
}

/// The windows of `order` within `reach` held across `position`.
pub fn spanning(order: &[Task], position: usize, reach: Reach) -> Vec<Window> {
    windows(order, reach)
        .into_iter()
        .filter(|w| w.forward < position && position < w.backward)
        .collect()
}

/// Where and how the loop got stuck: a break no pair can relieve.
#[derive(Clone, Debug, PartialEq)]
pub struct Stuck {
    /// The break.
    pub at: Break,
    /// The task there.
    pub task: Task,
}

/// One step of [`relieve`]: what a pass proposes its rewrites from.
pub struct Step<'a> {
    /// The plan the loop started from: its problem, costs and memory model (its orders are not
    /// the ones so far: the break's rank's is [`Step::order`]).
    pub plan: &'a Plan,
    /// The break's rank's order so far.
    pub order: &'a [Task],
    /// The break's rank's tasks with their times in a replay of the plan so far.
    pub timeline: &'a [TimedTask],
    /// The first break.
    pub at: Break,
    /// What the break's rank holds during each of its tasks.
    pub held: &'a [f64],
    /// The slack of each of the break's rank's tasks in the simulation ([`pipeweave_core::slack`]): how much a
    /// task may be delayed before the plan ends later.
    pub slack: &'a [f64],
    /// The pairs held across the break, longest-held first.
    pub candidates: &'a [Window],
    /// The limit.
    pub limit: f64,
}

impl Step<'_> {
    /// The last task of `window` (after its forward, before its backward) during which the rank
    /// holds more than the limit: the break itself at least.
    pub fn last_break_in(&self, window: &Window) -> usize {
        (window.forward + 1..window.backward)
            .rev()
            .find(|&p| self.held[p] > self.limit + TOLERANCE)
            .unwrap_or(self.at.position)
    }
}

/// Relieves `plan`'s breaks of `limit`. Per break, the proposals are ranked by estimate; where
/// one pair cannot free the excess, the cheapest that together free it are applied at once.
/// With `tries` above 1, the `tries` cheapest are simulated and the fastest is kept (only the
/// first when it is estimated to cost nothing; ties: the first proposed), one break at a time.
/// With `tries` 1, the estimates decide alone, and every break of the rank is relieved in one
/// sweep on the rank's figures before it (the proposals' positions are those of the rank's
/// order as it was), simulated once. The result fits the limit, or the loop stops at a break no
/// pair spans. The simulations are a [`Retimer`]'s: the same times and slack as a full replay.
pub fn relieve(
    plan: Plan,
    limit: f64,
    tries: usize,
    reach: Reach,
    propose: impl Fn(&Step<'_>) -> Vec<Proposal>,
) -> Result<Plan, Stuck> {
    let mut timer = Retimer::new(&plan).ok().map(Retimer::with_slack);
    let mut held = held_per_task(&plan);
    // The last break relieved, if any.
    let mut relieved: Option<Stuck> = None;
    // Ranks before a break fit, and relieving a rank changes no other rank's memory.
    let mut rank = 0;
    loop {
        let Some(at) = first_break(&held[rank..], limit).map(|b| Break {
            rank: b.rank + rank,
            ..b
        }) else {
            let (Some(timer), Some(last)) = (timer, relieved) else {
                return Ok(plan);
            };
            // Residency tasks inserted into a plan's orders keep it a plan.
            return reordered(&plan, timer.orders().to_vec()).map_err(|_| last);
        };
        rank = at.rank;
        let stuck = |order: &[Task]| Stuck {
            at,
            task: order[at.position],
        };
        let Some(timer) = timer.as_mut() else {
            return Err(stuck(&plan.orders()[at.rank]));
        };
        let slacks = timer.slack(at.rank);
        let (order, timeline) = (timer.order(at.rank), timer.timeline(at.rank));
        let options = if tries <= 1 {
            let swept = sweep(
                (&plan, order, timeline),
                &slacks,
                at,
                &held[at.rank],
                (limit, reach),
                &propose,
            );
            if swept.is_empty() {
                return Err(stuck(order));
            }
            vec![swept]
        } else {
            let all = windows(order, reach);
            let candidates = ranked_candidates(&all, at.position, &HashSet::new());
            let step = Step {
                plan: &plan,
                order,
                timeline,
                at,
                held: &held[at.rank],
                slack: &slacks,
                candidates: &candidates,
                limit,
            };
            let mut proposals = propose(&step);
            proposals.sort_by(|a, b| a.estimate.total_cmp(&b.estimate));
            options(proposals, at.held - limit, tries)
        };
        let before = stuck(timer.order(at.rank));
        let mut best: Option<(usize, f64)> = None;
        if options.len() > 1 {
            for (k, inserted) in options.iter().enumerate() {
                timer.begin();
                let makespan = insert(timer, at.rank, inserted).map(|()| timer.makespan());
                timer.rollback();
                let Ok(makespan) = makespan else { continue };
                if best.is_none_or(|(_, b)| makespan < b - TOLERANCE) {
                    best = Some((k, makespan));
                }
            }
        } else if !options.is_empty() {
            best = Some((0, 0.0));
        }
        let applied = best.and_then(|(k, _)| insert(timer, at.rank, &options[k]).ok());
        if applied.is_none() {
            return Err(before);
        }
        relieved = Some(before);
        held[at.rank] = held_along(&plan, timer.order(at.rank));
    }
}

/// Inserts `inserted` into rank `rank`'s order as [`with_inserted`] places them (positions of
/// the order as it is) and settles: what a replay of the result would say, an error where it
/// would not run.
fn insert(timer: &mut Retimer, rank: usize, inserted: &[(usize, Task)]) -> Result<(), ()> {
    // From the back, each position's tasks in reverse, so earlier positions stay put.
    for &(at, task) in sorted_insertions(inserted).iter().rev() {
        timer.insert(rank, at, task).map_err(|_| ())?;
    }
    timer.settle().map_err(|_| ())
}

/// The windows of `all` (a rank's, [`windows`]) held across `position`, leaving out `taken`
/// pairs, longest-held first.
fn ranked_candidates(all: &[Window], position: usize, taken: &HashSet<Work>) -> Vec<Window> {
    let mut candidates: Vec<Window> = all
        .iter()
        .filter(|w| w.forward < position && position < w.backward && !taken.contains(&w.work))
        .copied()
        .collect();
    candidates.sort_by_key(|w| std::cmp::Reverse(w.backward - w.forward));
    candidates
}

/// Every break of the rank of `at`, from `at` on, relieved by the cheapest estimates on the
/// rank's figures before any of them (`held`, updated by what each choice frees): the tasks to
/// insert, with positions of the rank's order as it is; empty when the first break has no
/// candidate.
fn sweep(
    (plan, order, timeline): (&Plan, &[Task], &[TimedTask]),
    slack: &[f64],
    first: Break,
    held: &[f64],
    (limit, reach): (f64, Reach),
    propose: &impl Fn(&Step<'_>) -> Vec<Proposal>,
) -> Vec<(usize, Task)> {
    // The order does not change during the sweep: its windows are found once.
    let all = windows(order, reach);
    let mut held = held.to_vec();
    let mut taken: HashSet<Work> = HashSet::new();
    let mut inserted = Vec::new();
    let mut at = first;
    loop {
        let candidates = ranked_candidates(&all, at.position, &taken);
        let step = Step {
            plan,
            order,
            timeline,
            at,
            held: &held,
            slack,
            candidates: &candidates,
            limit,
        };
        let mut proposals = propose(&step);
        proposals.sort_by(|a, b| a.estimate.total_cmp(&b.estimate));
        let mut excess = at.held - limit;
        for proposal in proposals {
            if excess <= TOLERANCE {
                break;
            }
            excess -= proposal.relieves;
            for k in proposal.frees.clone() {
                held[k] -= proposal.relieves;
            }
            taken.insert(proposal.work);
            inserted.extend(proposal.inserted);
        }
        if excess > TOLERANCE {
            // This break cannot be relieved: apply what was chosen; the next round stops here.
            return inserted;
        }
        let next = held
            .iter()
            .enumerate()
            .skip(at.position)
            .find(|(_, &h)| h > limit + TOLERANCE);
        match next {
            Some((position, &h)) => {
                at = Break {
                    rank: first.rank,
                    position,
                    held: h,
                }
            }
            None => return inserted,
        }
    }
}

/// What one step tries, from proposals ranked by estimate and the memory to free: the cheapest
/// that together free it (when one is not enough), else the few cheapest alone.
fn options(proposals: Vec<Proposal>, excess: f64, tries: usize) -> Vec<Vec<(usize, Task)>> {
    let mut freed = 0.0;
    let needed = proposals
        .iter()
        .position(|p| {
            freed += p.relieves;
            freed >= excess - TOLERANCE
        })
        .map_or(proposals.len(), |k| k + 1);
    if needed > 1 {
        return vec![proposals
            .into_iter()
            .take(needed)
            .flat_map(|p| p.inserted)
            .collect()];
    }
    let free = proposals.first().is_some_and(|p| p.estimate <= TOLERANCE);
    let tried = if free { 1 } else { tries.max(1) };
    proposals
        .into_iter()
        .take(tried)
        .map(|p| p.inserted)
        .collect()
}

/// The limit a relief pass fits: its `memory` argument or the plan's declared limit, the lower
/// of the two; an error when there is neither.
pub fn target_limit(memory: Option<f64>, plan: &Plan) -> Result<f64, TransformError> {
    match (memory, plan.memory_limit()) {
        (Some(m), Some(l)) => Ok(m.min(l)),
        (Some(limit), None) | (None, Some(limit)) => Ok(limit),
        (None, None) => Err(TransformError::unmet(
            "a memory limit",
            "give memory=N (activations of one microbatch of a rank's share) or --memory-limit",
        )),
    }
}

/// `plan` with new orders and the residency fact they hold.
pub fn reordered(plan: &Plan, orders: Vec<Vec<Task>>) -> Result<Plan, TransformError> {
    let facts = Facts {
        residency: Residency::of_orders(&orders),
        ..plan.facts()
    };
    plan.clone()
        .reshaped(None, orders, facts)
        .map_err(|e| TransformError::core("", e))
}

/// The peak of `plan` with every pair that has no residency task relieved as `relieve_all` says
/// over its windows within `reach` (the tasks it inserts into the pair's rank's order): the least
/// a relief pass can reach.
pub fn floor(
    plan: &Plan,
    reach: Reach,
    relieve_all: impl Fn(&Window) -> Vec<(usize, Task)>,
) -> f64 {
    let orders = plan
        .orders()
        .iter()
        .map(|order| {
            let inserted: Vec<(usize, Task)> = windows(order, reach)
                .iter()
                .flat_map(&relieve_all)
                .collect();
            with_inserted(order, &inserted)
        })
        .collect();
    reordered(plan, orders).map_or(f64::INFINITY, |p| max_peak(&p))
}

/// The error of a relief pass stuck at `stuck`, naming the least it can reach: `how` is what
/// the pass does to a pair (`recomputed`, `offloaded`).
pub fn stuck_error(
    how: &str,
    reach: Reach,
    limit: f64,
    stuck: &Stuck,
    least: f64,
) -> TransformError {
    let held_there = match reach {
        Reach::Activations => "belongs to a running forward, or is kept for a weight gradient",
        Reach::WeightGrads => {
            "belongs to the running task, or to a pair whose backward runs whole or already has \
             a residency task"
        }
    };
    TransformError::unmet(
        &format!("memory={limit} reachable with pairs {how}"),
        format!(
            "rank {} holds {:.4} while it runs {} (task {}), and no pair held across it can be \
             {how} (what is held there {held_there}); with every pair it may take {how}, this \
             plan still needs {:.4}",
            stuck.at.rank, stuck.at.held, stuck.task, stuck.at.position, least
        ),
    )
}

/// `order` with `inserted` tasks put before the tasks at the given positions (a position equal
/// to the order's length appends); at one position, the tasks that free memory (offloads) before
/// those that allocate (reloads, recomputes), each group in its given order.
pub fn with_inserted(order: &[Task], inserted: &[(usize, Task)]) -> Vec<Task> {
    let sorted = sorted_insertions(inserted);
    let mut out = Vec::with_capacity(order.len() + inserted.len());
    let mut next = sorted.iter().peekable();
    for (position, &task) in order.iter().enumerate() {
        while let Some(&(_, extra)) = next.next_if(|(at, _)| *at == position) {
            out.push(extra);
        }
        out.push(task);
    }
    out.extend(next.map(|&(_, t)| t));
    out
}

/// `inserted` in the order [`with_inserted`] puts them in: by position, and at one position the
/// tasks that free memory before those that allocate, each group in its given order.
fn sorted_insertions(inserted: &[(usize, Task)]) -> Vec<(usize, Task)> {
    let mut sorted = inserted.to_vec();
    sorted.sort_by_key(|&(at, task)| (at, task.allocates()));
    sorted
}

/// When the compute before position `position` of a rank's timeline ends (0 when none does):
/// when a task placed there could start, and a transfer placed there is issued.
pub fn issued_at(timeline: &[TimedTask], position: usize) -> f64 {
    timeline[..position.min(timeline.len())]
        .iter()
        .rev()
        .find(|t| !t.task.on_link())
        .map_or(0.0, |t| t.end)
}

/// The idle time right before the task at `position` of a rank's timeline: how long the rank
/// waits between the end of the compute before it and its start (0 for the first task).
pub fn idle_before(timeline: &[TimedTask], position: usize) -> f64 {
    let Some(task) = timeline.get(position) else {
        return 0.0;
    };
    (task.start - issued_at(timeline, position)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::tasks;

    #[test]
    fn windows_span_from_forward_to_input_gradient_and_from_there_to_w() {
        let order = tasks("0F0 0F1 0I0 0F2 0W0 0B1 0R2 0B2");
        let found = |reach| -> Vec<(String, usize, usize, Span)> {
            windows(&order, reach)
                .iter()
                .map(|w| {
                    let forward = w.work.op(OpKind::Forward).to_string();
                    (forward, w.forward, w.backward, w.span)
                })
                .collect()
        };
        // Pair 2 has a recompute already (before its backward).
        let activations = [
            ("0F0".to_string(), 0, 2, Span::Activations),
            ("0F1".to_string(), 1, 5, Span::Activations),
        ];
        assert_eq!(found(Reach::Activations), activations);
        // Pair 0's I and W run apart (positions 2 and 4); pair 1's B runs both at once.
        let mut with_weights = activations.to_vec();
        with_weights.insert(1, ("0F0".to_string(), 2, 4, Span::WeightGrad));
        assert_eq!(found(Reach::WeightGrads), with_weights);
        let across = |reach| -> Vec<usize> {
            let spans = spanning(&order, 3, reach);
            spans.iter().map(|w| w.forward).collect()
        };
        assert_eq!(across(Reach::Activations), [1]);
        assert_eq!(across(Reach::WeightGrads), [2, 1]);
    }

    #[test]
    fn breaks_and_insertions() {
        let held = vec![vec![1.0, 2.0], vec![1.0, 3.0, 3.5]];
        assert_eq!(
            first_break(&held, 2.5),
            Some(Break {
                rank: 1,
                position: 1,
                held: 3.0
            })
        );
        assert_eq!(first_break(&held, 4.0), None);
        let order = tasks("0F0 0F1 0B0 0B1");
        let r: Task = "0R1".parse().unwrap();
        let o: Task = "0OFFLOAD0".parse().unwrap();
        let l: Task = "0RELOAD1".parse().unwrap();
        let out = with_inserted(&order, &[(3, r), (1, o), (4, o), (1, l), (1, o)]);
        let text: Vec<String> = out.iter().map(Task::to_string).collect();
        assert_eq!(
            text,
            [
                "0F0",
                "0OFFLOAD0",
                "0OFFLOAD0",
                "0RELOAD1",
                "0F1",
                "0B0",
                "0R1",
                "0B1",
                "0OFFLOAD0"
            ]
        );
    }
}

#[cfg(test)]
mod trials {
    //! The relief loop against the loop as it was before the retimer, which built and simulated
    //! every candidate plan whole: the same plans, with one try per step and with several.

    use super::*;
    use crate::builtins::compile_expression;
    use pipeweave_core::testing::unscheduled_with_latency;
    use pipeweave_core::{simulate, slack, StageCostsSpec};

    /// A recompute of `window`'s pair before its backward, estimated by what it adds beyond the
    /// idle time there and the backward's slack (as `recompute` estimates it).
    fn recompute(step: &Step<'_>, window: &Window) -> Proposal {
        let task = match window.span {
            Span::Activations => Task::Recompute(window.work),
            Span::WeightGrad => Task::RecomputeWeightGrad(window.work),
        };
        let idle = idle_before(step.timeline, window.backward);
        let delay = (step.plan.costs().task_duration(&task) - idle).max(0.0);
        Proposal {
            estimate: (delay - step.slack[window.backward]).max(0.0),
            relieves: 1.0,
            frees: window.forward + 1..window.backward,
            work: window.work,
            inserted: vec![(window.backward, task)],
        }
    }

    /// An offload of `window`'s pair after its forward, reloaded after the window's last break,
    /// estimated by how late the reload would end for its backward.
    fn offload(step: &Step<'_>, window: &Window) -> Proposal {
        let transfer = step.plan.costs().task_duration(&Task::Offload(window.work));
        let reload_at = step.last_break_in(window) + 1;
        let issued = issued_at(step.timeline, reload_at);
        let backward = step.timeline[window.backward].start;
        let late = issued + transfer - backward - step.slack[window.backward];
        Proposal {
            estimate: late.max(0.0),
            relieves: 1.0,
            frees: window.forward + 1..reload_at,
            work: window.work,
            inserted: vec![
                (window.forward + 1, Task::Offload(window.work)),
                (reload_at, Task::Reload(window.work)),
            ],
        }
    }

    /// [`relieve`] replaying the whole plan for every figure it reads.
    fn replayed(
        mut plan: Plan,
        limit: f64,
        (tries, reach): (usize, Reach),
        propose: impl Fn(&Step<'_>) -> Vec<Proposal>,
    ) -> Option<Plan> {
        let base = plan.clone();
        loop {
            let held = held_per_task(&plan);
            let Some(at) = first_break(&held, limit) else {
                return Some(plan);
            };
            let sim = simulate(&plan).ok()?;
            let slacks = slack(&plan, &sim);
            let order = &plan.orders()[at.rank];
            let timeline = &sim.timeline()[at.rank];
            let options = if tries <= 1 {
                let swept = sweep(
                    (&base, order, timeline),
                    &slacks[at.rank],
                    at,
                    &held[at.rank],
                    (limit, reach),
                    &propose,
                );
                vec![swept].into_iter().filter(|s| !s.is_empty()).collect()
            } else {
                let all = windows(order, reach);
                let candidates = ranked_candidates(&all, at.position, &HashSet::new());
                let step = Step {
                    plan: &base,
                    order,
                    timeline,
                    at,
                    held: &held[at.rank],
                    slack: &slacks[at.rank],
                    candidates: &candidates,
                    limit,
                };
                let mut proposals = propose(&step);
                proposals.sort_by(|a, b| a.estimate.total_cmp(&b.estimate));
                options(proposals, at.held - limit, tries)
            };
            let mut best: Option<(Plan, f64)> = None;
            for inserted in options {
                let mut orders = plan.orders().to_vec();
                orders[at.rank] = with_inserted(order, &inserted);
                let candidate = reordered(&plan, orders).ok()?;
                let makespan = simulate(&candidate).ok()?.makespan();
                if best.as_ref().is_none_or(|(_, b)| makespan < b - TOLERANCE) {
                    best = Some((candidate, makespan));
                }
            }
            plan = best?.0;
        }
    }

    fn check(
        strategy: fn(&Step<'_>, &Window) -> Proposal,
        expression: &str,
        limit: f64,
        comm: f64,
    ) {
        let costs = StageCostsSpec::builder()
            .input_grad(0.8)
            .weight_grad(1.2)
            .offload(0.6)
            .build()
            .validate()
            .unwrap();
        let plan = compile_expression(expression)
            .unwrap()
            .run(unscheduled_with_latency(4, 10, costs, comm))
            .unwrap();
        for tries in [1, 3] {
            for reach in [Reach::Activations, Reach::WeightGrads] {
                let propose = |step: &Step<'_>| -> Vec<Proposal> {
                    let each = |window| strategy(step, window);
                    step.candidates.iter().map(each).collect()
                };
                let fitted = relieve(plan.clone(), limit, tries, reach, propose);
                let expected = replayed(plan.clone(), limit, (tries, reach), propose);
                let what = format!("{expression} at {limit}, {tries} tries, {reach:?}");
                match (fitted, expected) {
                    (Ok(a), Some(b)) => assert_eq!(a.orders(), b.orders(), "{what}"),
                    (Err(_), None) => {}
                    (a, b) => panic!("{what}: {:?} against {:?}", a.is_ok(), b.is_some()),
                }
            }
        }
    }

    #[test]
    fn every_step_sees_what_a_whole_replay_shows() {
        for (expression, limit) in [
            ("f1b(gpipe)", 2.0),
            ("zero_bubble(f1b(gpipe), policy=h1)", 2.0),
            ("vpp(f1b(gpipe), chunks=2)", 1.5),
        ] {
            for comm in [0.0, 0.3] {
                check(recompute, expression, limit, comm);
                check(offload, expression, limit, comm);
            }
        }
    }
}
