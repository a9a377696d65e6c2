//! The exact search's view of a plan's problem: every F, I and W as one op with its rank,
//! duration, memory change, dependencies (with their latency) and tail, in one dense table.
//!
//! Microbatches alike (same route, same cost scale) are interchangeable, so any schedule can be
//! relabelled to run their first forwards in microbatch order: the table adds that order as a
//! dependency (on one rank, no latency), which removes their permutations from the search
//! without removing any makespan.

use pipeweave_core::analysis::bound::CheapestForms;
use pipeweave_core::{MicrobatchId, Op, OpKind, Plan, Task, Work, TOLERANCE};
use smallvec::SmallVec;
use std::collections::HashMap;

/// An op's index in [`Model::ops`].
pub(super) type OpIndex = usize;

/// One dependency: the op at the other end and the latency between them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Edge {
    pub op: OpIndex,
    pub latency: f64,
}

/// One op of the problem.
#[derive(Clone, Debug)]
pub(super) struct OpInfo {
    /// The task that runs it.
    pub task: Task,
    pub rank: usize,
    pub duration: f64,
    /// The change of the rank's held activations when it runs.
    pub delta: f64,
    pub preds: SmallVec<[Edge; 3]>,
    pub succs: SmallVec<[Edge; 3]>,
    /// The longest chain of work (with latency) that must follow its end.
    pub tail: f64,
    /// For a forward: the op whose end frees its whole size (its W where the I frees nothing,
    /// else its I) and the least time from the forward's start to that end.
    pub release: Option<(OpIndex, f64)>,
    /// For a forward's release op: that forward.
    pub frees: Option<OpIndex>,
    /// Its microbatch.
    pub microbatch: u32,
}

/// The problem as the search sees it.
#[derive(Clone, Debug)]
pub(super) struct Model {
    pub ops: Vec<OpInfo>,
    /// Every op once, each after its dependencies.
    pub topo: Vec<OpIndex>,
    pub ranks: usize,
    /// The per-rank activation limit (infinite: none).
    pub limit: f64,
    /// Per rank, how many forwards it can hold at once where they are all of one size.
    pub slots: Vec<Option<usize>>,
}

/// How the model prices a backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pricing {
    /// I and W at their own costs: the split schedules the search builds.
    Split,
    /// As cheap as any form of it runs ([`CheapestForms`]: a relaxation that bounds the
    /// schedules with fused tasks too).
    Cheapest,
}

impl Model {
    /// The F, I and W of every (stage, microbatch) pair of `plan`'s problem, at `limit`, their
    /// backwards priced by `pricing`.
    pub fn of_plan(plan: &Plan, limit: f64, pricing: Pricing) -> Model {
        let problem = plan.problem();
        let costs = plan.costs();
        let memory = plan.memory();
        let mut index: HashMap<Op, OpIndex> = HashMap::new();
        let mut ops: Vec<OpInfo> = Vec::new();
        let cheapest = CheapestForms::of(plan);
        for m in 0..problem.microbatches() {
            for s in 0..problem.stages() {
                let work = Work::new(s, m);
                if !problem.has_work(work.stage, work.microbatch) {
                    continue;
                }
                let rank = problem.rank_of(work.stage).map_or(0, |r| r.index());
                for (kind, task) in [
                    (OpKind::Forward, Task::Forward(work)),
                    (OpKind::InputGrad, Task::InputGrad(work)),
                    (OpKind::WeightGrad, Task::WeightGrad(work)),
                ] {
                    index.insert(work.op(kind), ops.len());
                    let duration = match pricing {
                        Pricing::Split => costs.task_duration(&task),
                        Pricing::Cheapest => {
                            let (f, i, w) = cheapest.durations(work);
                            match kind {
                                OpKind::Forward => f,
                                OpKind::InputGrad => i,
                                OpKind::WeightGrad => w,
                            }
                        }
                    };
                    ops.push(OpInfo {
                        task,
                        rank,
                        duration,
                        delta: memory
                            .of(work.stage, work.microbatch)
                            .map_or(0.0, |mm| mm.delta(kind)),
                        preds: SmallVec::new(),
                        succs: SmallVec::new(),
                        tail: 0.0,
                        release: None,
                        frees: None,
                        microbatch: m,
                    });
                }
            }
        }
        let latency = |a: OpIndex, b: OpIndex, ops: &[OpInfo]| {
            if ops[a].rank == ops[b].rank {
                0.0
            } else {
                costs.comm()
            }
        };
        let mut edges: Vec<(OpIndex, OpIndex)> = Vec::new();
        for (op, &at) in &index {
            for dep in pipeweave_core::ir::deps::predecessors(problem, *op) {
                if let Some(&from) = index.get(&dep) {
                    edges.push((from, at));
                }
            }
        }
        // Alike microbatches start in microbatch order (see the module doc).
        let mut last_alike: HashMap<(usize, u64), OpIndex> = HashMap::new();
        for m in 0..problem.microbatches() {
            let microbatch = MicrobatchId::new(m);
            // Of sequence chunks, only whole groups are alike: the first chunks keep group order.
            if problem.seq_chunk_of(microbatch).1 != 0 {
                continue;
            }
            let Some(route) = problem.route_of(microbatch) else {
                continue;
            };
            let Some(&first) = route.stages().first() else {
                continue;
            };
            let key = (
                std::ptr::from_ref(route) as usize,
                costs.microbatch_scale(microbatch).to_bits(),
            );
            let Some(&at) = index.get(&Op::new(OpKind::Forward, first, microbatch)) else {
                continue;
            };
            if let Some(before) = last_alike.insert(key, at) {
                edges.push((before, at));
            }
        }
        edges.sort_unstable();
        for (from, to) in edges {
            let lat = latency(from, to, &ops);
            ops[to].preds.push(Edge {
                op: from,
                latency: lat,
            });
            ops[from].succs.push(Edge {
                op: to,
                latency: lat,
            });
        }
        let topo = topological(&ops);
        for &op in topo.iter().rev() {
            let tail = ops[op]
                .succs
                .iter()
                .map(|e| e.latency + ops[e.op].duration + ops[e.op].tail)
                .fold(0.0, f64::max);
            ops[op].tail = tail;
        }
        for (op, release) in releases(&ops, &topo).into_iter().enumerate() {
            ops[op].release = release;
            if let Some((by, _)) = release {
                ops[by].frees = Some(op);
            }
        }
        let ranks = problem.ranks() as usize;
        let slots = slots(&ops, ranks, limit);
        Model {
            ops,
            topo,
            ranks,
            limit,
            slots,
        }
    }
}

impl Model {
    /// The same model at another memory limit.
    pub fn set_limit(&mut self, limit: f64) {
        self.limit = limit;
        self.slots = slots(&self.ops, self.ranks, limit);
    }
}

/// Every forward's release ([`OpInfo::release`]): the op of its (stage, microbatch) whose end
/// frees its whole size, and the longest chain of its microbatch's ops from the forward's start
/// to that end.
fn releases(ops: &[OpInfo], topo: &[OpIndex]) -> Vec<Option<(OpIndex, f64)>> {
    let mut out = vec![None; ops.len()];
    // Each microbatch's ops in dependency order, and each op's place in that list.
    let microbatches = ops
        .iter()
        .map(|o| o.microbatch as usize + 1)
        .max()
        .unwrap_or(0);
    let mut own: Vec<Vec<OpIndex>> = vec![Vec::new(); microbatches];
    let mut place = vec![0; ops.len()];
    for &op in topo {
        let list = &mut own[ops[op].microbatch as usize];
        place[op] = list.len();
        list.push(op);
    }
    let mut start = Vec::new();
    for list in &own {
        for (k, &op) in list.iter().enumerate() {
            // The ops of a pair are pushed together: F, then its I and W.
            if !matches!(ops[op].task, Task::Forward(_)) || op + 2 >= ops.len() {
                continue;
            }
            let (input_grad, weight_grad) = (op + 1, op + 2);
            let release = if ops[input_grad].delta < -TOLERANCE {
                input_grad
            } else {
                weight_grad
            };
            start.clear();
            start.resize(list.len(), f64::NEG_INFINITY);
            start[k] = 0.0;
            for (j, &o) in list.iter().enumerate().skip(k + 1) {
                for e in &ops[o].preds {
                    if ops[e.op].microbatch == ops[o].microbatch && start[place[e.op]].is_finite() {
                        let ready = start[place[e.op]] + ops[e.op].duration + e.latency;
                        start[j] = start[j].max(ready);
                    }
                }
            }
            let at = start[place[release]];
            if at.is_finite() {
                out[op] = Some((release, at + ops[release].duration));
            }
        }
    }
    out
}

/// Per rank, how many forwards' activations fit its limit at once where all its forwards are of
/// one size (None elsewhere, and without a limit); never more than the rank's forwards.
fn slots(ops: &[OpInfo], ranks: usize, limit: f64) -> Vec<Option<usize>> {
    (0..ranks)
        .map(|rank| {
            let sizes: Vec<f64> = ops
                .iter()
                .filter(|o| o.rank == rank && o.release.is_some())
                .map(|o| o.delta)
                .collect();
            let size = *sizes.first()?;
            if !limit.is_finite()
                || size <= TOLERANCE
                || sizes.iter().any(|d| (d - size).abs() > TOLERANCE)
            {
                return None;
            }
            let fit = (limit / size + TOLERANCE).floor();
            Some(if fit >= sizes.len() as f64 {
                sizes.len()
            } else {
                fit as usize
            })
        })
        .collect()
}

/// The ops in an order where each follows its dependencies (Kahn's, lowest index first).
fn topological(ops: &[OpInfo]) -> Vec<OpIndex> {
    let mut missing: Vec<usize> = ops.iter().map(|o| o.preds.len()).collect();
    let mut ready: std::collections::BTreeSet<OpIndex> =
        (0..ops.len()).filter(|&o| missing[o] == 0).collect();
    let mut out = Vec::with_capacity(ops.len());
    while let Some(op) = ready.pop_first() {
        out.push(op);
        for e in &ops[op].succs {
            missing[e.op] -= 1;
            if missing[e.op] == 0 {
                ready.insert(e.op);
            }
        }
    }
    out
}
