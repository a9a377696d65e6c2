//! A cost-model-driven list scheduler: builds every rank's order of F, I and W (and, on
//! bidirectional plans, overlapped F&B) by simulating time, within a per-rank memory limit.
//!
//! Time advances rank by rank, always at the rank with the earliest decision time, so when a rank
//! decides, every result that can reach it by then is known. At each decision the rank runs, by
//! the variant's priorities, a ready I (on the critical path), a ready F that fits in memory and
//! in the in-flight cap (deepest stage first), or a pending W; otherwise it waits for the next
//! known arrival. Ws fill the waits: always (`FillWaits::Always`) or only when they end before the
//! next known arrival (`FillWaits::IfTheyFit`); a W also runs when memory blocks a ready F. With
//! `reserve`, a rank that holds several stages of a route keeps room for one forward of each deeper
//! stage, so early chunks cannot fill memory and starve later ones. Readiness is event driven
//! (each finished op tells the ranks that wait for it), so a schedule costs `O(ops log ops)`. The
//! scheduler returns `None` when a variant cannot finish within the limit.
//!
//! This is the heuristic family of the Zero Bubble paper's automatic scheduler (warm up with as
//! many forwards as memory and the first backward's arrival allow, then one F and one B per round,
//! Ws into waits and when memory runs out); `zero_bubble(policy=auto)` tries several variants.

use crate::schedules::chunk_gate::ChunkGate;
use crate::schedules::kernel::{
    self, activation, largest_activation, Agenda, ChoiceRule, Decision, Placed, Time, Timeline,
    Wakes,
};
use crate::schedules::score::Score;
use crate::schedules::threshold::Threshold;
use pipeweave_core::{Op, OpKind, Plan, StageId, Task, Work, TOLERANCE};
use std::cell::Cell;
use std::collections::VecDeque;

/// When pending Ws run in a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillWaits {
    /// Whenever nothing else is ready.
    Always,
    /// Only when the W ends before the next known arrival (or none is known).
    IfTheyFit,
}

/// One variant of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Run a ready I before a ready F.
    pub prefer_input_grad: bool,
    /// When Ws run in waits.
    pub fill: FillWaits,
    /// Keep memory for one forward of each deeper local stage.
    pub reserve: bool,
    /// Pair a ready F with a ready backward into one overlapped F&B (full backward).
    pub overlap: bool,
    /// Cap on a rank's forwards whose I has not run.
    pub in_flight: InFlight,
}

/// How many forwards a rank may run ahead of its input-gradient backwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// Memory alone decides.
    Memory,
    /// `k (w_r - 1) + 1`, with `w_r` the forwards rank `r` runs before its first backward in the
    /// input plan (`k = 1`: 1F1B's pacing; `k = 2`: ZB-H2's).
    Slope(u32),
    /// As many forwards as fit, back to back, between the rank's first forward and the earliest
    /// arrival of its first I (microbatch 0's critical path under the cost model), rounded down or
    /// up: the warm-up that neither idles nor delays the first backward.
    CostAware {
        /// Round up (one forward may overlap the arrival) rather than down.
        round_up: bool,
        /// Forwards allowed beyond that warm-up (a deeper pipeline of in-flight work lets the
        /// last microbatches' backwards start sooner when memory allows).
        extra: u32,
    },
}

/// The warm-up of `rank` under `InFlight::CostAware`: forwards that fit between the start of its
/// first forward and the earliest arrival of that microbatch's input gradient.
fn cost_aware_warmup(plan: &Plan, rank: usize, round_up: bool) -> usize {
    let problem = plan.problem();
    let costs = plan.costs();
    let comm = costs.comm();
    let Some(route) = problem.route_of(0.into()) else {
        return 1;
    };
    let stages = route.stages();
    let Some(position) = stages
        .iter()
        .position(|s| problem.rank_of(*s).map(|r| r.index()) == Some(rank))
    else {
        return 1;
    };
    let cost = |s: StageId| costs.stage(s).copied().unwrap_or_default();
    let crossing = |a: StageId, b: StageId| {
        if problem.rank_of(a) == problem.rank_of(b) {
            0.0
        } else {
            comm
        }
    };
    let mut window = 0.0;
    for (i, &s) in stages.iter().enumerate().skip(position) {
        window += cost(s).forward();
        if let Some(&next) = stages.get(i + 1) {
            window += crossing(s, next) * 2.0 + cost(next).input_grad();
        }
    }
    let forward = cost(stages[position]).forward();
    if forward <= TOLERANCE {
        return usize::MAX;
    }
    let count = window / forward;
    let count = if round_up {
        (count - TOLERANCE).ceil()
    } else {
        (count + TOLERANCE).floor()
    };
    (count.max(1.0)) as usize
}

/// A rank's input-gradient backwards whose dependencies are known, earliest first (then the lowest
/// microbatch and stage).
type ReadyInputs = Agenda<(Time, Work)>;

/// One rank's queues and pacing.
struct Rank {
    stages: Vec<StageId>,
    next_forward: Vec<usize>,
    ready_inputs: ReadyInputs,
    pending_weight: VecDeque<Work>,
    in_flight: usize,
    in_flight_cap: usize,
    remaining_work: f64,
    remaining: usize,
}

/// A schedule the list scheduler built, with its own timing (as early as possible).
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Every rank's order.
    pub orders: Vec<Vec<Task>>,
    /// Its score by the scheduler's own timing.
    pub score: Score,
}

/// Schedules `plan`'s problem under its cost and memory models within `limit` activations per
/// rank. The returned orders still need verification.
pub fn schedule(plan: &Plan, limit: f64, variant: Variant) -> Option<Schedule> {
    schedule_within(plan, limit, variant, f64::INFINITY)
}

/// [`schedule`], giving up (None) as soon as some rank's span must exceed `bound`: a search that
/// already holds a schedule of span `bound` need not finish a worse one. Without overlap, a rank's
/// span is at least its current end plus the durations of its ops still to run, which prunes a
/// losing variant as soon as its idle time exceeds the best one's.
pub fn schedule_within(plan: &Plan, limit: f64, variant: Variant, bound: f64) -> Option<Schedule> {
    schedule_probed(plan, limit, variant, bound).schedule
}

/// A run of [`schedule_within`] with the outcomes of every comparison it made against its memory
/// limit and its bound: at any other limit and bound that both thresholds admit, the run is the
/// same, decision for decision ([`crate::schedules::memo`]).
#[derive(Clone, Debug)]
pub struct Probed {
    /// What the run gave.
    pub schedule: Option<Schedule>,
    /// Its comparisons against the memory limit (activations held plus a forward's).
    pub limit: Threshold,
    /// Its comparisons against the bound (a rank's least possible span).
    pub bound: Threshold,
}

/// [`schedule_within`], with the thresholds of its limit and bound.
pub fn schedule_probed(plan: &Plan, limit: f64, variant: Variant, bound: f64) -> Probed {
    let mut rule = Greedy::new(plan, limit, variant, bound);
    let schedule = kernel::run(Timeline::new(plan), &mut rule).and_then(|timeline| {
        if rule.ranks.iter().any(|k| k.remaining > 0) {
            return None;
        }
        let (max_span, makespan) = timeline.spans();
        Some(Schedule {
            orders: timeline.into_orders(),
            score: Score { max_span, makespan },
        })
    });
    Probed {
        schedule,
        limit: rule.limit_checks.get(),
        bound: rule.bound_checks,
    }
}

/// What one decision found ready on a rank.
struct Candidates {
    /// A ready input-gradient backward.
    input: Option<Work>,
    /// The best ready forward that fits (local stage index, work).
    forward: Option<(usize, Work)>,
    /// Whether memory alone kept a ready forward back.
    blocked_by_memory: bool,
    /// The earliest known time something becomes ready (infinite when nothing is known).
    next_known: f64,
}

/// What a rank runs: the task, and which queue it comes off.
#[derive(Clone, Copy, Debug)]
enum Choice {
    /// The ready input gradient with the ready forward of local stage `k`.
    Overlapped {
        k: usize,
        forward: Work,
        backward: Work,
    },
    /// The ready input gradient.
    Input(Work),
    /// The ready forward of local stage `k`.
    Forward { k: usize, work: Work },
    /// The oldest pending W.
    Weight(Work),
}

impl Choice {
    fn task(self) -> Task {
        match self {
            Choice::Overlapped {
                forward, backward, ..
            } => Task::Overlapped { forward, backward },
            Choice::Input(w) => Task::InputGrad(w),
            Choice::Forward { work, .. } => Task::Forward(work),
            Choice::Weight(w) => Task::WeightGrad(w),
        }
    }
}

/// The list scheduler as a choice rule on the kernel.
struct Greedy<'a> {
    plan: &'a Plan,
    limit: f64,
    variant: Variant,
    bound: f64,
    /// Per stage, the microbatches that pass it, in order.
    stage_microbatches: Vec<Vec<u32>>,
    ranks: Vec<Rank>,
    /// The duration and the op costs of the task last decided (it runs at once).
    decided: (f64, f64),
    /// Holds an earlier sequence chunk's I until the later chunk's I has ended.
    chunk_gate: ChunkGate,
    /// The comparisons made against `limit` and `bound`.
    limit_checks: Cell<Threshold>,
    bound_checks: Threshold,
}

impl<'a> Greedy<'a> {
    fn new(plan: &'a Plan, limit: f64, variant: Variant, bound: f64) -> Greedy<'a> {
        let problem = plan.problem();
        let mut stage_microbatches: Vec<Vec<u32>> = vec![Vec::new(); problem.stages() as usize];
        for route in problem.routes() {
            for &stage in route.stages() {
                stage_microbatches[stage.index()].extend(route.first().get()..route.end().get());
            }
        }
        for list in &mut stage_microbatches {
            list.sort_unstable();
        }
        let ranks: Vec<Rank> = (0..problem.ranks())
            .map(|r| Self::rank_state(plan, r, variant, &stage_microbatches))
            .collect();
        Greedy {
            plan,
            limit,
            variant,
            bound,
            stage_microbatches,
            ranks,
            decided: (0.0, 0.0),
            chunk_gate: ChunkGate::new(plan),
            limit_checks: Cell::new(Threshold::new()),
            bound_checks: Threshold::new(),
        }
    }

    /// A rank before its first decision.
    fn rank_state(plan: &Plan, r: u32, variant: Variant, stage_microbatches: &[Vec<u32>]) -> Rank {
        let costs = plan.costs();
        let stages = plan.problem().stages_of(r.into());
        let remaining = stages
            .iter()
            .map(|s| stage_microbatches[s.index()].len() * 3)
            .sum();
        let order = plan.order(r.into());
        let warmup = order
            .iter()
            .position(|t| !t.is_forward())
            .unwrap_or(order.len())
            .max(1);
        let in_flight_cap = match variant.in_flight {
            InFlight::Slope(k) => k as usize * (warmup - 1) + 1,
            InFlight::Memory => usize::MAX,
            InFlight::CostAware { round_up, extra } => {
                cost_aware_warmup(plan, r as usize, round_up).saturating_add(extra as usize)
            }
        };
        let remaining_work = stages
            .iter()
            .map(|&s| {
                let c = costs.stage(s).copied().unwrap_or_default();
                stage_microbatches[s.index()].len() as f64
                    * (c.forward() + c.input_grad() + c.weight_grad())
            })
            .sum();
        Rank {
            remaining_work,
            next_forward: vec![0; stages.len()],
            stages,
            ready_inputs: Agenda::new(1),
            pending_weight: VecDeque::new(),
            in_flight: 0,
            in_flight_cap,
            remaining,
        }
    }

    /// What rank `r` could run at time `t`.
    fn candidates(&mut self, timeline: &Timeline<'_>, r: usize, t: f64) -> Candidates {
        let mut next_known = f64::INFINITY;
        let input = match self.ranks[r].ready_inputs.peek() {
            Some(&(Time(at), work)) if at <= t + TOLERANCE => Some(work),
            Some(&(Time(at), _)) => {
                next_known = at;
                None
            }
            None => None,
        };
        let (forward, blocked_by_memory) = self.ready_forward(timeline, r, t, &mut next_known);
        Candidates {
            input,
            forward,
            blocked_by_memory,
            next_known,
        }
    }

    /// The best ready forward that fits in memory and the in-flight cap, deepest local stage
    /// first; lowers `next_known` to the arrival of a forward that would fit but is not ready.
    fn ready_forward(
        &self,
        timeline: &Timeline<'_>,
        r: usize,
        t: f64,
        next_known: &mut f64,
    ) -> (Option<(usize, Work)>, bool) {
        let rank = &self.ranks[r];
        let problem = self.plan.problem();
        let mut forward: Option<(usize, Work)> = None;
        let mut blocked_by_memory = false;
        for (k, &stage) in rank.stages.iter().enumerate().rev() {
            let Some(&mb) = self.stage_microbatches[stage.index()].get(rank.next_forward[k]) else {
                continue;
            };
            let w = Work {
                stage,
                microbatch: mb.into(),
            };
            let Some(route) = problem.route_of(w.microbatch) else {
                continue;
            };
            let at = match route.prev(stage) {
                None => 0.0,
                Some(prev) => {
                    match timeline.arrival(Op::new(OpKind::Forward, prev, w.microbatch), stage) {
                        Some(at) => at,
                        None => continue,
                    }
                }
            };
            let extra = activation(self.plan, stage, w.microbatch) + self.reserved(r, k);
            let within = self.fits(timeline, r, extra);
            let fits = within && rank.in_flight < rank.in_flight_cap;
            if at > t + TOLERANCE {
                if fits {
                    *next_known = next_known.min(at);
                }
                continue;
            }
            if !fits {
                blocked_by_memory |= !within;
                continue;
            }
            if forward.is_none() {
                forward = Some((k, w));
            }
        }
        (forward, blocked_by_memory)
    }

    /// Whether rank `r` can take `extra` more activations within the limit
    /// ([`Timeline::fits`]), recorded.
    fn fits(&self, timeline: &Timeline<'_>, r: usize, extra: f64) -> bool {
        let x = timeline.held(r) + extra;
        let mut checks = self.limit_checks.get();
        let ok = checks.check(x, self.limit);
        self.limit_checks.set(checks);
        ok
    }

    /// With `reserve`, the memory kept for one forward of each deeper local stage that still has
    /// forwards to run.
    fn reserved(&self, r: usize, k: usize) -> f64 {
        if !self.variant.reserve {
            return 0.0;
        }
        let rank = &self.ranks[r];
        rank.stages[k + 1..]
            .iter()
            .enumerate()
            .filter(|(j, s)| {
                self.stage_microbatches[s.index()].len() > rank.next_forward[k + 1 + j]
            })
            .map(|(_, s)| largest_activation(self.plan, *s))
            .sum::<f64>()
    }

    /// The task rank `r` runs at `t` by the variant's priorities; None when the rank must wait.
    fn choose(&self, timeline: &Timeline<'_>, r: usize, t: f64, c: &Candidates) -> Option<Choice> {
        let costs = self.plan.costs();
        let weight = self.ranks[r].pending_weight.front().copied();
        let run_weight = weight.is_some_and(|w| {
            c.blocked_by_memory
                || self.variant.fill == FillWaits::Always
                || c.next_known.is_infinite()
                || c.next_known - t
                    >= costs
                        .stage(w.stage)
                        .copied()
                        .unwrap_or_default()
                        .weight_grad()
                        - TOLERANCE
        });
        let overlap_fits = c.forward.is_some_and(|(_, f)| {
            self.fits(timeline, r, activation(self.plan, f.stage, f.microbatch))
        });
        match (c.input, c.forward) {
            (Some(backward), Some((k, forward))) if self.variant.overlap && overlap_fits => {
                Some(Choice::Overlapped {
                    k,
                    forward,
                    backward,
                })
            }
            (Some(b), f) if self.variant.prefer_input_grad || f.is_none() => Some(Choice::Input(b)),
            (_, Some((k, work))) => Some(Choice::Forward { k, work }),
            (_, None) => match weight {
                Some(w) if run_weight => Some(Choice::Weight(w)),
                _ => None,
            },
        }
    }

    /// Whether running `task` on rank `r` from `t` can still beat the bound; remembers the
    /// task's duration and work for when it runs.
    fn within_bound(&mut self, timeline: &Timeline<'_>, r: usize, t: f64, task: &Task) -> bool {
        let costs = self.plan.costs();
        let duration = costs.task_duration(task);
        let end = t + duration;
        let work: f64 = task.ops().iter().map(|op| costs.op_cost(*op)).sum();
        self.decided = (duration, work);
        let first_start = match timeline.first_start(r) {
            f if f.is_nan() => t,
            f => f,
        };
        let least_end = if self.variant.overlap {
            end
        } else {
            end + (self.ranks[r].remaining_work - work)
        };
        self.bound_checks.check(least_end - first_start, self.bound)
    }
}

impl ChoiceRule for Greedy<'_> {
    type Choice = Choice;

    fn decide(&mut self, timeline: &Timeline<'_>, r: usize, now: f64) -> Decision<Choice> {
        if self.ranks[r].remaining == 0 {
            return Decision::Wait;
        }
        let candidates = self.candidates(timeline, r, now);
        match self.choose(timeline, r, now, &candidates) {
            Some(choice) if self.within_bound(timeline, r, now, &choice.task()) => {
                Decision::Run { start: now, choice }
            }
            Some(_) => Decision::GiveUp,
            None if candidates.next_known.is_finite() => Decision::At(candidates.next_known),
            None => Decision::Wait,
        }
    }

    /// The duration `decide` computed (the task runs right after it is decided).
    fn duration(&self, _timeline: &Timeline<'_>, _task: &Task) -> f64 {
        self.decided.0
    }

    fn commit(&mut self, r: usize, choice: Choice) -> Option<Task> {
        let rank = &mut self.ranks[r];
        match choice {
            Choice::Overlapped { k, .. } => {
                rank.ready_inputs.pop_current();
                rank.next_forward[k] += 1;
            }
            Choice::Input(_) => {
                rank.ready_inputs.pop_current();
            }
            Choice::Forward { k, .. } => rank.next_forward[k] += 1,
            Choice::Weight(_) => {
                rank.pending_weight.pop_front();
            }
        }
        Some(choice.task())
    }

    /// Book-keeping of a finished task; the arrivals it makes known wake the ranks they reach.
    fn ran(&mut self, timeline: &Timeline<'_>, placed: Placed, wake: &mut Wakes) -> bool {
        let Placed {
            rank: r, task, end, ..
        } = placed;
        let (_, work) = self.decided;
        let ops = task.ops();
        self.ranks[r].remaining_work -= work;
        self.ranks[r].remaining -= ops.len();
        for op in ops {
            let stage = op.stage;
            let w = Work {
                stage,
                microbatch: op.microbatch,
            };
            let Some(route) = self.plan.problem().route_of(op.microbatch) else {
                continue;
            };
            match op.kind {
                OpKind::Forward => {
                    self.ranks[r].in_flight += 1;
                    match route.next(stage) {
                        // The last stage's I needs only its own F (and a later chunk's I).
                        None => {
                            if let Some(at) = self.chunk_gate.offer(w, end) {
                                self.ranks[r].ready_inputs.push((Time(at), w), 0);
                            }
                        }
                        Some(next) => {
                            let q = timeline.owner(next);
                            wake.push((q, end + timeline.latency(stage, next)));
                        }
                    }
                }
                OpKind::InputGrad => {
                    self.ranks[r].in_flight -= 1;
                    if !matches!(task, Task::Overlapped { .. }) {
                        self.ranks[r].pending_weight.push_back(w);
                    }
                    if let Some((earlier, at)) = self.chunk_gate.ended(w, end) {
                        self.ranks[r].ready_inputs.push((Time(at), earlier), 0);
                    }
                    if let Some(prev) = route.prev(stage) {
                        let q = timeline.owner(prev);
                        let own_forward = timeline
                            .ended(Op::new(OpKind::Forward, prev, op.microbatch))
                            .unwrap_or(f64::NAN);
                        let at = (end + timeline.latency(stage, prev)).max(own_forward);
                        let work = Work {
                            stage: prev,
                            microbatch: op.microbatch,
                        };
                        if let Some(at) = self.chunk_gate.offer(work, at) {
                            if let Some(target) = self.ranks.get_mut(q) {
                                target.ready_inputs.push((Time(at), work), 0);
                            }
                            wake.push((q, at));
                        }
                    }
                }
                OpKind::WeightGrad => {}
            }
        }
        wake.retain(|&(q, _)| q != r && self.ranks.get(q).is_some_and(|k| k.remaining > 0));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::testing::unit_plan;

    fn variant() -> Variant {
        Variant {
            prefer_input_grad: true,
            fill: FillWaits::Always,
            reserve: false,
            overlap: false,
            in_flight: InFlight::Memory,
        }
    }

    #[test]
    fn schedules_every_op_within_the_memory_limit() {
        let plan = unit_plan(4, 8);
        let found = schedule(&plan, 4.0, variant()).unwrap();
        let ops: usize = found.orders.iter().flatten().map(|t| t.ops().len()).sum();
        assert_eq!(ops, 4 * 8 * 3);
        let facts = plan.facts();
        let scheduled = plan.with_facts(pipeweave_core::Facts {
            backwards: pipeweave_core::Backwards::Split,
            pacing: pipeweave_core::Pacing::Custom,
            ..facts
        });
        let scheduled = scheduled.unwrap().with_orders(found.orders).unwrap();
        assert!(pipeweave_core::verify(&scheduled).is_ok());
        assert!(pipeweave_core::max_peak(&scheduled) <= 4.0);
        // Unit F, I, W at 4 ranks and 8 microbatches: the zero-bubble ideal is 8 * 3 + 3 forward steps.
        assert!(found.score.makespan <= 30.0, "{:?}", found.score);
    }

    #[test]
    fn too_little_memory_or_a_beaten_bound_gives_up() {
        let plan = unit_plan(2, 4);
        assert!(schedule(&plan, 0.5, variant()).is_none());
        assert!(schedule_within(&plan, 4.0, variant(), 1.0).is_none());
    }
}
