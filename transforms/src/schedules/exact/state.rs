//! The exact search's partial schedule: which ops are placed and when they end, every rank's
//! clock, held activations and order, and which unplaced ops have all their inputs placed.
//! Every change is undone in reverse, so one state serves the whole depth-first search.

use super::model::{Model, OpIndex};

/// A change [`State::undo`] reverses.
#[derive(Clone, Copy, Debug)]
pub(super) enum Step {
    /// `op` was placed; the rank's clock was `free` before.
    Placed { op: OpIndex, free: f64 },
    /// `rank`'s clock was moved on from `free`.
    Delayed { rank: usize, free: f64 },
}

/// A partial schedule.
#[derive(Clone, Debug)]
pub(super) struct State {
    /// End of each op (NaN: not placed).
    ends: Vec<f64>,
    /// Unplaced inputs of each op.
    missing: Vec<u32>,
    free: Vec<f64>,
    held: Vec<f64>,
    orders: Vec<Vec<OpIndex>>,
    /// Placed ops as bits, for the transposition table.
    bits: Vec<u64>,
    unplaced: usize,
}

impl State {
    /// Nothing placed.
    pub fn new(model: &Model) -> State {
        let n = model.ops.len();
        State {
            ends: vec![f64::NAN; n],
            missing: model.ops.iter().map(|o| o.preds.len() as u32).collect(),
            free: vec![0.0; model.ranks],
            held: vec![0.0; model.ranks],
            orders: vec![Vec::new(); model.ranks],
            bits: vec![0; n.div_ceil(64)],
            unplaced: n,
        }
    }

    pub fn is_placed(&self, op: OpIndex) -> bool {
        !self.ends[op].is_nan()
    }

    /// When `op` ended (None: not placed).
    pub fn end(&self, op: OpIndex) -> Option<f64> {
        let t = self.ends[op];
        (!t.is_nan()).then_some(t)
    }

    /// Whether every input of `op` is placed.
    pub fn inputs_placed(&self, op: OpIndex) -> bool {
        self.missing[op] == 0
    }

    pub fn free(&self, rank: usize) -> f64 {
        self.free[rank]
    }

    pub fn held(&self, rank: usize) -> f64 {
        self.held[rank]
    }

    pub fn unplaced(&self) -> usize {
        self.unplaced
    }

    pub fn bits(&self) -> &[u64] {
        &self.bits
    }

    pub fn orders(&self) -> &[Vec<OpIndex>] {
        &self.orders
    }

    /// The largest clock: the makespan once every op is placed.
    pub fn makespan(&self) -> f64 {
        self.free.iter().copied().fold(0.0, f64::max)
    }

    /// The earliest `op` can start now: its rank's clock and its inputs' arrivals. Every input
    /// must be placed.
    pub fn earliest_start(&self, model: &Model, op: OpIndex) -> f64 {
        let info = &model.ops[op];
        info.preds
            .iter()
            .map(|e| self.ends[e.op] + e.latency)
            .fold(self.free[info.rank], f64::max)
    }

    /// Places `op` from `start` on its rank.
    pub fn place(&mut self, model: &Model, op: OpIndex, start: f64) -> Step {
        let info = &model.ops[op];
        let rank = info.rank;
        let step = Step::Placed {
            op,
            free: self.free[rank],
        };
        let end = start + info.duration;
        self.ends[op] = end;
        self.free[rank] = end;
        self.held[rank] += info.delta;
        self.orders[rank].push(op);
        self.bits[op / 64] |= 1 << (op % 64);
        self.unplaced -= 1;
        for e in &info.succs {
            self.missing[e.op] -= 1;
        }
        step
    }

    /// Moves `rank`'s clock on to `to`: nothing more starts there before.
    pub fn delay(&mut self, rank: usize, to: f64) -> Step {
        let step = Step::Delayed {
            rank,
            free: self.free[rank],
        };
        self.free[rank] = self.free[rank].max(to);
        step
    }

    /// Reverses `step` (the last change not yet reversed).
    pub fn undo(&mut self, model: &Model, step: Step) {
        match step {
            Step::Placed { op, free } => {
                let info = &model.ops[op];
                self.ends[op] = f64::NAN;
                self.free[info.rank] = free;
                self.held[info.rank] -= info.delta;
                self.orders[info.rank].pop();
                self.bits[op / 64] &= !(1 << (op % 64));
                self.unplaced += 1;
                for e in &info.succs {
                    self.missing[e.op] += 1;
                }
            }
            Step::Delayed { rank, free } => self.free[rank] = free,
        }
    }

    /// The times the future depends on, for comparing two states with the same ops placed:
    /// every rank's clock, then the end of every placed op with an unplaced successor (in op
    /// order). A state whose times are all no later is at least as good.
    pub fn frontier(&self, model: &Model, out: &mut Vec<f64>) {
        out.clear();
        out.extend_from_slice(&self.free);
        for (op, info) in model.ops.iter().enumerate() {
            if self.is_placed(op) && info.succs.iter().any(|e| !self.is_placed(e.op)) {
                out.push(self.ends[op]);
            }
        }
    }
}
