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

use crate::schedules::score::Score;
use pipeweave_core::{Op, OpKind, Plan, StageId, Task, Work};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

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

const EPSILON: f64 = 1e-9;

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
    if forward <= EPSILON {
        return usize::MAX;
    }
    let count = window / forward;
    let count = if round_up {
        (count - EPSILON).ceil()
    } else {
        (count + EPSILON).floor()
    };
    (count.max(1.0)) as usize
}

/// An input-gradient backward whose dependencies are known, keyed by when it can start.
#[derive(Clone, Copy, Debug)]
struct ReadyInput {
    at: f64,
    work: Work,
}

impl PartialEq for ReadyInput {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for ReadyInput {}
impl PartialOrd for ReadyInput {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for ReadyInput {
    /// Reversed, so that `BinaryHeap` pops the earliest, then the lowest microbatch and stage.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .total_cmp(&self.at)
            .then(other.work.microbatch.cmp(&self.work.microbatch))
            .then(other.work.stage.cmp(&self.work.stage))
    }
}

/// A rank's pending decision time in the agenda (stale entries are skipped when popped).
#[derive(Clone, Copy, Debug)]
struct Due {
    at: f64,
    rank: usize,
}

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Due {
    /// Reversed, so that `BinaryHeap` pops the earliest, then the lowest rank.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .total_cmp(&self.at)
            .then(other.rank.cmp(&self.rank))
    }
}

struct Rank {
    stages: Vec<StageId>,
    next_forward: Vec<usize>,
    ready_inputs: BinaryHeap<ReadyInput>,
    pending_weight: VecDeque<Work>,
    in_flight: usize,
    in_flight_cap: usize,
    held: f64,
    remaining_work: f64,
    free: f64,
    clock: f64,
    first_start: f64,
    waiting: bool,
    remaining: usize,
    order: Vec<Task>,
}

impl Rank {
    /// Makes the rank decide again at `at` (not before it is free); true when its time changed.
    fn wake(&mut self, at: f64) -> bool {
        if self.waiting || self.clock > at {
            self.waiting = false;
            self.clock = self.free.max(at);
            return true;
        }
        false
    }
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
    Scheduler::new(plan, limit, variant, bound).run()
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

/// An arrival a finished task makes known: (rank, a ready input gradient if any, time).
type Arrival = (usize, Option<ReadyInput>, f64);

/// The state of one run of the list scheduler.
struct Scheduler<'a> {
    plan: &'a Plan,
    limit: f64,
    variant: Variant,
    bound: f64,
    /// Per stage, the microbatches that pass it, in order.
    stage_microbatches: Vec<Vec<u32>>,
    ranks: Vec<Rank>,
    /// Finish time of every forward (the only op whose finish a later decision looks up).
    forward_finish: Vec<f64>,
    agenda: BinaryHeap<Due>,
}

impl<'a> Scheduler<'a> {
    fn new(plan: &'a Plan, limit: f64, variant: Variant, bound: f64) -> Scheduler<'a> {
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
        let agenda = (0..ranks.len())
            .filter(|&r| ranks[r].remaining > 0)
            .map(|rank| Due { at: 0.0, rank })
            .collect();
        Scheduler {
            plan,
            limit,
            variant,
            bound,
            stage_microbatches,
            ranks,
            forward_finish: vec![f64::NAN; plan.op_slots()],
            agenda,
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
            ready_inputs: BinaryHeap::new(),
            pending_weight: VecDeque::new(),
            in_flight: 0,
            in_flight_cap,
            held: 0.0,
            free: 0.0,
            clock: 0.0,
            first_start: f64::NAN,
            waiting: false,
            remaining,
            order: Vec::new(),
        }
    }

    fn owner(&self, stage: StageId) -> usize {
        self.plan
            .problem()
            .rank_of(stage)
            .map_or(usize::MAX, |r| r.index())
    }

    fn total(&self, stage: StageId) -> f64 {
        self.plan
            .memory()
            .stages()
            .get(stage.index())
            .map_or(0.0, |m| m.total())
    }

    fn weight_part(&self, stage: StageId) -> f64 {
        self.plan
            .memory()
            .stages()
            .get(stage.index())
            .map_or(0.0, |m| m.weight_grad())
    }

    fn slot(&self, op: Op) -> usize {
        self.plan.op_slot(op).expect("scheduled ops are in range")
    }

    /// Decides rank after rank until every rank is done or stuck.
    fn run(mut self) -> Option<Schedule> {
        while let Some(r) = self.next_rank() {
            let t = self.ranks[r].clock;
            let candidates = self.candidates(r, t);
            let Some(task) = self.choose(r, t, &candidates) else {
                self.park(r, candidates.next_known);
                continue;
            };
            if !self.execute(r, t, task) {
                return None;
            }
        }
        self.finish()
    }

    /// The rank with the earliest pending decision (stale agenda entries are skipped).
    fn next_rank(&mut self) -> Option<usize> {
        while let Some(due) = self.agenda.pop() {
            let k = &self.ranks[due.rank];
            if k.remaining > 0 && !k.waiting && k.clock == due.at {
                return Some(due.rank);
            }
        }
        None
    }

    /// The schedule, or None when some rank could not finish within the limit.
    fn finish(self) -> Option<Schedule> {
        if self.ranks.iter().any(|k| k.remaining > 0) {
            return None;
        }
        let max_span = self
            .ranks
            .iter()
            .map(|k| k.free - k.first_start)
            .fold(0.0, f64::max);
        let makespan = self.ranks.iter().map(|k| k.free).fold(0.0, f64::max);
        Some(Schedule {
            orders: self.ranks.into_iter().map(|k| k.order).collect(),
            score: Score { max_span, makespan },
        })
    }

    /// What rank `r` could run at time `t`.
    fn candidates(&self, r: usize, t: f64) -> Candidates {
        let rank = &self.ranks[r];
        let mut next_known = f64::INFINITY;
        let input = match rank.ready_inputs.peek() {
            Some(ready) if ready.at <= t + EPSILON => Some(ready.work),
            Some(ready) => {
                next_known = ready.at;
                None
            }
            None => None,
        };
        let (forward, blocked_by_memory) = self.ready_forward(r, t, &mut next_known);
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
                    let f = self.forward_finish
                        [self.slot(Op::new(OpKind::Forward, prev, w.microbatch))];
                    if f.is_nan() {
                        continue;
                    }
                    if self.owner(prev) == r {
                        f
                    } else {
                        f + self.plan.costs().comm()
                    }
                }
            };
            let need = rank.held + self.total(stage) + self.reserved(r, k);
            let fits = need <= self.limit + EPSILON && rank.in_flight < rank.in_flight_cap;
            if at > t + EPSILON {
                if fits {
                    *next_known = next_known.min(at);
                }
                continue;
            }
            if !fits {
                blocked_by_memory |= need > self.limit + EPSILON;
                continue;
            }
            if forward.is_none() {
                forward = Some((k, w));
            }
        }
        (forward, blocked_by_memory)
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
            .map(|(_, s)| self.total(*s))
            .sum::<f64>()
    }

    /// Picks the task rank `r` runs at `t` by the variant's priorities and takes it off its
    /// queues; None when the rank must wait.
    fn choose(&mut self, r: usize, t: f64, c: &Candidates) -> Option<Task> {
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
                        - EPSILON
        });
        let overlap_fits = c
            .forward
            .is_some_and(|(_, f)| self.ranks[r].held + self.total(f.stage) <= self.limit + EPSILON);
        let rank = &mut self.ranks[r];
        match (c.input, c.forward) {
            (Some(b), Some((k, f))) if self.variant.overlap && overlap_fits => {
                rank.ready_inputs.pop();
                rank.next_forward[k] += 1;
                Some(Task::Overlapped {
                    forward: f,
                    backward: b,
                })
            }
            (Some(b), f) if self.variant.prefer_input_grad || f.is_none() => {
                rank.ready_inputs.pop();
                Some(Task::InputGrad(b))
            }
            (_, Some((k, f))) => {
                rank.next_forward[k] += 1;
                Some(Task::Forward(f))
            }
            (_, None) => match weight {
                Some(w) if run_weight => {
                    rank.pending_weight.pop_front();
                    Some(Task::WeightGrad(w))
                }
                _ => None,
            },
        }
    }

    /// Nothing to run: decide again at the next known arrival, or wait to be woken.
    fn park(&mut self, r: usize, next_known: f64) {
        let rank = &mut self.ranks[r];
        if next_known.is_finite() {
            rank.clock = next_known;
            self.agenda.push(Due {
                at: next_known,
                rank: r,
            });
        } else {
            rank.waiting = true;
        }
    }

    /// Runs `task` on rank `r` from `t`; false when the run can no longer beat the bound.
    fn execute(&mut self, r: usize, t: f64, task: Task) -> bool {
        let costs = self.plan.costs();
        let end = t + costs.task_duration(&task);
        let work: f64 = task.ops().iter().map(|op| costs.op_cost(*op)).sum();
        let rank = &mut self.ranks[r];
        if rank.first_start.is_nan() {
            rank.first_start = t;
        }
        rank.remaining_work -= work;
        let least_end = if self.variant.overlap {
            end
        } else {
            end + rank.remaining_work
        };
        if least_end - rank.first_start > self.bound + EPSILON {
            return false;
        }
        rank.free = end;
        rank.clock = end;
        rank.order.push(task);
        rank.remaining -= task.ops().len();
        let arrivals = self.book(r, task, end);
        if self.ranks[r].remaining > 0 {
            self.agenda.push(Due { at: end, rank: r });
        }
        self.notify(r, arrivals);
        true
    }

    /// Book-keeping of a finished task, and the arrivals it makes known (on this rank or another).
    fn book(&mut self, r: usize, task: Task, end: f64) -> Vec<Arrival> {
        let comm = self.plan.costs().comm();
        let mut arrivals: Vec<Arrival> = Vec::new();
        for op in task.ops() {
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
                    let slot = self.slot(op);
                    self.forward_finish[slot] = end;
                    self.ranks[r].held += self.total(stage);
                    self.ranks[r].in_flight += 1;
                    match route.next(stage) {
                        // The last stage's I needs only its own F.
                        None => arrivals.push((r, Some(ReadyInput { at: end, work: w }), end)),
                        Some(next) => {
                            let q = self.owner(next);
                            let at = if q == r { end } else { end + comm };
                            arrivals.push((q, None, at));
                        }
                    }
                }
                OpKind::InputGrad => {
                    let freed = self.total(stage) - self.weight_part(stage);
                    self.ranks[r].held -= freed;
                    self.ranks[r].in_flight -= 1;
                    if !matches!(task, Task::Overlapped { .. }) {
                        self.ranks[r].pending_weight.push_back(w);
                    }
                    if let Some(prev) = route.prev(stage) {
                        let q = self.owner(prev);
                        let own_forward = self.forward_finish
                            [self.slot(Op::new(OpKind::Forward, prev, op.microbatch))];
                        let at = (if q == r { end } else { end + comm }).max(own_forward);
                        let work = Work {
                            stage: prev,
                            microbatch: op.microbatch,
                        };
                        arrivals.push((q, Some(ReadyInput { at, work }), at));
                    }
                }
                OpKind::WeightGrad => self.ranks[r].held -= self.weight_part(stage),
            }
        }
        arrivals
    }

    /// Delivers arrivals and wakes the ranks that were waiting for them.
    fn notify(&mut self, r: usize, arrivals: Vec<Arrival>) {
        for (q, ready, at) in arrivals {
            let Some(target) = self.ranks.get_mut(q) else {
                continue;
            };
            if let Some(ready) = ready {
                target.ready_inputs.push(ready);
            }
            if q != r && target.remaining > 0 && target.wake(at) {
                self.agenda.push(Due {
                    at: target.clock,
                    rank: q,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::{CostModel, MemoryModel, ProblemSpec, StageCosts};

    fn linear(ranks: u32, microbatches: u32) -> Plan {
        let problem = ProblemSpec::builder()
            .ranks(ranks)
            .microbatches(microbatches)
            .build()
            .validate()
            .unwrap();
        Plan::unscheduled(
            problem,
            CostModel::uniform(ranks, StageCosts::default(), 0.0).unwrap(),
            MemoryModel::uniform(ranks, Default::default()),
        )
        .unwrap()
    }

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
        let plan = linear(4, 8);
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
        let plan = linear(2, 4);
        assert!(schedule(&plan, 0.5, variant()).is_none());
        assert!(schedule_within(&plan, 4.0, variant(), 1.0).is_none());
    }
}
