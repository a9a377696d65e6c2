//! The timeline a scheduler builds: when every op it placed ends, and every rank's clock, memory
//! and order so far.
//!
//! One home for what every list scheduler of this crate used to keep for itself: an op's inputs
//! arrive when it ended plus the latency of the edge they cross (none on one rank), a task placed
//! on a rank runs from the later of its chosen start and the rank's clock, and the activations a
//! rank holds change by each op's memory delta ([`pipeweave_core::StageMemory::delta`]).

use pipeweave_core::ir::deps::predecessors;
use pipeweave_core::{MicrobatchId, Op, OpKind, Plan, StageId, Task, TOLERANCE};

/// The activations the forward of `microbatch` on `stage` of `plan` takes (the whole figure,
/// none for a stage out of range): what a list scheduler checks against its memory limit before
/// it runs one.
#[inline]
pub fn activation(plan: &Plan, stage: StageId, microbatch: MicrobatchId) -> f64 {
    plan.memory()
        .of(stage, microbatch)
        .map_or(0.0, |m| m.total())
}

/// The most activations any forward on `stage` of `plan` takes: what a scheduler keeps free
/// for a forward it has not chosen yet.
#[inline]
pub fn largest_activation(plan: &Plan, stage: StageId) -> f64 {
    plan.memory().largest_on(stage).map_or(0.0, |m| m.total())
}

/// One rank's clock, memory and order.
#[derive(Clone, Debug)]
struct RankLine {
    /// When the rank is next free.
    free: f64,
    /// When its first task started (NaN before it has one).
    first_start: f64,
    /// Time it waited between its first task and now.
    idle: f64,
    /// Activations held now, and the most it held.
    held: f64,
    peak: f64,
    order: Vec<Task>,
}

/// What a scheduler placed so far on a plan's problem.
#[derive(Clone, Debug)]
pub struct Timeline<'p> {
    plan: &'p Plan,
    /// End of every placed op by op slot (NaN: not placed).
    ends: Vec<f64>,
    ranks: Vec<RankLine>,
}

impl<'p> Timeline<'p> {
    /// Nothing placed yet on `plan`'s problem (its orders are not read).
    pub fn new(plan: &'p Plan) -> Timeline<'p> {
        let ranks = plan.problem().ranks() as usize;
        Timeline {
            plan,
            ends: vec![f64::NAN; plan.op_slots()],
            ranks: vec![
                RankLine {
                    free: 0.0,
                    first_start: f64::NAN,
                    idle: 0.0,
                    held: 0.0,
                    peak: 0.0,
                    order: Vec::new(),
                };
                ranks
            ],
        }
    }

    /// The plan being scheduled.
    pub fn plan(&self) -> &'p Plan {
        self.plan
    }

    /// How many ranks.
    pub fn ranks(&self) -> usize {
        self.ranks.len()
    }

    /// The rank that owns `stage` (`usize::MAX` for a stage out of range, which owns nothing).
    pub fn owner(&self, stage: StageId) -> usize {
        self.plan
            .problem()
            .rank_of(stage)
            .map_or(usize::MAX, |r| r.index())
    }

    /// The latency of a result of `from` reaching `to`: the plan's `comm` across ranks, none on
    /// one rank.
    pub fn latency(&self, from: StageId, to: StageId) -> f64 {
        let problem = self.plan.problem();
        if problem.rank_of(from) == problem.rank_of(to) {
            0.0
        } else {
            self.plan.costs().comm()
        }
    }

    /// When `op` ended, if it is placed (never for a weight gradient, which no op waits for).
    pub fn ended(&self, op: Op) -> Option<f64> {
        let t = *self.ends.get(self.plan.op_slot(op)?)?;
        (!t.is_nan()).then_some(t)
    }

    /// When the result of `op` reaches the rank of stage `at` (None while `op` is not placed).
    pub fn arrival(&self, op: Op, at: StageId) -> Option<f64> {
        Some(self.ended(op)? + self.latency(op.stage, at))
    }

    /// When every input of `task` from outside it has reached its rank, by the plan's dependency
    /// rule (0 for a task without inputs); None while one of them is not placed.
    pub fn ready(&self, task: &Task) -> Option<f64> {
        let ops = task.ops();
        let mut ready: f64 = 0.0;
        for op in &ops {
            for dep in predecessors(self.plan.problem(), *op) {
                if !ops.contains(&dep) {
                    ready = ready.max(self.arrival(dep, op.stage)?);
                }
            }
        }
        Some(ready)
    }

    /// When `rank` is next free.
    pub fn free(&self, rank: usize) -> f64 {
        self.ranks.get(rank).map_or(0.0, |k| k.free)
    }

    /// When `rank`'s first task started (NaN before it has one).
    pub fn first_start(&self, rank: usize) -> f64 {
        self.ranks.get(rank).map_or(f64::NAN, |k| k.first_start)
    }

    /// How long `rank` waited between its first task and its clock.
    pub fn idle(&self, rank: usize) -> f64 {
        self.ranks.get(rank).map_or(0.0, |k| k.idle)
    }

    /// The activations `rank` holds now.
    pub fn held(&self, rank: usize) -> f64 {
        self.ranks.get(rank).map_or(0.0, |k| k.held)
    }

    /// The most any rank held so far.
    pub fn peak(&self) -> f64 {
        self.ranks.iter().map(|k| k.peak).fold(0.0, f64::max)
    }

    /// Whether `rank` can take `extra` more activations within `limit` (up to the tolerance).
    pub fn fits(&self, rank: usize, extra: f64, limit: f64) -> bool {
        self.held(rank) + extra <= limit + TOLERANCE
    }

    /// The change of held activations `task` makes (its ops' deltas, summed in order).
    pub fn memory_delta(&self, task: &Task) -> f64 {
        self.delta_of(&task.ops())
    }

    /// The change of held activations `ops` make, summed in order.
    fn delta_of(&self, ops: &[Op]) -> f64 {
        let memory = self.plan.memory();
        ops.iter()
            .map(|op| {
                memory
                    .of(op.stage, op.microbatch)
                    .map_or(0.0, |m| m.delta(op.kind))
            })
            .sum()
    }

    /// `rank`'s order so far.
    pub fn order(&self, rank: usize) -> &[Task] {
        self.ranks.get(rank).map_or(&[], |k| &k.order)
    }

    /// Places `task` on `rank` from `start` (not before the rank is free) for `duration`; returns
    /// when it ends. Records the end of each of its F and I ops, the rank's memory and idle time.
    pub fn place(&mut self, rank: usize, task: Task, start: f64, duration: f64) -> f64 {
        let ops = task.ops();
        let delta = self.delta_of(&ops);
        let Some(line) = self.ranks.get_mut(rank) else {
            return start + duration;
        };
        let start = start.max(line.free);
        if line.first_start.is_nan() {
            line.first_start = start;
        } else {
            // As sail-sg's ZB-V search counts it (the same bits as its replay).
            line.idle += (start + duration) - (line.free + duration);
        }
        let end = start + duration;
        line.free = end;
        line.held += delta;
        line.peak = line.peak.max(line.held);
        line.order.push(task);
        // No op depends on a weight gradient: its end is never asked for.
        for op in ops.into_iter().filter(|op| op.kind != OpKind::WeightGrad) {
            if let Some(slot) = self.plan.op_slot(op) {
                self.ends[slot] = end;
            }
        }
        end
    }

    /// Places `task` on `rank` at `start` for the plan's duration of it ([`Timeline::place`]).
    pub fn place_costed(&mut self, rank: usize, task: Task, start: f64) -> f64 {
        let duration = self.plan.costs().task_duration(&task);
        self.place(rank, task, start, duration)
    }

    /// The longest per-rank span (first start to last end) and the makespan.
    pub fn spans(&self) -> (f64, f64) {
        let max_span = self
            .ranks
            .iter()
            .filter(|k| !k.first_start.is_nan())
            .map(|k| k.free - k.first_start)
            .fold(0.0, f64::max);
        let makespan = self.ranks.iter().map(|k| k.free).fold(0.0, f64::max);
        (max_span, makespan)
    }

    /// Every rank's order.
    pub fn into_orders(self) -> Vec<Vec<Task>> {
        self.ranks.into_iter().map(|k| k.order).collect()
    }
}
