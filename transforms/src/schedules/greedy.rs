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
    let problem = plan.problem();
    let costs = plan.costs();
    let memory = plan.memory().stages();
    let comm = costs.comm();
    let mut stage_microbatches: Vec<Vec<u32>> = vec![Vec::new(); problem.stages() as usize];
    for route in problem.routes() {
        for &stage in route.stages() {
            stage_microbatches[stage.index()].extend(route.first().get()..route.end().get());
        }
    }
    for list in &mut stage_microbatches {
        list.sort_unstable();
    }
    let owner = |stage: StageId| problem.rank_of(stage).map_or(usize::MAX, |r| r.index());
    let cost = |w: Work| costs.stage(w.stage).copied().unwrap_or_default();
    let total = |s: StageId| memory.get(s.index()).map_or(0.0, |m| m.total());
    let weight_part = |s: StageId| memory.get(s.index()).map_or(0.0, |m| m.weight_grad());
    let mut ranks: Vec<Rank> = (0..problem.ranks())
        .map(|r| {
            let stages = problem.stages_of(r.into());
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
        })
        .collect();
    // Finish time of every forward (the only op whose finish a later decision looks up).
    let mut forward_finish = vec![f64::NAN; plan.op_slots()];
    let slot = |op: Op| plan.op_slot(op).expect("scheduled ops are in range");

    let mut agenda: BinaryHeap<Due> = (0..ranks.len())
        .filter(|&r| ranks[r].remaining > 0)
        .map(|rank| Due { at: 0.0, rank })
        .collect();
    loop {
        let next = loop {
            match agenda.pop() {
                None => break None,
                Some(due) => {
                    let k = &ranks[due.rank];
                    if k.remaining > 0 && !k.waiting && k.clock == due.at {
                        break Some(due.rank);
                    }
                }
            }
        };
        let Some(r) = next else {
            if ranks.iter().any(|k| k.remaining > 0) {
                return None;
            }
            let max_span = ranks
                .iter()
                .map(|k| k.free - k.first_start)
                .fold(0.0, f64::max);
            let makespan = ranks.iter().map(|k| k.free).fold(0.0, f64::max);
            return Some(Schedule {
                orders: ranks.into_iter().map(|k| k.order).collect(),
                score: Score { max_span, makespan },
            });
        };
        let t = ranks[r].clock;
        let rank = &ranks[r];
        let mut next_known = f64::INFINITY;
        let input = match rank.ready_inputs.peek() {
            Some(ready) if ready.at <= t + EPSILON => Some(ready.work),
            Some(ready) => {
                next_known = ready.at;
                None
            }
            None => None,
        };
        // Best ready F that fits: deepest local stage first.
        let mut forward: Option<(usize, Work)> = None;
        let mut blocked_by_memory = false;
        for (k, &stage) in rank.stages.iter().enumerate().rev() {
            let Some(&mb) = stage_microbatches[stage.index()].get(rank.next_forward[k]) else {
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
                    let f = forward_finish[slot(Op::new(OpKind::Forward, prev, w.microbatch))];
                    if f.is_nan() {
                        continue;
                    }
                    if owner(prev) == r {
                        f
                    } else {
                        f + comm
                    }
                }
            };
            let mut need = rank.held + total(stage);
            if variant.reserve {
                need += rank.stages[k + 1..]
                    .iter()
                    .enumerate()
                    .filter(|(j, s)| {
                        stage_microbatches[s.index()].len() > rank.next_forward[k + 1 + j]
                    })
                    .map(|(_, s)| total(*s))
                    .sum::<f64>();
            }
            let fits = need <= limit + EPSILON && rank.in_flight < rank.in_flight_cap;
            if at > t + EPSILON {
                if fits {
                    next_known = next_known.min(at);
                }
                continue;
            }
            if !fits {
                blocked_by_memory |= need > limit + EPSILON;
                continue;
            }
            if forward.is_none() {
                forward = Some((k, w));
            }
        }
        let weight = rank.pending_weight.front().copied();
        let run_weight = weight.is_some_and(|w| {
            blocked_by_memory
                || variant.fill == FillWaits::Always
                || next_known.is_infinite()
                || next_known - t >= cost(w).weight_grad() - EPSILON
        });
        let rank = &mut ranks[r];
        let task = match (input, forward) {
            (Some(b), Some((k, f)))
                if variant.overlap && rank.held + total(f.stage) <= limit + EPSILON =>
            {
                rank.ready_inputs.pop();
                rank.next_forward[k] += 1;
                Task::Overlapped {
                    forward: f,
                    backward: b,
                }
            }
            (Some(b), f) if variant.prefer_input_grad || f.is_none() => {
                rank.ready_inputs.pop();
                Task::InputGrad(b)
            }
            (_, Some((k, f))) => {
                rank.next_forward[k] += 1;
                Task::Forward(f)
            }
            (_, None) => match weight {
                Some(w) if run_weight => {
                    rank.pending_weight.pop_front();
                    Task::WeightGrad(w)
                }
                _ => {
                    if next_known.is_finite() {
                        rank.clock = next_known;
                        agenda.push(Due {
                            at: next_known,
                            rank: r,
                        });
                    } else {
                        rank.waiting = true;
                    }
                    continue;
                }
            },
        };
        let duration = costs.task_duration(&task);
        let end = t + duration;
        if rank.first_start.is_nan() {
            rank.first_start = t;
        }
        let ops_work: f64 = task
            .ops()
            .iter()
            .map(|op| {
                let c = cost(Work {
                    stage: op.stage,
                    microbatch: op.microbatch,
                });
                match op.kind {
                    OpKind::Forward => c.forward(),
                    OpKind::InputGrad => c.input_grad(),
                    OpKind::WeightGrad => c.weight_grad(),
                }
            })
            .sum();
        rank.remaining_work -= ops_work;
        let least_end = if variant.overlap {
            end
        } else {
            end + rank.remaining_work
        };
        if least_end - rank.first_start > bound + EPSILON {
            return None;
        }
        rank.free = end;
        rank.clock = end;
        rank.order.push(task);
        rank.remaining -= task.ops().len();
        // Book-keeping, and the arrivals this task makes known (on this rank or another).
        let mut arrivals: Vec<(usize, Option<ReadyInput>, f64)> = Vec::new();
        for op in task.ops() {
            let stage = op.stage;
            let w = Work {
                stage,
                microbatch: op.microbatch,
            };
            let Some(route) = problem.route_of(op.microbatch) else {
                continue;
            };
            match op.kind {
                OpKind::Forward => {
                    forward_finish[slot(op)] = end;
                    ranks[r].held += total(stage);
                    ranks[r].in_flight += 1;
                    match route.next(stage) {
                        // The last stage's I needs only its own F.
                        None => arrivals.push((r, Some(ReadyInput { at: end, work: w }), end)),
                        Some(next) => {
                            let q = owner(next);
                            let at = if q == r { end } else { end + comm };
                            arrivals.push((q, None, at));
                        }
                    }
                }
                OpKind::InputGrad => {
                    ranks[r].held -= total(stage) - weight_part(stage);
                    ranks[r].in_flight -= 1;
                    if !matches!(task, Task::Overlapped { .. }) {
                        ranks[r].pending_weight.push_back(w);
                    }
                    if let Some(prev) = route.prev(stage) {
                        let q = owner(prev);
                        let own_forward =
                            forward_finish[slot(Op::new(OpKind::Forward, prev, op.microbatch))];
                        let at = (if q == r { end } else { end + comm }).max(own_forward);
                        let work = Work {
                            stage: prev,
                            microbatch: op.microbatch,
                        };
                        arrivals.push((q, Some(ReadyInput { at, work }), at));
                    }
                }
                OpKind::WeightGrad => ranks[r].held -= weight_part(stage),
            }
        }
        if ranks[r].remaining > 0 {
            agenda.push(Due { at: end, rank: r });
        }
        for (q, ready, at) in arrivals {
            let Some(target) = ranks.get_mut(q) else {
                continue;
            };
            if let Some(ready) = ready {
                target.ready_inputs.push(ready);
            }
            if q != r && target.remaining > 0 && target.wake(at) {
                agenda.push(Due {
                    at: target.clock,
                    rank: q,
                });
            }
        }
    }
}
