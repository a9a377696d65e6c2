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
use crate::schedules::kernel::{
    self, largest_activation, ChoiceRule, Decision, Placed, Timeline, Wakes,
};
use crate::schedules::refine::refine;
use crate::schedules::score::{refine_budget, Scored};
use pipeweave_core::ir::problem::Route;
use pipeweave_core::{
    Backwards, Facts, MicrobatchId, Op, OpKind, Plan, StageId, Task, Work, TOLERANCE,
};
use std::collections::VecDeque;

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

/// A rank's sequences and queued weight gradients (its clock, memory and order are on the
/// kernel's timeline).
struct RankState {
    lanes: Vec<Lane>,
    weights: VecDeque<Work>,
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

/// The counter-flow scheduler as a choice rule on the kernel.
struct CounterFlow<'a> {
    plan: &'a Plan,
    variant: Variant,
    /// Activations a rank may hold: a forward that would exceed it waits.
    budget: f64,
    ranks: Vec<RankState>,
}

impl<'a> CounterFlow<'a> {
    fn new(plan: &'a Plan, variant: Variant, budget: f64) -> CounterFlow<'a> {
        let problem = plan.problem();
        let mut ranks: Vec<RankState> = (0..problem.ranks())
            .map(|_| RankState {
                lanes: Vec::new(),
                weights: VecDeque::new(),
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
        CounterFlow {
            plan,
            variant,
            budget,
            ranks,
        }
    }

    /// When `step` of `lane` has every input (infinite while one is unknown).
    fn ready(&self, timeline: &Timeline<'_>, lane: &Lane, step: Step) -> f64 {
        let route = &self.plan.problem().routes()[lane.route];
        let mb = step.microbatch();
        let finished = |op: Op| timeline.ended(op).unwrap_or(f64::INFINITY);
        match step {
            Step::Forward(_) => match route.prev(lane.stage) {
                None => 0.0,
                Some(prev) => {
                    finished(Op::new(OpKind::Forward, prev, mb))
                        + timeline.latency(prev, lane.stage)
                }
            },
            Step::Backward(_) => {
                let own = finished(Op::new(OpKind::Forward, lane.stage, mb));
                match route.next(lane.stage) {
                    None => own,
                    Some(next) => own.max(
                        finished(Op::new(OpKind::InputGrad, next, mb))
                            + timeline.latency(next, lane.stage),
                    ),
                }
            }
        }
    }

    /// The steps rank `r`'s lanes may run next, with when each could start, and whether memory
    /// kept a forward back.
    fn candidates(&self, timeline: &Timeline<'_>, r: usize) -> (Vec<Candidate>, bool) {
        let rank = &self.ranks[r];
        let mut blocked = false;
        let mut out = Vec::new();
        for (i, lane) in rank.lanes.iter().enumerate() {
            for step in lane.heads() {
                let fits = timeline.fits(r, largest_activation(self.plan, lane.stage), self.budget);
                if matches!(step, Step::Forward(_)) && !fits {
                    blocked = true;
                    continue;
                }
                let ready = self.ready(timeline, lane, step);
                out.push(Candidate {
                    lane: i,
                    step,
                    ready,
                    start: ready.max(timeline.free(r)),
                });
            }
        }
        (out, blocked)
    }

    /// Whether rank `r`, which can start a step at `earliest` at best, runs its oldest queued W
    /// now: when nothing can start at once and the W fills the wait by the variant's rule, or
    /// memory keeps a forward back, or nothing else is known.
    fn fill_with_weight(
        &self,
        timeline: &Timeline<'_>,
        r: usize,
        earliest: f64,
        blocked: bool,
    ) -> bool {
        let free = timeline.free(r);
        let Some(&w) = self.ranks[r].weights.front() else {
            return false;
        };
        let fill = match self.variant.weights {
            Weights::Deferred(fill) => fill,
            Weights::Fused => FillWaits::Always,
        };
        if earliest.is_infinite() {
            return true;
        }
        if earliest <= free + TOLERANCE {
            return false;
        }
        let cost = self.plan.costs().op_cost(w.op(OpKind::WeightGrad));
        blocked || fill == FillWaits::Always || free + cost <= earliest + TOLERANCE
    }

    /// Rank `r`'s next task and its start, or None while it cannot start anything known.
    fn next_choice(&self, timeline: &Timeline<'_>, r: usize) -> Option<(f64, Choice)> {
        let (heads, blocked) = self.candidates(timeline, r);
        let earliest = heads.iter().map(|c| c.start).fold(f64::INFINITY, f64::min);
        if self.fill_with_weight(timeline, r, earliest, blocked) {
            return Some((timeline.free(r), Choice::Weight));
        }
        if earliest.is_infinite() {
            return None;
        }
        let now: Vec<Candidate> = heads
            .into_iter()
            .filter(|c| c.start <= earliest + TOLERANCE)
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
}

impl ChoiceRule for CounterFlow<'_> {
    type Choice = Choice;
    const EAGER: bool = true;

    fn decide(&mut self, timeline: &Timeline<'_>, r: usize, _now: f64) -> Decision<Choice> {
        match self.next_choice(timeline, r) {
            Some((start, choice)) => Decision::Run { start, choice },
            None => Decision::Wait,
        }
    }

    fn commit(&mut self, r: usize, choice: Choice) -> Option<Task> {
        self.task(r, choice)
    }

    /// The ranks whose next choice may have changed: the owners of the stages `task`'s F and I
    /// feed.
    fn ran(&mut self, timeline: &Timeline<'_>, placed: Placed, wake: &mut Wakes) -> bool {
        let problem = self.plan.problem();
        for op in placed.task.ops() {
            if op.kind == OpKind::WeightGrad {
                continue;
            }
            let Some(route) = problem.route_of(op.microbatch) else {
                continue;
            };
            let fed = match op.kind {
                OpKind::Forward => route.next(op.stage),
                _ => route.prev(op.stage),
            };
            if let Some(stage) = fed {
                wake.push((timeline.owner(stage), placed.start));
            }
        }
        true
    }
}

/// Every rank's counter-flow order of `plan`'s problem under one variant (the plan's own orders
/// are ignored). The orders still need verification.
pub fn schedule(plan: &Plan, variant: Variant, budget: f64) -> Option<Vec<Vec<Task>>> {
    let mut rule = CounterFlow::new(plan, variant, budget);
    let timeline = kernel::run(Timeline::new(plan), &mut rule)?;
    let unfinished = rule
        .ranks
        .iter()
        .any(|rank| !rank.weights.is_empty() || rank.lanes.iter().any(|l| !l.done()));
    if unfinished {
        return None;
    }
    Some(timeline.into_orders())
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
mod tests;
