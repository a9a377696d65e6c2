//! `offload(schedule, memory=N)`: activation offloading chosen per (stage, microbatch) pair, so
//! that every rank's device peak fits `N`.
//!
//! Source: PipeOffload (Wan et al. 2025), which offloads what the host link can hide behind the
//! pipeline's computes. An offloaded pair's activations leave the device over the rank's host link
//! right after its forward (`OFFLOAD`) and come back before its backward (`RELOAD`), each transfer
//! taking the cost key `offload` (default F). Transfers run on the link one at a time, beside the
//! computes; a backward waits for its reload, and a task that allocates (a forward, a recompute)
//! waits for the offloads before it, so the memory they free is free by then (see
//! `pipeweave_core::analysis::replay`). Host memory holds what is offloaded (reported per rank).
//!
//! Which pairs: the relief loop of [`crate::schedules::relief`]. At the first task where a rank
//! holds more than `N`, every pair held across it is a candidate (what a W keeps, held from its
//! input-gradient backward to its late W in zero-bubble plans, is a pair's second window, moved out
//! right after the I and back before the W): offloaded right after its forward
//! and reloaded right after the last task of its window that breaks the limit (as early as memory
//! allows, so the transfer has the most time to finish before the backward). Each is estimated by
//! the stalls its transfers would cause (the next allocation waiting for the offload, the backward
//! for the reload) beyond those tasks' slack, and the cheapest are taken until the break fits;
//! every break of the rank in one sweep, then the plan is simulated again for the next rank's
//! estimates; repeated until the plan fits (with activations alone, and with what Ws keep as well:
//! the latter is kept only where it is the faster, see `relief.rs`). While breaks remain, a reload lands late (right after
//! the last break of its window, often right before its backward); once the plan fits, each
//! reload in turn moves as early as the limit allows, or to where it is issued just in time for
//! its backward, where a simulation shows the plan no slower for it (a rank's reloads are first
//! all moved as early as the limit allows and checked by one replay; move by move only where
//! that is slower, and a move that passes no other transfer needs no replay, as it cannot make
//! any task later). Then each offload sinks as late as the limit allows without passing another
//! transfer: it is issued at its forward's end wherever it sits, and its place is where the
//! device copy is freed (PipeOffload's offload end), so the forwards between no longer wait for
//! it. The estimates decide alone
//! (the relief loop's default of one proposal simulated per step): the estimate of a transfer's
//! stalls ranks them as well as a simulation does (measured over 1F1B and ZB-V, unit and latency
//! costs), at a third of the time.
//!
//! The pass is [`Relief<Offload>`](super::Relief) (`relief.rs`: the argument, the contract and
//! the limit it shares with `recompute`); this file holds the strategy.
//! Requires: a scheduled plan (any pacing but unscheduled), any layout, split or whole backwards,
//! no offload yet (recomputed pairs are left as they are). May change: the orders, the residency
//! fact, the declared memory limit (`N`, or the lower of `N` and `--memory-limit`).
//! Preconditions: `N > 0`; a limit (`memory=N` or a declared one) that offloading can reach: the
//! error names the least it reaches on the plan.
//!
//! 1F1B at 2 ranks and 3 microbatches, `memory=1`, unit costs (transfers too), after; the rows
//! under each rank are its link (`O` offload, `L` reload). A forward waits for the offload before
//! it to free its memory; the reloads end before their backwards.
//! ```text
//! rank  0 | F0 .  F1 .  .  B0 ~  F2 .  .  B1 ~  .  B2 ~
//!    link | .  O0 .  O1 L0 .  .  .  O2 L1 .  .  L2 .  .
//! rank  1 | .  F0 B0 ~  F1 B1 ~  .  F2 B2 ~  .  .  .  .
//!    link | .  .  .  .  .  .  .  .  .  .  .  .  .  .  .
//! ```

use super::relief::ReliefStrategy;
use crate::pass::Requires;
use crate::schedules::relief::{
    issued_at, reordered, Proposal, Reach, Span, Step, Window, EPSILON,
};
use pipeweave_core::analysis::peak::held_along;
use pipeweave_core::analysis::retime::Retimer;
use pipeweave_core::{moved_by, OpKind, Plan, Residency, Task, TimedTask, Work};

/// How many reload moves [`Hoisting::hoist_with`] makes per task of a rank's order at most.
const MAX_HOISTS_PER_TASK: usize = 4;

/// The offload strategy: `offload` is [`Relief<Offload>`](super::Relief), built with
/// `Relief::new(Offload, memory)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offload;

/// The offload of `window`'s pair right after its forward and its reload before the task at
/// `reload_at`.
fn transfers(window: &Window, reload_at: usize) -> Vec<(usize, Task)> {
    vec![
        (window.forward + 1, Task::Offload(window.work)),
        (reload_at, Task::Reload(window.work)),
    ]
}

/// When the task at `position` of a rank's timeline starts.
fn start_of(timeline: &[TimedTask], position: usize) -> f64 {
    timeline.get(position).map_or(f64::INFINITY, |t| t.start)
}

impl ReliefStrategy for Offload {
    const NAME: &'static str = "offload";
    const DONE: &'static str = "offloaded";
    /// Kept, or recomputed (left as they are).
    const ACCEPTS: &'static [Residency] = Requires::KEPT_OR_RECOMPUTED;
    /// What a W keeps too, moved out between its I and W.
    fn reach(&self, _plan: &Plan) -> Reach {
        Reach::WeightGrads
    }

    /// The pair offloaded after its forward and reloaded after the last break of its window,
    /// estimated by the stalls its transfers would cause on an idle link.
    fn propose(&self, step: &Step<'_>, window: &Window) -> Proposal {
        let (timeline, order) = (step.timeline, step.order);
        let transfer = step.plan.costs().task_duration(&Task::Offload(window.work));
        let reload_at = step.last_break_in(window) + 1;
        let offloaded = timeline[window.forward].end + transfer;
        let fence_stall = (window.forward + 1..order.len())
            .find(|&p| order[p].allocates())
            .map_or(0.0, |p| {
                let waits = offloaded - start_of(timeline, p);
                (waits - step.slack[p]).max(0.0)
            });
        let issued = issued_at(timeline, reload_at);
        let backward = start_of(timeline, window.backward);
        let reload_stall = (issued + transfer - backward - step.slack[window.backward]).max(0.0);
        Proposal {
            estimate: fence_stall + reload_stall,
            relieves: step
                .plan
                .memory()
                .of(window.work.stage, window.work.microbatch)
                .map_or(0.0, |m| {
                    moved_by(step.plan, &m, window.span == Span::WeightGrad)
                }),
            frees: window.forward + 1..reload_at,
            work: window.work,
            inserted: transfers(window, reload_at),
        }
    }

    fn relieve_whole(&self, window: &Window) -> Vec<(usize, Task)> {
        transfers(window, window.backward)
    }

    /// Each reload moved as early as the limit allows where the plan is no slower for it (see
    /// the module doc).
    fn finish(&self, plan: Plan, limit: f64) -> Plan {
        hoist_reloads(plan, limit)
    }
}

/// Moves each reload (rank by rank, in order) earlier where the limit allows and a replay shows
/// the plan no slower: to the earliest place the memory allows, else to the last place from
/// which it is issued early enough to end before its backward starts. Each rank's reloads are
/// first all moved to their earliest places and checked by one replay ([`Hoisting::hoist_on`]);
/// a move that passes no other transfer needs no replay (see [`passes_no_transfer`]). The
/// replays are a [`Retimer`]'s, which re-times only what a move reaches (the same times as a
/// full replay), and a move that loses is rolled back.
fn hoist_reloads(plan: Plan, limit: f64) -> Plan {
    let Ok(timer) = Retimer::new(&plan) else {
        return plan;
    };
    let mut hoisting = Hoisting {
        makespan: timer.makespan(),
        plan: &plan,
        timer,
        stale: false,
    };
    for rank in 0..plan.orders().len() {
        hoisting.hoist_on(rank, limit);
    }
    for rank in 0..plan.orders().len() {
        hoisting.sink_on(rank, limit);
    }
    let orders = hoisting.timer.orders();
    if orders == plan.orders() {
        return plan;
    }
    // Moving transfers within their windows keeps the plan a plan (and its facts).
    reordered(&plan, orders.to_vec()).unwrap_or(plan)
}

/// Whether moving the transfer at `position` of `order` to `target` (its index once removed)
/// passes no other transfer. Such a move cannot make any task later: a reload moved earlier is
/// issued after an earlier compute (or the same one), behind the same transfer on the link, and
/// nothing but its backward and the transfers after it wait for it (no allocation waits for a
/// reload); an offload moved later is issued as before (at its forward's end), behind the same
/// transfer, and only frees the allocations it passes from waiting for it. So the plan is no
/// slower without replaying it.
fn passes_no_transfer(order: &[Task], position: usize, target: usize) -> bool {
    let passed = if target < position {
        &order[target..position]
    } else {
        &order[position + 1..=target]
    };
    !passed.iter().any(Task::on_link)
}

/// A reload found by [`Hoisting::reload_at`].
struct Reload {
    /// The earliest place the limit allows it.
    earliest: usize,
    /// The position of the backward that waits for it, if any.
    backward: Option<usize>,
}

/// The state of [`hoist_reloads`]: the orders as moved so far with their times, and the
/// makespan to beat.
struct Hoisting<'p> {
    /// The plan the hoisting started from: its problem, costs and memory.
    plan: &'p Plan,
    /// Its orders as moved so far, timed.
    timer: Retimer,
    /// Whether moves were taken without a replay since the last one (`makespan` predates them).
    stale: bool,
    /// The makespan of the last replay.
    makespan: f64,
}

impl Hoisting<'_> {
    /// Replays the moves taken without a replay, giving up when the plan ends after `bound`:
    /// whether the makespan is up to date (trivially so when nothing went stale).
    fn replay_stale(&mut self, bound: f64) -> bool {
        if !self.stale {
            return true;
        }
        if self.timer.settle().is_err() || self.timer.makespan() > bound {
            return false;
        }
        self.makespan = self.timer.makespan();
        self.stale = false;
        true
    }

    /// Takes the move of `rank`'s task at `position` to `target` without a replay.
    fn take_unreplayed(&mut self, rank: usize, position: usize, target: usize) {
        self.timer.move_task(rank, position, target);
        self.stale = true;
    }

    /// What `rank` holds during each of its tasks, as moved so far.
    fn held(&self, rank: usize) -> Vec<f64> {
        held_along(self.plan, self.timer.order(rank))
    }

    /// Hoists `rank`'s reloads in order (see [`hoist_reloads`]): first every reload to the
    /// earliest place the limit allows, checked by one replay; where that leaves the plan slower,
    /// move by move instead.
    fn hoist_on(&mut self, rank: usize, limit: f64) {
        let before = (self.stale, self.makespan);
        if self.timer.settle().is_err() {
            return;
        }
        self.timer.begin();
        // Every reload to its earliest place, unreplayed, then one replay.
        self.hoist_with(rank, limit, |h, position, reload| {
            h.take_unreplayed(rank, position, reload.earliest);
            true
        });
        if self.replay_stale(self.makespan + EPSILON) {
            self.timer.commit();
            return;
        }
        self.timer.rollback();
        (self.stale, self.makespan) = before;
        self.hoist_with(rank, limit, |h, position, Reload { earliest, backward }| {
            h.try_move(rank, position, earliest)
                || h.try_move_in_time(rank, position, earliest, backward)
        });
    }

    /// Walks `rank`'s reloads in order, giving each that can move earlier to `hoist` (which
    /// says whether it moved it). At most [`MAX_HOISTS_PER_TASK`] moves per task of the order:
    /// where pairs differ in size (sequence chunks split by cost), two reloads can pass each
    /// other in turn, each move leaving room for the other's; the walk ends there.
    fn hoist_with(
        &mut self,
        rank: usize,
        limit: f64,
        mut hoist: impl FnMut(&mut Self, usize, Reload) -> bool,
    ) {
        // What the rank holds during each task, kept until a move changes its order.
        let mut held = self.held(rank);
        let mut position = 0;
        let mut moves_left = MAX_HOISTS_PER_TASK * self.timer.order(rank).len();
        while position < self.timer.order(rank).len() {
            let moved = moves_left > 0
                && self
                    .reload_at(rank, position, &held, limit)
                    .filter(|reload| reload.earliest < position)
                    .is_some_and(|reload| hoist(self, position, reload));
            if moved {
                moves_left -= 1;
                held = self.held(rank);
            }
            // A moved reload sits earlier; the task now at `position` is the next to look at.
            position += usize::from(!moved);
        }
    }

    /// Moves each of `rank`'s offloads as late as the limit allows without passing another
    /// transfer (the pair's device copy freed right before the first task that needs its
    /// memory; the transfer is still issued at its forward's end). No replay is needed: such a
    /// move cannot make any task later (see [`passes_no_transfer`]).
    fn sink_on(&mut self, rank: usize, limit: f64) {
        let mut held = self.held(rank);
        let mut position = 0;
        while position < self.timer.order(rank).len() {
            let target = self.sink_target(rank, position, &held, limit);
            if let Some(target) = target {
                self.take_unreplayed(rank, position, target);
                held = self.held(rank);
            }
            // A sunk offload sits later; the task now at `position` is the next to look at.
            position += usize::from(target.is_none());
        }
    }

    /// Where the offload at `rank`'s `position` (if the task there is one) can sink to: the
    /// index (after its removal) right before the first later task during which the rank would
    /// hold more than `limit` with its pair still held, at most right before its reload; None
    /// when it cannot move.
    fn sink_target(&self, rank: usize, position: usize, held: &[f64], limit: f64) -> Option<usize> {
        let order = self.timer.order(rank);
        let Task::Offload(work) = order[position] else {
            return None;
        };
        let reload = (position + 1..order.len()).find(|&p| order[p] == Task::Reload(work))?;
        let (_, size) = self.carried(order, position, work);
        // Never past another transfer: the link keeps its order (and two offloads never trade
        // places back and forth).
        let mut latest = position + 1;
        while latest < reload && !order[latest].on_link() && held[latest] + size <= limit + EPSILON
        {
            latest += 1;
        }
        (latest - 1 > position).then_some(latest - 1)
    }

    /// The reload at `rank`'s `position`, if the task there is one: the earliest place from
    /// which every task up to it still fits `limit` with its pair held again (`held`: what the
    /// rank holds during each task), and the position of the backward that waits for it.
    fn reload_at(&self, rank: usize, position: usize, held: &[f64], limit: f64) -> Option<Reload> {
        let order = self.timer.order(rank);
        let Task::Reload(work) = order[position] else {
            return None;
        };
        let offloaded = order[..position]
            .iter()
            .rposition(|t| *t == Task::Offload(work))
            .unwrap_or(0);
        let (waiting, size) = self.carried(order, position, work);
        let mut earliest = position;
        while earliest > offloaded + 1 && held[earliest - 1] + size <= limit + EPSILON {
            earliest -= 1;
        }
        let backward = (position..order.len()).find(|&p| order[p].runs(work.op(waiting)));
        Some(Reload { earliest, backward })
    }

    /// What a transfer of `work`'s pair at `position` of `order` carries, and the backward that
    /// needs it on the device: what its W keeps where its I ran before (moved between its I and
    /// W), else its activations (needed by its I).
    fn carried(&self, order: &[Task], position: usize, work: Work) -> (OpKind, f64) {
        let memory = self
            .plan
            .memory()
            .of(work.stage, work.microbatch)
            .unwrap_or_default();
        let input = work.op(OpKind::InputGrad);
        let backed = order[..position].iter().any(|t| t.runs(input));
        let size = moved_by(self.plan, &memory, backed);
        if backed {
            (OpKind::WeightGrad, size)
        } else {
            (OpKind::InputGrad, size)
        }
    }

    /// Moves the reload at `rank`'s `position` to the last place from `earliest` on from which
    /// it is issued early enough to end before the backward at `backward` starts, where that
    /// leaves the plan no slower.
    fn try_move_in_time(
        &mut self,
        rank: usize,
        position: usize,
        earliest: usize,
        backward: Option<usize>,
    ) -> bool {
        self.replay_stale(f64::INFINITY);
        let timeline = self.timer.timeline(rank);
        let transfer = self
            .plan
            .costs()
            .task_duration(&self.timer.order(rank)[position]);
        let backward = backward.map_or(f64::INFINITY, |p| timeline[p].start);
        let in_time = (earliest..position)
            .rev()
            .find(|&p| issued_at(timeline, p) + transfer <= backward + EPSILON)
            .unwrap_or(earliest);
        in_time != earliest && self.try_move(rank, position, in_time)
    }

    /// Moves `rank`'s task at `position` to `target` where the plan stays no slower: taken
    /// without a replay where it passes no other transfer, else replayed (and rolled back where
    /// it ends after the makespan to beat).
    fn try_move(&mut self, rank: usize, position: usize, target: usize) -> bool {
        if passes_no_transfer(self.timer.order(rank), position, target) {
            self.take_unreplayed(rank, position, target);
            return true;
        }
        self.replay_stale(f64::INFINITY);
        self.timer.begin();
        self.timer.move_task(rank, position, target);
        let kept = self.timer.settle().is_ok() && self.timer.makespan() <= self.makespan + EPSILON;
        if kept {
            self.timer.commit();
            self.makespan = self.timer.makespan();
        } else {
            self.timer.rollback();
        }
        kept
    }
}

#[cfg(test)]
mod tests {
    use crate::error::TransformError;
    use crate::testing::built;
    use pipeweave_core::{max_peak, peak_per_rank, simulate, Plan, StageCostsSpec, Task};

    /// The plan `expression` builds at `ranks` x `microbatches`, unit costs and transfers of
    /// `transfer`.
    fn build(
        expression: &str,
        ranks: u32,
        microbatches: u32,
        transfer: f64,
    ) -> Result<Plan, TransformError> {
        let costs = StageCostsSpec::builder()
            .offload(transfer)
            .build()
            .validate()
            .unwrap();
        built(expression, ranks, microbatches, costs)
    }

    #[test]
    fn offload_fits_the_limit_and_hides_its_transfers() {
        let plan = build("offload(f1b(gpipe), memory=1)", 2, 3, 1.0).unwrap();
        let sim = simulate(&plan).unwrap();
        let grid: Vec<String> = pipeweave_core::render_grid(&plan, &sim)
            .lines()
            .map(|l| l.trim_end().to_string())
            .collect();
        assert_eq!(
            grid,
            [
                "rank  0 | F0 .  F1 .  .  B0 ~  F2 .  .  B1 ~  .  B2 ~",
                "   link | .  O0 .  O1 L0 .  .  .  O2 L1 .  .  L2 .  .",
                "rank  1 | .  F0 B0 ~  F1 B1 ~  .  F2 B2 ~  .  .  .  .",
                "   link | .  .  .  .  .  .  .  .  .  .  .  .  .  .  .",
            ]
        );
        let peaks = peak_per_rank(&plan);
        assert_eq!((peaks[0].peak, peaks[0].host_peak), (1.0, 2.0));
        // 1F1B at 8 ranks, 32 microbatches: cheap transfers hide behind the computes.
        let kept = simulate(&build("f1b(gpipe)", 8, 32, 0.25).unwrap())
            .unwrap()
            .makespan();
        let offloaded = build("offload(f1b(gpipe), memory=2)", 8, 32, 0.25).unwrap();
        assert!(max_peak(&offloaded) <= 2.0);
        let makespan = simulate(&offloaded).unwrap().makespan();
        assert!(makespan <= kept * 1.1, "{makespan} against {kept}");
    }

    #[test]
    fn offloads_sink_to_where_memory_needs_them_and_never_slow_the_plan() {
        // 3-chunk interleaving at 0.67 units: a forward may run while the offload before it is
        // still on the link, as long as the two fit.
        let plan = build("offload(vpp(f1b(gpipe), chunks=3), memory=0.67)", 4, 8, 0.5).unwrap();
        assert!(max_peak(&plan) <= 0.67 + 1e-9);
        let sunk = simulate(&plan).unwrap().makespan();
        // The same plan with every offload right after the task that produced what it moves.
        let mut some_sunk = false;
        let unsunk: Vec<Vec<Task>> = plan
            .orders()
            .iter()
            .map(|order| {
                let mut out: Vec<Task> = order
                    .iter()
                    .copied()
                    .filter(|t| !matches!(t, Task::Offload(_)))
                    .collect();
                for (p, task) in order.iter().enumerate() {
                    let Task::Offload(w) = *task else { continue };
                    let producer = order[..p]
                        .iter()
                        .rposition(|t| {
                            t.runs(w.op(pipeweave_core::OpKind::Forward))
                                || t.runs(w.op(pipeweave_core::OpKind::InputGrad))
                        })
                        .expect("an offload comes after its forward");
                    some_sunk |= order[producer + 1..p].iter().any(|t| !t.on_link());
                    let at = out.iter().position(|t| *t == order[producer]).unwrap() + 1;
                    out.insert(at, *task);
                }
                out
            })
            .collect();
        assert!(some_sunk, "no offload sits later than its forward");
        let unsunk = crate::schedules::relief::reordered(&plan, unsunk).unwrap();
        let before = simulate(&unsunk).unwrap().makespan();
        assert!(sunk <= before + 1e-9, "{sunk} against {before}");
    }

    #[test]
    fn offload_composes_with_recompute_and_refuses_a_second_offload() {
        let both = build(
            "offload(recompute(f1b(gpipe), memory=3), memory=2)",
            4,
            8,
            0.5,
        )
        .unwrap();
        let residency = both.facts().residency;
        assert!(residency.recomputed && residency.offloaded);
        assert!(max_peak(&both) <= 2.0);
        let err = build(
            "offload(offload(f1b(gpipe), memory=3), memory=2)",
            4,
            8,
            0.5,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("cannot run after `offload`"), "{err}");
        let err = build(
            "offload(zero_bubble(f1b(gpipe), policy=h1), memory=0.5)",
            4,
            8,
            0.5,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("reachable with pairs offloaded") && err.contains("still needs"),
            "{err}"
        );
    }

    #[test]
    fn what_delayed_weight_gradients_keep_is_offloaded_between_their_halves() {
        // ZB-H1 at 8 ranks holds up to 8 pairs, most of them kept for Ws it runs late (every
        // pair's memory is kept until its W by default): only moving that out reaches 3.
        for expression in [
            "offload(zero_bubble(f1b(gpipe), policy=h1), memory=3)",
            "offload(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), memory=4)",
        ] {
            let plan = build(expression, 8, 32, 0.5).unwrap();
            assert!(max_peak(&plan) <= plan.memory_limit().unwrap() + 1e-9);
            assert!(pipeweave_core::verify(&plan).is_ok(), "{expression}");
            let between = plan.orders().iter().any(|order| {
                order.iter().enumerate().any(|(p, t)| {
                    let Task::Offload(w) = *t else { return false };
                    order[..p].contains(&Task::InputGrad(w))
                })
            });
            assert!(between, "{expression}: no offload between an I and its W");
        }
    }
}
