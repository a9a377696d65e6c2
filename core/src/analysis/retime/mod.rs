//! A replay kept up to date while a pass edits ranks' orders ([`Retimer`]): the times the replay
//! engine ([`crate::analysis::replay`]) gives the edited plan, and where asked each task's slack
//! as [`crate::analysis::slack`] computes it, bit for bit, without replaying the whole plan after
//! each edit.
//!
//! Why: a pass that decides rank by rank on a fresh simulation (the relief loop behind
//! `recompute` and `offload`, the reload hoisting of `offload`) replayed and re-analysed the
//! whole plan per decision, which at a thousand ranks is quadratic. An edit changes the times
//! only of the tasks downstream of it, and the latest times only of the tasks upstream; the
//! retimer re-evaluates exactly those, in a topological order of the dependency graph
//! (`graph.rs`: the engine's and the slack's rules as edges), stopping wherever a value comes out
//! unchanged. Every value is the same maximum (or minimum) of the same float expressions as the
//! engine's and the slack's, so the results are identical; a change of the makespan moves every
//! latest time, and then the latest times are computed afresh.
//!
//! Use: [`Retimer::new`] replays a plan once (with [`Retimer::with_slack`], its latest times
//! too); [`Retimer::insert`] and [`Retimer::move_task`] edit one rank's order; [`Retimer::settle`]
//! brings every time up to date (the readers expect a settled retimer, and settle first where they
//! need to). [`Retimer::begin`] opens a trial that [`Retimer::rollback`] undoes and
//! [`Retimer::commit`] keeps.
//!
//! Files: this one holds the state, the readers and the edits; `graph.rs` the edges, `links.rs`
//! what they read of a rank's host link and reloads; `settle.rs` the topological keys and the
//! propagation; `tests.rs` the differential tests against a full replay and slack.

mod graph;
mod links;
mod settle;
#[cfg(test)]
mod tests;

use crate::analysis::replay::{replay, ReplayError, TimedTask};
use crate::ir::cost::CostModel;
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{OpKind, Task};
use crate::ir::plan::Plan;
use links::RankLinks;
use std::ops::ControlFlow;

/// No position, rank or producer.
const NONE: usize = usize::MAX;
/// The key of a task added since the last settle.
const UNSET: u64 = u64::MAX;

/// A plan's replay (and optionally slack) kept up to date under edits of its orders (see the
/// module doc).
#[derive(Clone, Debug)]
pub struct Retimer {
    links: Links,
    costs: CostModel,
    /// Whether tasks have all-to-alls around them (a mixture of experts).
    a2a: bool,
    comm: f64,
    orders: Vec<Vec<Task>>,
    /// Per rank, its tasks with their times (sequence numbers are not kept: 0).
    rows: Vec<Vec<TimedTask>>,
    /// Per rank, per task, its place in a topological order of the graph.
    keys: Vec<Vec<u64>>,
    /// Per rank, per task, its latest start (empty rows when slack is not kept).
    latest: Vec<Vec<f64>>,
    /// Per rank, per task, the last propagation that queued it ([`Retimer::epoch`]).
    marks: Vec<Vec<u32>>,
    /// The number of the current propagation.
    epoch: u32,
    keeps_slack: bool,
    transfers: Vec<RankLinks>,
    /// Per op slot, the rank and position of the task that runs it.
    at_op: Vec<(usize, usize)>,
    dependents: Dependents,
    rank_end: Vec<f64>,
    makespan: f64,
    /// Per rank, the first position edited since the last settle (NONE: none).
    edited: Vec<usize>,
    journal: Option<Journal>,
}

/// Per op slot, the slots of the ops that depend on it (compressed rows).
#[derive(Clone, Debug)]
struct Dependents {
    start: Vec<u32>,
    list: Vec<u32>,
}

impl Dependents {
    fn of(plan: &Plan, links: &Links) -> Dependents {
        let slots = links.slots().len();
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        for task in plan.orders().iter().flatten() {
            let _ = task.try_for_each_op(|op| {
                if let Some(slot) = links.slot(op) {
                    let _ = links.try_for_each_dep(op, |_, dep| {
                        pairs.push((dep as u32, slot as u32));
                        ControlFlow::<()>::Continue(())
                    });
                }
                ControlFlow::<()>::Continue(())
            });
        }
        pairs.sort_unstable();
        pairs.dedup();
        let mut start = vec![0u32; slots + 1];
        for &(dep, _) in &pairs {
            start[dep as usize + 1] += 1;
        }
        for k in 0..slots {
            start[k + 1] += start[k];
        }
        Dependents {
            start,
            list: pairs.into_iter().map(|(_, slot)| slot).collect(),
        }
    }

    fn of_slot(&self, slot: usize) -> &[u32] {
        match (self.start.get(slot), self.start.get(slot + 1)) {
            (Some(&a), Some(&b)) => &self.list[a as usize..b as usize],
            _ => &[],
        }
    }
}

/// What [`Retimer::rollback`] restores: the rows of the ranks edited during the trial as they
/// were, and the values of other tasks that changed.
#[derive(Clone, Debug)]
struct Journal {
    rows: Vec<SavedRow>,
    /// `(rank, position, start, end, latest)` before a change, in the order of the changes.
    cells: Vec<(usize, usize, f64, f64, f64)>,
    rank_end: Vec<f64>,
    makespan: f64,
    renumbered: bool,
}

#[derive(Clone, Debug)]
struct SavedRow {
    rank: usize,
    order: Vec<Task>,
    row: Vec<TimedTask>,
    keys: Vec<u64>,
    latest: Vec<f64>,
}

impl Retimer {
    /// The retimer of `plan`, its times those of a full replay; the replay's error where the
    /// plan cannot run.
    pub fn new(plan: &Plan) -> Result<Retimer, ReplayError> {
        let costs = plan.costs().clone();
        // The engine's checks (ops in range, none run twice, no deadlock) first.
        replay(plan, |t| costs.task_duration(t), costs.comm(), false)?;
        let links = Links::of(plan.problem());
        let ranks = plan.orders().len();
        let mut retimer = Retimer {
            dependents: Dependents::of(plan, &links),
            at_op: vec![(NONE, NONE); links.slots().len()],
            comm: costs.comm(),
            a2a: costs.has_a2a(),
            costs,
            orders: plan.orders().to_vec(),
            rows: Vec::new(),
            keys: plan.orders().iter().map(|o| vec![UNSET; o.len()]).collect(),
            latest: vec![Vec::new(); ranks],
            marks: plan.orders().iter().map(|o| vec![0; o.len()]).collect(),
            epoch: 0,
            keeps_slack: false,
            transfers: vec![RankLinks::default(); ranks],
            links,
            rank_end: vec![0.0; ranks],
            makespan: 0.0,
            edited: vec![NONE; ranks],
            journal: None,
        };
        retimer.rows = retimer
            .orders
            .iter()
            .map(|o| o.iter().map(|&task| unset_timed(task)).collect())
            .collect();
        for r in 0..ranks {
            retimer.refresh_rank(r);
        }
        retimer.renumber_and_time()?;
        Ok(retimer)
    }

    /// The same retimer keeping every task's slack as well (for [`Retimer::slack`]).
    pub fn with_slack(mut self) -> Retimer {
        self.keeps_slack = true;
        self.latest = self
            .rows
            .iter()
            .map(|row| vec![f64::NAN; row.len()])
            .collect();
        self.recompute_latest();
        self
    }

    /// Every rank's order as edited.
    pub fn orders(&self) -> &[Vec<Task>] {
        &self.orders
    }

    /// Rank `rank`'s order as edited.
    pub fn order(&self, rank: usize) -> &[Task] {
        &self.orders[rank]
    }

    /// Rank `rank`'s tasks with their times, as a replay of the edited plan gives them (settled:
    /// see [`Retimer::settle`]).
    pub fn timeline(&self, rank: usize) -> &[TimedTask] {
        debug_assert!(self.edited.iter().all(|&e| e == NONE), "read unsettled");
        &self.rows[rank]
    }

    /// When the last task ends (settled).
    pub fn makespan(&self) -> f64 {
        debug_assert!(self.edited.iter().all(|&e| e == NONE), "read unsettled");
        self.makespan
    }

    /// Per task of rank `rank`'s order, how much later it could start without the plan ending
    /// later, as [`crate::analysis::slack`] gives it (settled); empty unless built
    /// [`Retimer::with_slack`].
    pub fn slack(&self, rank: usize) -> Vec<f64> {
        debug_assert!(self.edited.iter().all(|&e| e == NONE), "read unsettled");
        if !self.keeps_slack {
            return Vec::new();
        }
        self.rows[rank]
            .iter()
            .zip(&self.latest[rank])
            .map(|(t, &latest)| (latest - t.start).max(0.0))
            .collect()
    }

    /// Inserts `task` (a residency task of a pair that exists) before position `position` of
    /// rank `rank`'s order (at its end for the order's length). Errors as a replay would.
    pub fn insert(&mut self, rank: usize, position: usize, task: Task) -> Result<(), ReplayError> {
        let w = task.work();
        if !task.is_residency() || !self.links.has_work(w.stage, w.microbatch) {
            let op = w.op(OpKind::Forward);
            return Err(ReplayError::OutOfRange(
                RankId::new(rank as u32),
                position,
                op,
            ));
        }
        self.save_row(rank);
        self.orders[rank].insert(position, task);
        self.rows[rank].insert(position, unset_timed(task));
        self.keys[rank].insert(position, UNSET);
        self.marks[rank].insert(position, 0);
        if self.keeps_slack {
            self.latest[rank].insert(position, f64::NAN);
        }
        self.edited[rank] = self.edited[rank].min(position);
        Ok(())
    }

    /// Moves rank `rank`'s residency task at `from` to index `to` of the order without it (as
    /// `Vec::remove` then `Vec::insert`).
    pub fn move_task(&mut self, rank: usize, from: usize, to: usize) {
        debug_assert!(self.orders[rank][from].is_residency());
        self.save_row(rank);
        let task = self.orders[rank].remove(from);
        self.orders[rank].insert(to, task);
        self.rows[rank].remove(from);
        self.rows[rank].insert(to, unset_timed(task));
        self.keys[rank].remove(from);
        self.keys[rank].insert(to, UNSET);
        self.marks[rank].remove(from);
        self.marks[rank].insert(to, 0);
        if self.keeps_slack {
            self.latest[rank].remove(from);
            self.latest[rank].insert(to, f64::NAN);
        }
        self.edited[rank] = self.edited[rank].min(from.min(to));
    }

    /// Opens a trial: the edits from here are undone by [`Retimer::rollback`], kept by
    /// [`Retimer::commit`]. Settle before.
    pub fn begin(&mut self) {
        debug_assert!(
            self.edited.iter().all(|&e| e == NONE),
            "a trial opens settled"
        );
        self.journal = Some(Journal {
            rows: Vec::new(),
            cells: Vec::new(),
            rank_end: self.rank_end.clone(),
            makespan: self.makespan,
            renumbered: false,
        });
    }

    /// Keeps the trial's edits.
    pub fn commit(&mut self) {
        self.journal = None;
    }

    /// Undoes the trial's edits and their effects (a no-op without a trial).
    pub fn rollback(&mut self) {
        let Some(journal) = self.journal.take() else {
            return;
        };
        for &(r, i, start, end, latest) in journal.cells.iter().rev() {
            if journal.rows.iter().any(|s| s.rank == r) {
                continue;
            }
            self.rows[r][i].start = start;
            self.rows[r][i].end = end;
            if self.keeps_slack {
                self.latest[r][i] = latest;
            }
        }
        for saved in journal.rows {
            let r = saved.rank;
            self.orders[r] = saved.order;
            self.rows[r] = saved.row;
            self.keys[r] = saved.keys;
            self.latest[r] = saved.latest;
            self.marks[r] = vec![0; self.orders[r].len()];
            self.edited[r] = NONE;
            self.refresh_rank(r);
        }
        self.rank_end = journal.rank_end;
        self.makespan = journal.makespan;
        if journal.renumbered {
            self.renumber();
        }
    }

    /// Saves rank `rank`'s row into the open trial's journal, once per trial.
    fn save_row(&mut self, rank: usize) {
        let Some(journal) = self.journal.as_mut() else {
            return;
        };
        if journal.rows.iter().any(|s| s.rank == rank) {
            return;
        }
        // Settled values: an edit only follows a settle or another edit of a saved row.
        journal.rows.push(SavedRow {
            rank,
            order: self.orders[rank].clone(),
            row: self.rows[rank].clone(),
            keys: self.keys[rank].clone(),
            latest: self.latest[rank].clone(),
        });
    }

    /// Rebuilds what is read from rank `r`'s order: its link and where its ops run.
    fn refresh_rank(&mut self, r: usize) {
        self.transfers[r] = RankLinks::of(&self.orders[r], &self.links);
        for (i, task) in self.orders[r].iter().enumerate() {
            let _ = task.try_for_each_op(|op| {
                if let Some(slot) = self.links.slot(op) {
                    self.at_op[slot] = (r, i);
                }
                ControlFlow::<()>::Continue(())
            });
        }
    }

    /// How long `task` runs.
    fn duration(&self, task: &Task) -> f64 {
        self.costs.task_duration(task)
    }
}

/// `task` with no times yet.
fn unset_timed(task: Task) -> TimedTask {
    TimedTask {
        task,
        start: f64::NAN,
        end: f64::NAN,
        sequence: 0,
    }
}
