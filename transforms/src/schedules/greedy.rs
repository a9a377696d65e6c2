//! A cost-model-driven list scheduler: builds every rank's order of F, I and W (and, on
//! bidirectional plans, overlapped F&B) by simulating time, within a per-rank memory limit.
//!
//! Time advances rank by rank, always at the rank with the earliest decision time, so when a rank
//! decides, every result that can reach it by then is known. At each decision the rank runs, by
//! the variant's priorities, a ready I (on the critical path), a ready F that fits in memory
//! (deepest stage first), or a pending W; otherwise it waits for the next known arrival. Ws fill
//! the waits: always (`FillWaits::Always`) or only when they end before the next known arrival
//! (`FillWaits::IfTheyFit`); a W also runs when memory blocks every ready F. With `reserve`, a rank
//! that holds several stages of a route keeps room for one forward of each deeper stage, so early
//! chunks cannot fill memory and starve later ones. The scheduler returns `None` when a variant
//! cannot finish within the limit.
//!
//! This is the heuristic family of the Zero Bubble paper's automatic scheduler (warm up with as
//! many forwards as memory allows, then one F and one B per round, Ws into waits and when memory
//! runs out); `zero_bubble(policy=auto)` tries several variants and keeps the best verified one.

use pipeweave_core::{Op, OpKind, Plan, StageId, Task, Work};
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
    /// Ws a rank keeps for the cool-down, as `k (w_r - 1)`: in a wait mid-schedule a W runs only
    /// while more than that many are pending (memory pressure and the cool-down use them all).
    pub keep_weights_slope: u32,
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

struct Rank {
    stages: Vec<StageId>,
    in_flight: usize,
    in_flight_cap: usize,
    keep_weights: usize,
    forwards_left: usize,
    first_start: f64,
    next_forward: Vec<usize>,
    pending_input: Vec<Work>,
    pending_weight: VecDeque<Work>,
    held: f64,
    free: f64,
    clock: f64,
    waiting: bool,
    remaining: usize,
    order: Vec<Task>,
}

/// Schedules `plan`'s problem under its cost and memory models within `limit` activations per
/// rank. The returned orders still need verification.
pub fn schedule(plan: &Plan, limit: f64, variant: Variant) -> Option<Schedule> {
    let problem = plan.problem();
    let costs = plan.costs();
    let memory = plan.memory().stages();
    let comm = costs.comm();
    let stage_count = problem.stages() as usize;
    let mut stage_microbatches: Vec<Vec<u32>> = vec![Vec::new(); stage_count];
    for route in problem.routes() {
        for &stage in route.stages() {
            stage_microbatches[stage.index()].extend(route.first().get()..route.end().get());
        }
    }
    for list in &mut stage_microbatches {
        list.sort_unstable();
    }
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
            Rank {
                in_flight: 0,
                in_flight_cap,
                keep_weights: variant.keep_weights_slope as usize * (warmup - 1),
                forwards_left: remaining / 3,
                first_start: f64::NAN,
                next_forward: vec![0; stages.len()],
                stages,
                pending_input: Vec::new(),
                pending_weight: VecDeque::new(),
                held: 0.0,
                free: 0.0,
                clock: 0.0,
                waiting: false,
                remaining,
                order: Vec::new(),
            }
        })
        .collect();
    let mut finish = vec![f64::NAN; plan.op_slots()];
    let owner = |stage: StageId| problem.rank_of(stage).map_or(usize::MAX, |r| r.index());
    let slot = |op: Op| plan.op_slot(op).expect("scheduled ops are in range");
    // When the result of `dep` can be used on rank `r`, if known.
    let arrival = |finish: &[f64], dep: Op, r: usize| -> Option<f64> {
        let f = finish[slot(dep)];
        (!f.is_nan()).then(|| if owner(dep.stage) == r { f } else { f + comm })
    };
    let forward_ready = |finish: &[f64], w: Work, r: usize| -> Option<f64> {
        let route = problem.route_of(w.microbatch)?;
        match route.prev(w.stage) {
            None => Some(0.0),
            Some(prev) => arrival(finish, Op::new(OpKind::Forward, prev, w.microbatch), r),
        }
    };
    let input_ready = |finish: &[f64], w: Work, r: usize| -> Option<f64> {
        let route = problem.route_of(w.microbatch)?;
        let own = arrival(finish, w.op(OpKind::Forward), r)?;
        match route.next(w.stage) {
            None => Some(own),
            Some(next) => arrival(finish, Op::new(OpKind::InputGrad, next, w.microbatch), r)
                .map(|a| a.max(own)),
        }
    };
    let cost = |w: Work| costs.stage(w.stage).copied().unwrap_or_default();
    let total = |w: Work| memory.get(w.stage.index()).map_or(0.0, |m| m.total());
    let weight_part = |w: Work| memory.get(w.stage.index()).map_or(0.0, |m| m.weight_grad());

    loop {
        let Some(r) = (0..ranks.len())
            .filter(|&r| ranks[r].remaining > 0 && !ranks[r].waiting)
            .min_by(|&a, &b| ranks[a].clock.total_cmp(&ranks[b].clock).then(a.cmp(&b)))
        else {
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
                max_span,
                makespan,
            });
        };
        let t = ranks[r].clock;
        let rank = &ranks[r];
        let mut next_known = f64::INFINITY;
        // Best ready I: earliest arrival, then lowest microbatch.
        let mut input: Option<(usize, f64)> = None;
        for (i, &w) in rank.pending_input.iter().enumerate() {
            if let Some(at) = input_ready(&finish, w, r) {
                if at <= t + EPSILON {
                    if input.is_none_or(|(_, best)| at < best - EPSILON) {
                        input = Some((i, at));
                    }
                } else {
                    next_known = next_known.min(at);
                }
            }
        }
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
            let Some(at) = forward_ready(&finish, w, r) else {
                continue;
            };
            let mut need = rank.held + total(w);
            if variant.reserve {
                need += rank.stages[k + 1..]
                    .iter()
                    .enumerate()
                    .filter(|(j, s)| {
                        stage_microbatches[s.index()].len() > rank.next_forward[k + 1 + j]
                    })
                    .map(|(_, s)| memory.get(s.index()).map_or(0.0, |m| m.total()))
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
                blocked_by_memory = true;
                continue;
            }
            if forward.is_none() {
                forward = Some((k, w));
            }
        }
        let weight = rank.pending_weight.front().copied();
        let run_weight = weight.is_some_and(|w| {
            let fills = variant.fill == FillWaits::Always
                || next_known.is_infinite()
                || next_known - t >= cost(w).weight_grad() - EPSILON;
            let spare = rank.forwards_left == 0 || rank.pending_weight.len() > rank.keep_weights;
            blocked_by_memory || (fills && spare)
        });
        let rank = &mut ranks[r];
        let (task, duration) = match (input, forward) {
            (Some((i, _)), Some((k, f)))
                if variant.overlap && rank.held + total(f) <= limit + EPSILON =>
            {
                let b = rank.pending_input.swap_remove(i);
                rank.next_forward[k] += 1;
                let d = cost(f).overlapped().max(cost(b).overlapped());
                (
                    Task::Overlapped {
                        forward: f,
                        backward: b,
                    },
                    d,
                )
            }
            (Some((i, _)), f) if variant.prefer_input_grad || f.is_none() => {
                let b = rank.pending_input.swap_remove(i);
                (Task::InputGrad(b), cost(b).input_grad())
            }
            (_, Some((k, f))) => {
                rank.next_forward[k] += 1;
                (Task::Forward(f), cost(f).forward())
            }
            (_, None) => match weight {
                Some(w) if run_weight => {
                    rank.pending_weight.pop_front();
                    (Task::WeightGrad(w), cost(w).weight_grad())
                }
                _ => {
                    if next_known.is_finite() {
                        rank.clock = next_known;
                    } else {
                        rank.waiting = true;
                    }
                    continue;
                }
            },
        };
        let end = t + duration;
        for op in task.ops() {
            finish[slot(op)] = end;
            let w = Work {
                stage: op.stage,
                microbatch: op.microbatch,
            };
            match op.kind {
                OpKind::Forward => {
                    rank.held += total(w);
                    rank.in_flight += 1;
                    rank.forwards_left -= 1;
                    rank.pending_input.push(w);
                }
                OpKind::InputGrad => {
                    rank.held -= total(w) - weight_part(w);
                    rank.in_flight -= 1;
                    if !matches!(task, Task::Overlapped { .. }) {
                        rank.pending_weight.push_back(w);
                    }
                }
                OpKind::WeightGrad => rank.held -= weight_part(w),
            }
        }
        rank.remaining -= task.ops().len();
        if rank.first_start.is_nan() {
            rank.first_start = t;
        }
        rank.free = end;
        rank.clock = end;
        rank.order.push(task);
        // Wake the ranks whose candidates depend on what just finished.
        for op in task.ops() {
            let Some(route) = problem.route_of(op.microbatch) else {
                continue;
            };
            let dependent = match op.kind {
                OpKind::Forward => route.next(op.stage),
                OpKind::InputGrad => route.prev(op.stage),
                OpKind::WeightGrad => None,
            };
            let Some(q) = dependent.map(owner) else {
                continue;
            };
            if q == r || q >= ranks.len() {
                continue;
            }
            let at = end + comm;
            let other = &mut ranks[q];
            if other.waiting || other.clock > at {
                other.waiting = false;
                other.clock = other.free.max(at);
            }
        }
    }
}

/// A schedule the list scheduler built, with its own timing (as early as possible).
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    /// Every rank's order.
    pub orders: Vec<Vec<Task>>,
    /// The longest per-rank span (first start to last end).
    pub max_span: f64,
    /// When the last task ends.
    pub makespan: f64,
}
