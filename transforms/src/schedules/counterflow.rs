//! Counter-flow 1F1B: the order of DualPipe's two-route layout at the sizes DeepSeek's phases do
//! not cover (fewer than `2P` microbatches, an odd count, or an odd rank count).
//!
//! Every stage (a *lane*) runs its route's 1F1B: forwards and backwards each in microbatch order,
//! at most `w + 1` forwards in flight, `w` its warm-up. On DualPipe's layout a rank holds one
//! stage of each route, so it holds two lanes, flowing in opposite directions. A list scheduler
//! interleaves them: time advances to the earliest moment at which some rank can start a step of
//! one of its lanes (every result that could reach that rank by then is already known), and that
//! rank starts the step that can start first, ties broken by the variant's preference. A rank never
//! waits for one lane while another lane's step is ready, so the two routes delay each other but do
//! not block each other. A forward that would take the rank past the memory budget waits (a
//! queued W runs instead when there is one); a budget too tight for a variant's pacing can stall
//! it, and that variant gives no order.
//!
//! Variants:
//! - warm-up `w` at position `q` of an `L`-stage route with `n` microbatches: 1F1B's
//!   `min(n, L - 1 - q)`, twice that, or `n` (a fill-drain route);
//! - strict (1F1B's alternation: the next forward while the warm-up allows one, else the next
//!   backward) or free (whichever of the two is ready first);
//! - on a tie, backward first or forward first;
//! - `overlap`: a ready forward of one lane and a ready backward of another start together as one
//!   overlapped F&B (DeepSeek's pairing; it pays when `FB < F + B`);
//! - weight gradients (zero bubble only): fused into whole backwards, or deferred (a backward runs
//!   its input-gradient half, its W waits in a FIFO and runs in a wait, either always or only when
//!   it ends before the next step could start, when memory blocks a forward, and at the end).
//!
//! [`best`] runs every variant, simulates each result, keeps those within a makespan bound and the
//! memory limit, improves the best few by critical-path swaps ([`refine`]) and returns the best by
//! [`Score`](super::score::Score) (then the lower peak, then the earlier variant). The scheduler reads only the plan's
//! routes, placement, costs and memory, so it takes any layout; `dual` uses it on DualPipe's.

use crate::schedules::greedy::FillWaits;
use crate::schedules::refine::refine;
use crate::schedules::score::{refine_budget, Scored};
use pipeweave_core::ir::problem::Route;
use pipeweave_core::{Backwards, Facts, MicrobatchId, Op, OpKind, Plan, StageId, Task, Work};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Differences below this are floating-point noise.
const EPSILON: f64 = 1e-9;

/// How many forwards a stage runs before its first backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warmup {
    /// 1F1B's `L - 1 - q` at position `q` of an `L`-stage route.
    OneForwardOneBackward,
    /// Twice 1F1B's.
    Double,
    /// Every microbatch of the route (fill-drain per route).
    Full,
}

/// Which head a rank starts when two can start at the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prefer {
    /// A backward before a forward.
    Backward,
    /// A forward before a backward.
    Forward,
}

/// How weight gradients run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Weights {
    /// Inside whole backwards.
    Fused,
    /// Split off and queued; queued Ws fill waits as `FillWaits` says, and the end.
    Deferred(FillWaits),
}

/// One variant of the counter-flow scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Warm-up depth.
    pub warmup: Warmup,
    /// Tie preference.
    pub prefer: Prefer,
    /// Let each stage run its next forward or its next backward, whichever is ready first,
    /// within the warm-up's number of forwards in flight (rather than 1F1B's strict alternation).
    pub free: bool,
    /// Pair a ready forward and a ready backward of different stages into one overlapped F&B.
    pub overlap: bool,
    /// Weight-gradient handling.
    pub weights: Weights,
}

/// Every variant, in trial order (1F1B's warm-up first: at equal score the earlier one wins).
/// With `split`, deferred weight gradients too.
pub fn variants(split: bool) -> Vec<Variant> {
    let weights: &[Weights] = if split {
        &[
            Weights::Fused,
            Weights::Deferred(FillWaits::IfTheyFit),
            Weights::Deferred(FillWaits::Always),
        ]
    } else {
        &[Weights::Fused]
    };
    let mut out = Vec::new();
    for warmup in [Warmup::OneForwardOneBackward, Warmup::Double, Warmup::Full] {
        for free in [false, true] {
            for prefer in [Prefer::Backward, Prefer::Forward] {
                for overlap in [false, true] {
                    for &weights in weights {
                        out.push(Variant {
                            warmup,
                            free,
                            prefer,
                            overlap,
                            weights,
                        });
                    }
                }
            }
        }
    }
    out
}

/// One step of a stage's sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Forward(MicrobatchId),
    Backward(MicrobatchId),
}

impl Step {
    fn microbatch(self) -> MicrobatchId {
        match self {
            Step::Forward(m) | Step::Backward(m) => m,
        }
    }
}

/// How many forwards the stage at `position` of `route` runs before its first backward.
fn warm_count(route: &Route, position: usize, warmup: Warmup) -> u32 {
    let n = route.end().get() - route.first().get();
    let depth = (route.stages().len() - 1 - position) as u32;
    match warmup {
        Warmup::OneForwardOneBackward => depth,
        Warmup::Double => 2 * depth,
        Warmup::Full => n,
    }
    .min(n)
}

/// One stage's share of its route on its rank: forwards and backwards each in microbatch order,
/// paced by its warm-up.
struct Lane {
    stage: StageId,
    route: usize,
    first: u32,
    count: u32,
    warm: u32,
    free: bool,
    forwarded: u32,
    backwarded: u32,
}

impl Lane {
    fn new(route: &Route, index: usize, position: usize, variant: Variant) -> Lane {
        Lane {
            stage: route.stages()[position],
            route: index,
            first: route.first().get(),
            count: route.end().get() - route.first().get(),
            warm: warm_count(route, position, variant.warmup),
            free: variant.free,
            forwarded: 0,
            backwarded: 0,
        }
    }

    fn in_flight(&self) -> u32 {
        self.forwarded - self.backwarded
    }

    /// The next forward, if the pacing allows one now.
    fn forward(&self) -> Option<Step> {
        (self.forwarded < self.count && self.in_flight() <= self.warm)
            .then(|| Step::Forward(MicrobatchId::new(self.first + self.forwarded)))
    }

    /// The next backward, if one has its forward run.
    fn backward(&self) -> Option<Step> {
        (self.backwarded < self.forwarded)
            .then(|| Step::Backward(MicrobatchId::new(self.first + self.backwarded)))
    }

    /// The steps this lane may run next: in sequence, the forward while the warm-up allows one,
    /// else the backward (1F1B's order); free, either.
    fn heads(&self) -> impl Iterator<Item = Step> {
        let forward = self.forward();
        let backward = if self.free || forward.is_none() {
            self.backward()
        } else {
            None
        };
        forward.into_iter().chain(backward)
    }

    fn done(&self) -> bool {
        self.backwarded == self.count
    }

    fn advance(&mut self, step: Step) {
        match step {
            Step::Forward(_) => self.forwarded += 1,
            Step::Backward(_) => self.backwarded += 1,
        }
    }
}

/// A rank's sequences, queued weight gradients, order so far, and when it is next free.
struct RankState {
    lanes: Vec<Lane>,
    weights: VecDeque<Work>,
    free: f64,
    /// Activation memory held (units of a rank's share).
    held: f64,
    order: Vec<Task>,
}

/// What a rank does next.
#[derive(Clone, Copy, Debug)]
enum Choice {
    /// One step of one lane.
    Head { lane: usize, step: Step },
    /// The forward of one lane overlapped with the backward of another.
    Pair {
        forward: Candidate,
        backward: Candidate,
    },
    /// The oldest queued weight gradient.
    Weight,
}

/// A lane's head with when it could start.
#[derive(Clone, Copy, Debug)]
struct Candidate {
    lane: usize,
    step: Step,
    ready: f64,
    start: f64,
}

/// A forward and a backward of two different lanes among `now`, as one overlapped F&B.
fn overlapped_pair(now: &[Candidate]) -> Option<Choice> {
    now.iter()
        .filter(|f| matches!(f.step, Step::Forward(_)))
        .find_map(|&forward| {
            now.iter()
                .find(|b| matches!(b.step, Step::Backward(_)) && b.lane != forward.lane)
                .map(|&backward| Choice::Pair { forward, backward })
        })
}

/// A rank's next choice in the scheduler's heap: ordered by start, then rank (as the linear scan
/// it replaces), `version` telling a current entry from a stale one.
#[derive(Clone, Copy, Debug)]
struct Pending {
    start: f64,
    rank: usize,
    version: u64,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Pending) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Pending) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    fn cmp(&self, other: &Pending) -> std::cmp::Ordering {
        self.start
            .total_cmp(&other.start)
            .then(self.rank.cmp(&other.rank))
            .then(self.version.cmp(&other.version))
    }
}

/// The state of one run of the scheduler.
struct Scheduler<'a> {
    plan: &'a Plan,
    variant: Variant,
    /// Activations a rank may hold: a forward that would exceed it waits.
    budget: f64,
    ranks: Vec<RankState>,
    /// Finish time of every F and I op (NaN: not run yet), by op slot.
    finish: Vec<f64>,
}

impl<'a> Scheduler<'a> {
    fn new(plan: &'a Plan, variant: Variant, budget: f64) -> Scheduler<'a> {
        let problem = plan.problem();
        let mut ranks: Vec<RankState> = (0..problem.ranks())
            .map(|_| RankState {
                lanes: Vec::new(),
                weights: VecDeque::new(),
                free: 0.0,
                held: 0.0,
                order: Vec::new(),
            })
            .collect();
        for (r, route) in problem.routes().iter().enumerate() {
            for (position, &stage) in route.stages().iter().enumerate() {
                let Some(owner) = problem.rank_of(stage) else {
                    continue;
                };
                if let Some(rank) = ranks.get_mut(owner.index()) {
                    rank.lanes.push(Lane::new(route, r, position, variant));
                }
            }
        }
        Scheduler {
            plan,
            variant,
            budget,
            ranks,
            finish: vec![f64::NAN; plan.op_slots()],
        }
    }

    /// When `op` finished (infinite when it has not run, or is out of range).
    fn finished(&self, op: Op) -> f64 {
        match self.plan.op_slot(op).map(|s| self.finish[s]) {
            Some(t) if !t.is_nan() => t,
            _ => f64::INFINITY,
        }
    }

    /// The latency of an edge between two stages (zero on one rank).
    fn edge(&self, from: StageId, to: StageId) -> f64 {
        let problem = self.plan.problem();
        if problem.rank_of(from) == problem.rank_of(to) {
            0.0
        } else {
            self.plan.costs().comm()
        }
    }

    /// When `step` of `lane` has every input (infinite while one is unknown).
    fn ready(&self, lane: &Lane, step: Step) -> f64 {
        let route = &self.plan.problem().routes()[lane.route];
        let mb = step.microbatch();
        match step {
            Step::Forward(_) => match route.prev(lane.stage) {
                None => 0.0,
                Some(prev) => {
                    self.finished(Op::new(OpKind::Forward, prev, mb)) + self.edge(prev, lane.stage)
                }
            },
            Step::Backward(_) => {
                let own = self.finished(Op::new(OpKind::Forward, lane.stage, mb));
                match route.next(lane.stage) {
                    None => own,
                    Some(next) => own.max(
                        self.finished(Op::new(OpKind::InputGrad, next, mb))
                            + self.edge(next, lane.stage),
                    ),
                }
            }
        }
    }

    /// The activation memory one forward on `stage` takes.
    fn activation(&self, stage: StageId) -> f64 {
        self.plan
            .memory()
            .stages()
            .get(stage.index())
            .map_or(0.0, |m| m.total())
    }

    /// The steps rank `r`'s lanes may run next, with when each could start, and whether memory
    /// kept a forward back.
    fn candidates(&self, r: usize) -> (Vec<Candidate>, bool) {
        let rank = &self.ranks[r];
        let mut blocked = false;
        let mut out = Vec::new();
        for (i, lane) in rank.lanes.iter().enumerate() {
            for step in lane.heads() {
                let fits = rank.held + self.activation(lane.stage) <= self.budget + EPSILON;
                if matches!(step, Step::Forward(_)) && !fits {
                    blocked = true;
                    continue;
                }
                let ready = self.ready(lane, step);
                out.push(Candidate {
                    lane: i,
                    step,
                    ready,
                    start: ready.max(rank.free),
                });
            }
        }
        (out, blocked)
    }

    /// Whether rank `r`, which can start a step at `earliest` at best, runs its oldest queued W
    /// now: when nothing can start at once and the W fills the wait by the variant's rule, or
    /// memory keeps a forward back, or nothing else is known.
    fn fill_with_weight(&self, r: usize, earliest: f64, blocked: bool) -> bool {
        let rank = &self.ranks[r];
        let Some(&w) = rank.weights.front() else {
            return false;
        };
        let fill = match self.variant.weights {
            Weights::Deferred(fill) => fill,
            Weights::Fused => FillWaits::Always,
        };
        if earliest.is_infinite() {
            return true;
        }
        if earliest <= rank.free + EPSILON {
            return false;
        }
        let cost = self.plan.costs().op_cost(w.op(OpKind::WeightGrad));
        blocked || fill == FillWaits::Always || rank.free + cost <= earliest + EPSILON
    }

    /// Rank `r`'s next task and its start, or None while it cannot start anything known.
    fn next_choice(&self, r: usize) -> Option<(f64, Choice)> {
        let (heads, blocked) = self.candidates(r);
        let earliest = heads.iter().map(|c| c.start).fold(f64::INFINITY, f64::min);
        if self.fill_with_weight(r, earliest, blocked) {
            return Some((self.ranks[r].free, Choice::Weight));
        }
        if earliest.is_infinite() {
            return None;
        }
        let now: Vec<Candidate> = heads
            .into_iter()
            .filter(|c| c.start <= earliest + EPSILON)
            .collect();
        if self.variant.overlap {
            if let Some(pair) = overlapped_pair(&now) {
                return Some((earliest, pair));
            }
        }
        let preferred = |c: &Candidate| match (self.variant.prefer, c.step) {
            (Prefer::Backward, Step::Backward(_)) | (Prefer::Forward, Step::Forward(_)) => 0,
            _ => 1,
        };
        now.iter()
            .min_by(|a, b| {
                preferred(a)
                    .cmp(&preferred(b))
                    .then(a.ready.total_cmp(&b.ready))
                    .then(a.lane.cmp(&b.lane))
            })
            .map(|c| {
                let choice = Choice::Head {
                    lane: c.lane,
                    step: c.step,
                };
                (earliest, choice)
            })
    }

    /// The work of lane `lane`'s head on rank `r`, advancing the lane.
    fn take(&mut self, r: usize, lane: usize, step: Step) -> Work {
        let lane = &mut self.ranks[r].lanes[lane];
        lane.advance(step);
        Work {
            stage: lane.stage,
            microbatch: step.microbatch(),
        }
    }

    /// The task a choice runs, advancing the lanes and the W queue.
    fn task(&mut self, r: usize, choice: Choice) -> Option<Task> {
        match choice {
            Choice::Weight => self.ranks[r].weights.pop_front().map(Task::WeightGrad),
            Choice::Pair { forward, backward } => {
                let f = self.take(r, forward.lane, forward.step);
                let b = self.take(r, backward.lane, backward.step);
                Some(Task::Overlapped {
                    forward: f,
                    backward: b,
                })
            }
            Choice::Head { lane, step } => match (step, self.take(r, lane, step)) {
                (Step::Forward(_), w) => Some(Task::Forward(w)),
                (Step::Backward(_), w) if self.variant.weights == Weights::Fused => {
                    Some(Task::Backward(w))
                }
                (Step::Backward(_), w) => {
                    self.ranks[r].weights.push_back(w);
                    Some(Task::InputGrad(w))
                }
            },
        }
    }

    /// Runs `choice` on rank `r` from `start`; returns the ranks whose next choice may have
    /// changed: `r` and the owners of the stages its ops feed.
    fn execute(&mut self, r: usize, start: f64, choice: Choice) -> Vec<usize> {
        let mut touched = vec![r];
        let Some(task) = self.task(r, choice) else {
            return touched;
        };
        let end = start + self.plan.costs().task_duration(&task);
        let problem = self.plan.problem();
        let memory = self.plan.memory().stages();
        let mut held = 0.0;
        for op in task.ops() {
            held += memory
                .get(op.stage.index())
                .map_or(0.0, |m| m.delta(op.kind));
            if op.kind == OpKind::WeightGrad {
                continue;
            }
            if let Some(slot) = self.plan.op_slot(op) {
                self.finish[slot] = end;
            }
            let Some(route) = problem.route_of(op.microbatch) else {
                continue;
            };
            let fed = match op.kind {
                OpKind::Forward => route.next(op.stage),
                _ => route.prev(op.stage),
            };
            if let Some(owner) = fed.and_then(|s| problem.rank_of(s)) {
                touched.push(owner.index());
            }
        }
        let rank = &mut self.ranks[r];
        rank.free = end;
        rank.held += held;
        rank.order.push(task);
        touched
    }

    /// Schedules everything; None if some rank is left with work it can never start (memory
    /// too tight for the variant's pacing). Each rank's next choice is kept until a task on it or
    /// on a rank that feeds it runs; the earliest (then the lowest rank) runs next, found in a
    /// heap whose stale entries (a rank's choice recomputed since) are skipped, so a run takes
    /// O(tasks log ranks).
    fn run(mut self) -> Option<Vec<Vec<Task>>> {
        let ranks = self.ranks.len();
        let mut next: Vec<Option<(f64, Choice)>> =
            (0..ranks).map(|r| self.next_choice(r)).collect();
        let mut version = vec![0u64; ranks];
        let mut heap: BinaryHeap<Reverse<Pending>> = next
            .iter()
            .enumerate()
            .filter_map(|(r, c)| {
                c.map(|(start, _)| {
                    Reverse(Pending {
                        start,
                        rank: r,
                        version: 0,
                    })
                })
            })
            .collect();
        while let Some(Reverse(pending)) = heap.pop() {
            let r = pending.rank;
            if pending.version != version[r] {
                continue;
            }
            let Some((start, choice)) = next[r] else {
                continue;
            };
            let mut touched = self.execute(r, start, choice);
            touched.sort_unstable();
            touched.dedup();
            for t in touched {
                version[t] += 1;
                next[t] = self.next_choice(t);
                if let Some((start, _)) = next[t] {
                    heap.push(Reverse(Pending {
                        start,
                        rank: t,
                        version: version[t],
                    }));
                }
            }
        }
        let unfinished = self
            .ranks
            .iter()
            .any(|rank| !rank.weights.is_empty() || rank.lanes.iter().any(|l| !l.done()));
        if unfinished {
            return None;
        }
        Some(self.ranks.into_iter().map(|rank| rank.order).collect())
    }
}

/// Every rank's counter-flow order of `plan`'s problem under one variant (the plan's own orders
/// are ignored). The orders still need verification.
pub fn schedule(plan: &Plan, variant: Variant, budget: f64) -> Option<Vec<Vec<Task>>> {
    Scheduler::new(plan, variant, budget).run()
}

/// How many of the best variants the local search improves (the best before it is not always the
/// best after it).
const REFINED: usize = 4;

/// The plan's own orders (if it has any) and every variant's, simulated, within `bound` and
/// `limit`, without repeats, in trial order.
fn candidates(plan: &Plan, split: bool, bound: Option<f64>, limit: Option<f64>) -> Vec<Scored> {
    let mut scored: Vec<Scored> = Vec::new();
    if plan.orders().iter().any(|o| !o.is_empty()) {
        scored.extend(Scored::evaluate(plan, plan.orders().to_vec(), limit, bound));
    }
    for variant in variants(split) {
        let Some(orders) = schedule(plan, variant, limit.unwrap_or(f64::INFINITY)) else {
            continue;
        };
        if scored.iter().any(|s| s.orders == orders) {
            continue;
        }
        scored.extend(Scored::evaluate(plan, orders, limit, bound));
    }
    scored
}

/// The best `count` of `scored`, best first (among equals, the earlier).
fn best_few(mut scored: Vec<Scored>, count: usize) -> Vec<Scored> {
    let mut out = Vec::with_capacity(count);
    while out.len() < count && !scored.is_empty() {
        let mut best = 0;
        for i in 1..scored.len() {
            if scored[i].beats(&scored[best]) {
                best = i;
            }
        }
        out.push(scored.remove(best));
    }
    out
}

/// The best counter-flow orders of `plan` (whole backwards or, with `split`, deferred weight
/// gradients too) whose makespan is at most `bound` and whose peak fits `limit`. The plan's own
/// orders compete too, so the result is never worse than them. The best few candidates are
/// improved by critical-path swaps ([`refine`]) that keep their peak, and the best result wins;
/// None when no candidate qualifies.
pub fn best(
    plan: &Plan,
    split: bool,
    bound: Option<f64>,
    limit: Option<f64>,
) -> Option<Vec<Vec<Task>>> {
    let plan = if split {
        let facts = Facts {
            backwards: Backwards::Split,
            ..plan.facts()
        };
        plan.clone().with_facts(facts).ok()?
    } else {
        plan.clone()
    };
    let budget = refine_budget(&plan);
    let mut winner: Option<Scored> = None;
    for candidate in best_few(candidates(&plan, split, bound, limit), REFINED) {
        let refined = refine(&plan, candidate.orders.clone(), candidate.peak, budget);
        let refined =
            Scored::evaluate(&plan, refined, limit, bound).filter(|r| r.beats(&candidate));
        let candidate = refined.unwrap_or(candidate);
        if winner.as_ref().is_none_or(|w| candidate.beats(w)) {
            winner = Some(candidate);
        }
    }
    winner.map(|w| w.orders)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::{
        simulate, verify, CostModel, DualKind, Layout, MemoryModel, Pacing, ProblemSpec,
        StageCostsSpec,
    };

    fn dual_plan(ranks: u32, microbatches: u32, f: f64, b: f64) -> Plan {
        let problem = ProblemSpec::dualpipe(ranks, microbatches)
            .validate()
            .unwrap();
        let costs = StageCostsSpec::builder()
            .forward(f)
            .input_grad(b / 2.0)
            .weight_grad(b / 2.0)
            .build()
            .validate()
            .unwrap();
        let stages = problem.stages();
        let plan = Plan::unscheduled(
            problem,
            CostModel::uniform(stages, costs, 0.0).unwrap(),
            MemoryModel::uniform(stages, Default::default()),
        )
        .unwrap();
        let facts = Facts {
            layout: Layout::Dual(DualKind::DualPipe),
            pacing: Pacing::OneForwardOneBackward,
            backwards: Backwards::Whole,
            residency: pipeweave_core::Residency::KEPT,
        };
        plan.with_facts(facts).unwrap()
    }

    #[test]
    fn strict_lanes_run_1f1b_per_position() {
        let problem = ProblemSpec::builder()
            .ranks(4)
            .microbatches(3)
            .build()
            .validate()
            .unwrap();
        let route = &problem.routes()[0];
        // A strict lane run alone: always its one next step.
        let run = |position: usize, warmup: Warmup| {
            let variant = Variant {
                warmup,
                free: false,
                prefer: Prefer::Backward,
                overlap: false,
                weights: Weights::Fused,
            };
            let mut lane = Lane::new(route, 0, position, variant);
            let mut text = Vec::new();
            while let Some(step) = lane.heads().next() {
                text.push(match step {
                    Step::Forward(m) => format!("F{m}"),
                    Step::Backward(m) => format!("B{m}"),
                });
                lane.advance(step);
            }
            assert!(lane.done());
            text.join(" ")
        };
        let one = Warmup::OneForwardOneBackward;
        assert_eq!(run(0, one), "F0 F1 F2 B0 B1 B2");
        assert_eq!(run(2, one), "F0 F1 B0 F2 B1 B2");
        assert_eq!(run(3, one), "F0 B0 F1 B1 F2 B2");
        assert_eq!(run(3, Warmup::Double), "F0 B0 F1 B1 F2 B2");
        assert_eq!(run(2, Warmup::Double), "F0 F1 F2 B0 B1 B2");
        assert_eq!(run(3, Warmup::Full), "F0 F1 F2 B0 B1 B2");
    }

    #[test]
    fn two_microbatches_in_counter_flow_never_collide() {
        // One microbatch per route at P = 4, F = 1, B = 2: each route's critical path, 4 x 3.
        let plan = dual_plan(4, 2, 1.0, 2.0);
        let orders = best(&plan, false, None, None).unwrap();
        let plan = plan.with_orders(orders).unwrap();
        assert!(verify(&plan).is_ok());
        assert_eq!(simulate(&plan).unwrap().makespan(), 12.0);
    }

    #[test]
    fn every_variant_schedules_every_op() {
        for (p, m) in [(2, 2), (2, 3), (4, 5), (6, 7), (8, 9)] {
            let plan = dual_plan(p, m, 1.0, 2.0);
            let split = plan
                .clone()
                .with_facts(Facts {
                    backwards: Backwards::Split,
                    ..plan.facts()
                })
                .unwrap();
            for variant in variants(true) {
                let orders = schedule(&split, variant, f64::INFINITY).unwrap();
                let done = split.clone().with_orders(orders).unwrap();
                assert!(verify(&done).is_ok(), "P={p} M={m} {variant:?}");
            }
        }
    }

    #[test]
    fn a_bound_no_variant_meets_gives_none() {
        let plan = dual_plan(4, 3, 1.0, 2.0);
        assert!(best(&plan, false, Some(1.0), None).is_none());
        assert!(best(&plan, false, None, Some(0.5)).is_none());
    }
}
