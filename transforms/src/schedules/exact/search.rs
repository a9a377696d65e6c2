//! The depth-first branch and bound of the exact search.
//!
//! **Branching** (Giffler and Thompson's active schedules, with memory): among the unplaced ops
//! whose inputs are placed and which fit their rank's memory, the one that can end first fixes
//! the time `C` and its rank; that rank's next op is one of those that can start before `C`
//! (each a branch, placed as early as it can start). Without a memory limit that covers an
//! optimal schedule: any other next op starts at `C` or later, and moving the op that ends at `C`
//! in front of it delays nothing. With a limit the move is only safe when that op frees memory;
//! when it takes memory (a forward), one more branch lets the rank run nothing before `C`.
//!
//! **Pruning**: a node whose lower bound ([`super::node_bound`]) is no better than the best
//! schedule found is cut, and so is a node whose placed ops an earlier node placed with every
//! time the future depends on no later ([`super::state::State::frontier`]; a transposition table,
//! of bounded size). Children are tried best bound first (then earliest start, then op order):
//! the search is deterministic.
//!
//! **Stopping**: at the deadline or the node budget the search returns the best schedule found and, as its proven
//! lower bound, the least bound of the nodes it left unexplored; run to the end, the bound is the
//! best makespan itself.

use super::model::{Model, OpIndex};
use super::node_bound::{node_bound, Scratch};
use super::state::State;
use pipeweave_core::TOLERANCE;
use std::collections::HashMap;
use std::time::Instant;

/// How many node frontiers the transposition table keeps at most (all keys together), and per
/// set of placed ops.
const TABLE_ENTRIES: usize = 400_000;
const PER_KEY: usize = 12;

/// A child of a node.
#[derive(Clone, Copy, Debug)]
enum Child {
    /// Place the op from the given start.
    Place(OpIndex, f64),
    /// Run nothing on the rank before the given time.
    Delay(usize, f64),
}

/// What the search found.
#[derive(Clone, Debug)]
pub(super) struct Found {
    /// A better schedule than the incumbent, as per-rank op orders (None: none found).
    pub orders: Option<Vec<Vec<OpIndex>>>,
    /// Its makespan (the incumbent's when none was found).
    pub best: f64,
    /// No schedule of the problem ends before this.
    pub bound: f64,
    /// Whether the search ran to the end (then `bound == best`).
    pub complete: bool,
    /// Nodes visited.
    pub nodes: u64,
    /// Nodes visited when the best was found (0: none better than the incumbent).
    pub found_at: u64,
}

/// The search's working state.
struct Search<'m> {
    model: &'m Model,
    state: State,
    scratch: Scratch,
    best: f64,
    best_orders: Option<Vec<Vec<OpIndex>>>,
    found_at: u64,
    table: HashMap<Vec<u64>, Vec<Box<[f64]>>>,
    stored: usize,
    frontier: Vec<f64>,
    nodes: u64,
    deadline: Option<Instant>,
    max_nodes: u64,
    stopped: bool,
    open_bound: f64,
}

/// Searches `model` for a schedule ending before `incumbent` (the makespan to beat) until
/// `deadline` or after `max_nodes` nodes, whichever comes first.
pub(super) fn branch_and_bound(
    model: &Model,
    incumbent: f64,
    deadline: Option<Instant>,
    max_nodes: u64,
) -> Found {
    let mut search = Search {
        model,
        state: State::new(model),
        scratch: Scratch::default(),
        best: incumbent,
        best_orders: None,
        found_at: 0,
        table: HashMap::new(),
        stored: 0,
        frontier: Vec::new(),
        nodes: 0,
        deadline,
        max_nodes,
        stopped: false,
        open_bound: f64::INFINITY,
    };
    let root = node_bound(model, &search.state, &mut search.scratch);
    if root < search.best - TOLERANCE {
        search.visit(root);
    }
    let complete = !search.stopped;
    // Run to the end, the best is optimal; stopped, no schedule beats the least bound left open
    // (nor the root's).
    let bound = if complete {
        search.best
    } else {
        search
            .best
            .min(search.open_bound)
            .max(root.min(search.best))
    };
    Found {
        orders: search.best_orders,
        best: search.best,
        bound,
        complete,
        nodes: search.nodes,
        found_at: search.found_at,
    }
}

impl Search<'_> {
    /// Explores the current state, whose lower bound is `bound`.
    fn visit(&mut self, bound: f64) {
        self.nodes += 1;
        if self.nodes > self.max_nodes
            || (self.nodes % 256 == 0 && self.deadline.is_some_and(|d| Instant::now() >= d))
        {
            self.stopped = true;
        }
        if self.stopped {
            self.open_bound = self.open_bound.min(bound);
            return;
        }
        if self.state.unplaced() == 0 {
            let makespan = self.state.makespan();
            if makespan < self.best - TOLERANCE {
                self.best = makespan;
                self.best_orders = Some(self.state.orders().to_vec());
                self.found_at = self.nodes;
            }
            return;
        }
        if self.dominated() {
            return;
        }
        let mut children = self.children();
        children.sort_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then(a.1.total_cmp(&b.1))
                .then(a.2.cmp(&b.2))
        });
        for (k, &(child_bound, _, _, child)) in children.iter().enumerate() {
            if child_bound >= self.best - TOLERANCE {
                continue;
            }
            let step = self.apply(child);
            self.visit(child_bound);
            self.state.undo(self.model, step);
            if self.stopped {
                let rest = children[k + 1..]
                    .iter()
                    .map(|c| c.0)
                    .filter(|&b| b < self.best - TOLERANCE)
                    .fold(f64::INFINITY, f64::min);
                self.open_bound = self.open_bound.min(rest);
                return;
            }
        }
    }

    fn apply(&mut self, child: Child) -> super::state::Step {
        match child {
            Child::Place(op, start) => self.state.place(self.model, op, start),
            Child::Delay(rank, to) => self.state.delay(rank, to),
        }
    }

    /// The children of the current state with their bounds, earliest starts and a tie-break
    /// (see the module doc); those whose bound cannot beat the best are left out.
    fn children(&mut self) -> Vec<(f64, f64, usize, Child)> {
        let model = self.model;
        let state = &self.state;
        // The op that can end first among those ready and within memory.
        let mut first: Option<(f64, usize, OpIndex)> = None;
        for (op, info) in model.ops.iter().enumerate() {
            if state.is_placed(op) || !state.inputs_placed(op) || !self.fits(op) {
                continue;
            }
            let end = state.earliest_start(model, op) + info.duration;
            let key = (end, info.rank, op);
            if first.is_none_or(|f| {
                key.0 < f.0 - TOLERANCE || ((key.0 - f.0).abs() <= TOLERANCE && key.1 < f.1)
            }) {
                first = Some(key);
            }
        }
        let Some((end_first, rank, op_first)) = first else {
            // Nothing can run: the memory limit deadlocks this partial schedule.
            return Vec::new();
        };
        let mut options: Vec<(f64, usize, Child)> = Vec::new();
        for (op, info) in model.ops.iter().enumerate() {
            if info.rank != rank
                || state.is_placed(op)
                || !state.inputs_placed(op)
                || !self.fits(op)
            {
                continue;
            }
            let start = state.earliest_start(model, op);
            if op == op_first || start < end_first - TOLERANCE {
                options.push((start, op, Child::Place(op, start)));
            }
        }
        if model.ops[op_first].delta > TOLERANCE && end_first > state.free(rank) + TOLERANCE {
            options.push((end_first, usize::MAX, Child::Delay(rank, end_first)));
        }
        let mut out = Vec::with_capacity(options.len());
        for (start, tie, child) in options {
            let step = self.apply(child);
            let bound = node_bound(self.model, &self.state, &mut self.scratch);
            self.state.undo(self.model, step);
            if bound < self.best - TOLERANCE {
                out.push((bound, start, tie, child));
            }
        }
        out
    }

    /// Whether `op` fits its rank's memory now.
    fn fits(&self, op: OpIndex) -> bool {
        let info = &self.model.ops[op];
        info.delta <= TOLERANCE
            || self.state.held(info.rank) + info.delta <= self.model.limit + TOLERANCE
    }

    /// Whether an earlier node placed the same ops no later in every time that matters; else
    /// records this one (while the table has room).
    fn dominated(&mut self) -> bool {
        self.state.frontier(self.model, &mut self.frontier);
        let current = &self.frontier;
        let no_later = |seen: &[f64], now: &[f64]| {
            seen.len() == now.len() && seen.iter().zip(now).all(|(a, b)| *a <= *b + TOLERANCE)
        };
        if let Some(seen) = self.table.get_mut(self.state.bits()) {
            if seen.iter().any(|s| no_later(s, current)) {
                return true;
            }
            let before = seen.len();
            seen.retain(|s| !no_later(current, s));
            self.stored -= before - seen.len();
            if seen.len() < PER_KEY && self.stored < TABLE_ENTRIES {
                seen.push(current.clone().into_boxed_slice());
                self.stored += 1;
            }
        } else if self.stored < TABLE_ENTRIES {
            self.table.insert(
                self.state.bits().to_vec(),
                vec![current.clone().into_boxed_slice()],
            );
            self.stored += 1;
        }
        false
    }
}
