//! ZB-V's automatic scheduler: the round-based greedy that sail-sg runs for the V placement
//! (Qi et al., Zero Bubble's arXiv ZB-V and "Pipeline Parallelism with Controllable Memory";
//! sail-sg `PipelineGraph.try_v_schedule`), here under the plan's own cost model, memory model
//! and limit.
//!
//! Rank `r` holds chunk 0 = stage `r` and chunk 1 = stage `2P - 1 - r`, and every microbatch
//! passes the `2P` stages in order: chunk-0 forwards and chunk-1 input gradients flow down the
//! ranks, chunk-1 forwards and chunk-0 input gradients back up. The scheduler times each op as it
//! places it (as early as its dependencies and its rank allow) in three phases:
//! 1. warm-up: one chunk-0 forward per rank; then, from the last rank up, rank `r` adds rounds of
//!    chunk-0 forwards on ranks `0..=r` while they end before rank `r + 1`'s first chunk-1 forward
//!    arrives and memory keeps room for `2r + 2` more forwards, then runs its first chunk-1
//!    forward; then each rank from rank 1 on catches up with the forward count of the rank before
//!    it, the chunks taking turns ([`Warmup::Balanced`] also catches up chunk 1's count);
//! 2. `2M` rounds: every rank runs one input-gradient backward (I), the ranks whose I flows up
//!    first, from the last rank, then the others from the first; then every rank runs one forward
//!    (chunk 1 when its input has arrived, else chunk 0);
//! 3. the remaining weight gradients (W).
//!
//! Ws wait in a FIFO. Before an I or F whose input comes from another rank, queued Ws fill the
//! wait while they end before the input arrives; one more W runs when the rest of the wait would
//! make the rank idle beyond its allowance (the longest idle time of any rank so far, less its
//! own: idle time is spread over the ranks); knobs switch that last rule off before forwards
//! (`fill_forward`) and before the Is that flow down (`fill_backward`). Ws also run whenever
//! memory blocks a forward. Each variant is rerun with the previous run's idle times as
//! allowances (a rank that idled less may idle more) while that lowers the longest idle time.
//!
//! Runs plan with the memory limit and, where it differs, with sail-sg's default budget (`P`
//! microbatches of a rank's share), keeping those that stay within the limit. Comparisons of
//! times are exact, as in sail-sg's code, so that the same costs give the same orders.
//!
//! [`zbv_auto_orders`] returns the orders of every run; `zero_bubble(policy=auto)` scores them with
//! its other candidates. A run that cannot go on (memory full with no W queued, an input not yet
//! placed, a phase that makes no progress) is dropped, so the scheduler never panics on a plan.

use crate::schedules::kernel::Timeline;
use pipeweave_core::{ChunkPlacement, Op, OpKind, Plan, StageId, Task, Work, TOLERANCE};
use std::collections::VecDeque;

/// Reruns with allowances per variant, at most (each must lower the longest idle time).
const MAX_RERUNS: usize = 16;

/// How the warm-up's last step evens the ranks' forward counts out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warmup {
    /// Each rank catches up with the total forward count of the rank before it (the version
    /// behind the paper's ZB-V table).
    Paper,
    /// Also with its chunk-1 count (sail-sg's later version, which schedules fewer than `2P`
    /// microbatches).
    Balanced,
}

/// One variant of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Before a forward, run a W when the wait would exceed the rank's idle allowance.
    pub fill_forward: bool,
    /// The same before an I that flows down the ranks (those flowing up always do).
    pub fill_backward: bool,
    /// The warm-up's balancing rule.
    pub warmup: Warmup,
}

/// Every variant, in trial order.
pub fn variants() -> Vec<Knobs> {
    let mut out = Vec::with_capacity(8);
    for warmup in [Warmup::Balanced, Warmup::Paper] {
        for fill_backward in [true, false] {
            for fill_forward in [true, false] {
                out.push(Knobs {
                    fill_forward,
                    fill_backward,
                    warmup,
                });
            }
        }
    }
    out
}

/// The orders of every run of every variant on `plan` within `limit` activations per rank;
/// empty when the plan is not a V (two chunks per rank, one route through all `2P` stages).
pub fn zbv_auto_orders(plan: &Plan, limit: f64) -> Vec<Vec<Vec<Task>>> {
    let Some(shape) = Shape::of_plan(plan) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for budget in shape.budgets(limit) {
        let shape = Shape {
            budget,
            ..shape.clone()
        };
        out.extend(runs(plan, &shape, limit));
    }
    out
}

/// Every run of every variant on `shape` that stays within `limit`.
fn runs(plan: &Plan, shape: &Shape, limit: f64) -> Vec<Vec<Vec<Task>>> {
    let mut out = Vec::new();
    for knobs in variants() {
        let mut allowance: Option<Vec<f64>> = None;
        let mut best_idle = f64::INFINITY;
        for _ in 0..=MAX_RERUNS {
            let Some(run) = Run::new(plan, shape, knobs, allowance.as_deref()).schedule() else {
                break;
            };
            let worst = run.worst_idle();
            let idle = run.idles();
            if run.timeline.peak() <= limit + TOLERANCE {
                out.push(run.timeline.into_orders());
            }
            if worst >= best_idle - TOLERANCE {
                break;
            }
            best_idle = worst;
            allowance = Some(idle);
        }
    }
    out
}

/// Index of an op kind in the per-kind tables.
fn kind_index(kind: OpKind) -> usize {
    match kind {
        OpKind::Forward => 0,
        OpKind::InputGrad => 1,
        OpKind::WeightGrad => 2,
    }
}

/// The V problem as the scheduler reads it.
#[derive(Clone)]
struct Shape {
    ranks: usize,
    microbatches: usize,
    comm: f64,
    /// The memory the run plans with (the caller's limit, or sail-sg's default).
    budget: f64,
    /// Stage of (rank, chunk).
    stage: Vec<[u32; 2]>,
    /// Duration of (rank, chunk, kind).
    cost: Vec<[[f64; 3]; 2]>,
    /// Change of held memory of (rank, chunk, kind).
    delta: Vec<[[f64; 3]; 2]>,
}

impl Shape {
    /// The shape of a V plan; None for any other plan.
    fn of_plan(plan: &Plan) -> Option<Shape> {
        let problem = plan.problem();
        let p = problem.ranks();
        let m = problem.microbatches();
        let [route] = problem.routes() else {
            return None;
        };
        let in_order = route
            .stages()
            .iter()
            .enumerate()
            .all(|(i, s)| s.index() == i);
        if !plan.facts().layout.is_v_shaped(p)
            || problem.stages() != 2 * p
            || route.stages().len() != 2 * p as usize
            || !in_order
            || route.first().get() != 0
            || route.end().get() != m
            || m == 0
        {
            return None;
        }
        let mut shape = Shape {
            ranks: p as usize,
            microbatches: m as usize,
            comm: plan.costs().comm(),
            budget: f64::INFINITY,
            stage: Vec::with_capacity(p as usize),
            cost: Vec::with_capacity(p as usize),
            delta: Vec::with_capacity(p as usize),
        };
        for r in 0..p {
            let stages = [0, 1].map(|c| ChunkPlacement::V.stage(p, r, c));
            let mut cost = [[0.0; 3]; 2];
            let mut delta = [[0.0; 3]; 2];
            for (c, &s) in stages.iter().enumerate() {
                if problem.rank_of(s).map(|q| q.get()) != Some(r) {
                    return None;
                }
                let costs = plan.costs().stage(s)?;
                let memory = plan.memory().stages().get(s.index())?;
                for kind in [OpKind::Forward, OpKind::InputGrad, OpKind::WeightGrad] {
                    cost[c][kind_index(kind)] = costs.of(kind);
                    delta[c][kind_index(kind)] = memory.delta(kind);
                }
            }
            shape.stage.push(stages.map(|s| s.get()));
            shape.cost.push(cost);
            shape.delta.push(delta);
        }
        Some(shape)
    }

    /// The memory budgets to plan with: `limit` and, when it differs, sail-sg's default (`P`
    /// microbatches of a rank's two stages, what 1F1B holds). A run may stay within the limit
    /// without planning for it (fewer microbatches than ranks never fill sail-sg's budget).
    fn budgets(&self, limit: f64) -> Vec<f64> {
        let share = (0..self.ranks)
            .map(|r| self.delta[r][0][0] + self.delta[r][1][0])
            .fold(0.0, f64::max);
        let default = share * self.ranks as f64;
        if (default - limit).abs() > TOLERANCE {
            vec![limit, default]
        } else {
            vec![limit]
        }
    }

    /// The ops whose results an op of `kind` on (`rank`, `chunk`) needs, as (kind, chunk, rank)
    /// of the same microbatch, on this rank or another; None at the ends of the route.
    fn input(
        &self,
        kind: OpKind,
        chunk: usize,
        rank: usize,
    ) -> [Option<(OpKind, usize, usize)>; 2] {
        let last = self.ranks - 1;
        match (kind, chunk) {
            (OpKind::Forward, 0) => [rank.checked_sub(1).map(|q| (kind, 0, q)), None],
            (OpKind::Forward, _) if rank == last => [Some((kind, 0, rank)), None],
            (OpKind::Forward, _) => [Some((kind, 1, rank + 1)), None],
            (OpKind::InputGrad, 1) => [
                Some((OpKind::Forward, 1, rank)),
                rank.checked_sub(1).map(|q| (kind, 1, q)),
            ],
            (OpKind::InputGrad, _) if rank == last => {
                [Some((OpKind::Forward, 0, rank)), Some((kind, 1, rank))]
            }
            (OpKind::InputGrad, _) => [Some((OpKind::Forward, 0, rank)), Some((kind, 0, rank + 1))],
            (OpKind::WeightGrad, c) => [Some((OpKind::InputGrad, c, rank)), None],
        }
    }
}

/// One run of the scheduler: the op it places next is its own rule's; where and when it runs,
/// the memory it holds and the idle time it leaves are the kernel's [`Timeline`].
struct Run<'a> {
    shape: &'a Shape,
    knobs: Knobs,
    allowance: Option<&'a [f64]>,
    timeline: Timeline<'a>,
    /// Ops placed, by rank, kind and chunk.
    count: Vec<[[usize; 2]; 3]>,
    /// Ws waiting to run: (chunk, microbatch).
    pending: Vec<VecDeque<(usize, usize)>>,
}

impl<'a> Run<'a> {
    fn new(
        plan: &'a Plan,
        shape: &'a Shape,
        knobs: Knobs,
        allowance: Option<&'a [f64]>,
    ) -> Run<'a> {
        let p = shape.ranks;
        Run {
            shape,
            knobs,
            allowance,
            timeline: Timeline::new(plan),
            count: vec![[[0; 2]; 3]; p],
            pending: vec![VecDeque::new(); p],
        }
    }

    /// The op of `kind` on (`rank`, `chunk`) for microbatch `mb`.
    fn op(&self, kind: OpKind, chunk: usize, rank: usize, mb: usize) -> Op {
        Op::new(
            kind,
            StageId::new(self.shape.stage[rank][chunk]),
            (mb as u32).into(),
        )
    }

    /// When the op ended, if it is placed.
    fn ended(&self, kind: OpKind, chunk: usize, rank: usize, mb: usize) -> Option<f64> {
        self.timeline.ended(self.op(kind, chunk, rank, mb))
    }

    fn placed(&self, rank: usize, kind: OpKind, chunk: usize) -> usize {
        self.count[rank][kind_index(kind)][chunk]
    }

    fn clock(&self, rank: usize) -> f64 {
        self.timeline.free(rank)
    }

    fn idles(&self) -> Vec<f64> {
        (0..self.shape.ranks)
            .map(|r| self.timeline.idle(r))
            .collect()
    }

    fn worst_idle(&self) -> f64 {
        self.idles().into_iter().fold(0.0, f64::max)
    }

    /// The whole schedule, or None when the run cannot go on.
    fn schedule(mut self) -> Option<Run<'a>> {
        self.warm_up()?;
        for _ in 0..2 * self.shape.microbatches {
            self.backward_round()?;
            self.forward_round()?;
        }
        for r in 0..self.shape.ranks {
            while !self.pending[r].is_empty() {
                self.run_weight(r)?;
            }
        }
        let m = self.shape.microbatches;
        let complete = self
            .count
            .iter()
            .all(|c| c.iter().flatten().all(|&n| n == m));
        complete.then_some(self)
    }

    /// Places the next op of `kind` on (`rank`, `chunk`) as early as possible.
    fn place(&mut self, kind: OpKind, chunk: usize, rank: usize) -> Option<()> {
        let mb = match kind {
            OpKind::WeightGrad => {
                let (c, mb) = self.pending[rank].pop_front()?;
                if c != chunk {
                    return None;
                }
                mb
            }
            _ => self.placed(rank, kind, chunk),
        };
        if mb >= self.shape.microbatches {
            return None;
        }
        let k = kind_index(kind);
        let cost = self.shape.cost[rank][chunk][k];
        if !self
            .timeline
            .fits(rank, self.shape.delta[rank][chunk][k], self.shape.budget)
        {
            return None;
        }
        let mut start = self.clock(rank);
        for (dep_kind, dep_chunk, q) in self.shape.input(kind, chunk, rank).into_iter().flatten() {
            let end = self.ended(dep_kind, dep_chunk, q, mb)?;
            let latency = if q == rank { 0.0 } else { self.shape.comm };
            start = start.max(end + latency);
        }
        self.count[rank][k][chunk] += 1;
        if kind == OpKind::InputGrad {
            self.pending[rank].push_back((chunk, mb));
        }
        let work = Work::new(self.shape.stage[rank][chunk], mb as u32);
        let task = match kind {
            OpKind::Forward => Task::Forward(work),
            OpKind::InputGrad => Task::InputGrad(work),
            OpKind::WeightGrad => Task::WeightGrad(work),
        };
        self.timeline.place(rank, task, start, cost);
        Some(())
    }

    /// Runs the oldest queued W of `rank`.
    fn run_weight(&mut self, rank: usize) -> Option<()> {
        let (chunk, _) = *self.pending[rank].front()?;
        self.place(OpKind::WeightGrad, chunk, rank)
    }

    /// When the input of the next op of `kind` on (`rank`, `chunk`) arrives from another rank;
    /// None when it comes from the rank itself or is not placed yet.
    fn arrival(&self, kind: OpKind, chunk: usize, rank: usize) -> Option<f64> {
        let mb = self.placed(rank, kind, chunk);
        self.shape
            .input(kind, chunk, rank)
            .into_iter()
            .flatten()
            .filter(|&(_, _, q)| q != rank)
            .find_map(|(k, c, q)| self.ended(k, c, q, mb))
            .map(|end| end + self.shape.comm)
    }

    /// How long `rank` may idle before the next op without raising the spread of idle times.
    fn allowed(&self, rank: usize) -> f64 {
        let worst = self.worst_idle();
        let granted = self.allowance.map_or(0.0, |a| {
            a.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                - a.get(rank).copied().unwrap_or(0.0)
        });
        worst.max(granted) - self.timeline.idle(rank)
    }

    /// Queued Ws before an op whose input arrives at `arrival`: those that end before it, then
    /// (with `eager`) one more when the remaining wait exceeds the rank's allowance.
    fn fill_wait(&mut self, rank: usize, arrival: Option<f64>, eager: bool) -> Option<()> {
        let Some(arrival) = arrival else {
            return Some(());
        };
        while let Some(&(chunk, _)) = self.pending[rank].front() {
            let w = self.shape.cost[rank][chunk][2];
            if arrival < self.clock(rank) + w {
                break;
            }
            self.run_weight(rank)?;
        }
        if eager
            && !self.pending[rank].is_empty()
            && arrival - self.clock(rank) > self.allowed(rank)
        {
            self.run_weight(rank)?;
        }
        Some(())
    }

    /// Phase 1: the forwards before the first backward.
    fn warm_up(&mut self) -> Option<()> {
        let (p, m) = (self.shape.ranks, self.shape.microbatches);
        for r in 0..p {
            self.place(OpKind::Forward, 0, r)?;
        }
        for r in (0..p).rev() {
            if r + 1 < p {
                let first_back = self.ended(OpKind::Forward, 1, r + 1, 0)? + self.shape.comm;
                let reserve = self.shape.delta[r][0][0] * (2 * r + 2) as f64;
                while self.timeline.fits(r, reserve, self.shape.budget)
                    && self.clock(r) + self.shape.cost[r][0][0] <= first_back
                    && self.placed(r, OpKind::Forward, 0) < m
                {
                    for q in 0..=r {
                        if self.placed(q, OpKind::Forward, 0) < m {
                            self.place(OpKind::Forward, 0, q)?;
                        }
                    }
                }
            }
            self.place(OpKind::Forward, 1, r)?;
        }
        self.balance()
    }

    /// The end of phase 1: each rank catches up with the forwards of the rank before it.
    fn balance(&mut self) -> Option<()> {
        let (p, m) = (self.shape.ranks, self.shape.microbatches);
        let forwards = |run: &Run, r: usize| {
            run.placed(r, OpKind::Forward, 0) + run.placed(r, OpKind::Forward, 1)
        };
        let mut chunk = 0;
        for r in 1..p {
            let mut idle_turns = 0;
            loop {
                let (mine, before) = (
                    self.placed(r, OpKind::Forward, 1),
                    self.placed(r - 1, OpKind::Forward, 1),
                );
                let behind = forwards(self, r) < forwards(self, r - 1)
                    || (self.knobs.warmup == Warmup::Balanced && mine <= before && before < m);
                if !behind {
                    break;
                }
                let mut placed = false;
                for q in (r..p).rev() {
                    if self.placed(q, OpKind::Forward, chunk) < m {
                        self.place(OpKind::Forward, chunk, q)?;
                        placed = true;
                    }
                }
                chunk = 1 - chunk;
                idle_turns = if placed { 0 } else { idle_turns + 1 };
                if idle_turns >= 2 {
                    return None;
                }
            }
        }
        Some(())
    }

    /// The chunk of `rank`'s next I: chunk 1 (flowing down) unless it is ahead of chunk 0, then
    /// chunk 0 when its input is there or chunk 1 is done.
    fn backward_chunk(&self, rank: usize) -> usize {
        let m = self.shape.microbatches;
        let (up, down) = (
            self.placed(rank, OpKind::InputGrad, 0),
            self.placed(rank, OpKind::InputGrad, 1),
        );
        if up >= down {
            1
        } else if rank + 1 == self.shape.ranks
            || self.ended(OpKind::InputGrad, 0, rank + 1, up).is_some()
            || down >= m
        {
            0
        } else {
            1
        }
    }

    /// One I per rank: those flowing up from the last rank, then those flowing down from the
    /// first.
    fn backward_round(&mut self) -> Option<()> {
        let p = self.shape.ranks;
        let chunks: Vec<usize> = (0..p).map(|r| self.backward_chunk(r)).collect();
        let up = (0..p).rev().filter(|&r| chunks[r] == 0).map(|r| (r, 0));
        let down = (0..p).filter(|&r| chunks[r] == 1).map(|r| (r, 1));
        let turn: Vec<(usize, usize)> = up.chain(down).collect();
        for (r, chunk) in turn {
            let arrival = self.arrival(OpKind::InputGrad, chunk, r);
            let eager = chunk == 0 || self.knobs.fill_backward;
            self.fill_wait(r, arrival, eager)?;
            self.place(OpKind::InputGrad, chunk, r)?;
        }
        Some(())
    }

    /// The chunk of `rank`'s next forward, if one can run: chunk 1 when its input is there,
    /// else chunk 0 when its input is there (chunk 0 first while chunk 1 is not behind).
    fn forward_chunk(&self, rank: usize) -> Option<usize> {
        let m = self.shape.microbatches;
        let (first, second) = (
            self.placed(rank, OpKind::Forward, 0),
            self.placed(rank, OpKind::Forward, 1),
        );
        if second >= m {
            None
        } else if second >= first {
            Some(0)
        } else if rank + 1 == self.shape.ranks
            || self.ended(OpKind::Forward, 1, rank + 1, second).is_some()
        {
            Some(1)
        } else if first < m
            && (rank == 0 || self.ended(OpKind::Forward, 0, rank - 1, first).is_some())
        {
            Some(0)
        } else {
            None
        }
    }

    /// One forward per rank that can run one, from the first rank.
    fn forward_round(&mut self) -> Option<()> {
        for r in 0..self.shape.ranks {
            let Some(chunk) = self.forward_chunk(r) else {
                continue;
            };
            while !self
                .timeline
                .fits(r, self.shape.delta[r][chunk][0], self.shape.budget)
            {
                self.run_weight(r)?;
            }
            let arrival = self.arrival(OpKind::Forward, chunk, r);
            self.fill_wait(r, arrival, self.knobs.fill_forward)?;
            self.place(OpKind::Forward, chunk, r)?;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests;
