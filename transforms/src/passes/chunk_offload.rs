//! `offload(schedule, chunks=K)`: every rank offloads the activations of its first `K` model
//! chunks, each transfer in a slot of the host link planned on the plan's timeline.
//!
//! Source: PipeOffload (Wan et al., ICML 2025; sail-sg's `offloading.add_offload`, with
//! `--offload-chunk-num K`). Where `offload(schedule, memory=N)` fits a limit pair by pair, this
//! places a whole chunk's transfers by a fixed rule, so the memory follows from `K` and the link's
//! speed: on PipeOffload's group building block (`zero_bubble(vpp(f1b(gpipe), chunks=C, group=G,
//! order=block))`) it reaches their low-memory points, and `tune` searches `C`, `G` and `K` at a
//! user's limit as their sweep does.
//!
//! The rule, per rank, on the plan's simulated timeline with its warm-up forwards as late as the
//! next stage and the first backward allow (PipeOffload's `postpone_forward_in_warmup`): the
//! link is cut into periods of two transfers (the longest transfer of the rank's pairs), the first
//! half of each for offloads, the second for reloads, counted from the end of the rank's first
//! compute (on odd ranks from the end of the even neighbour's first compute plus a transfer:
//! PipeOffload pairs ranks 2i and 2i + 1 on one switch, taking turns). Pairs of the rank's first
//! `K` chunks (its stages in order; standard layout: chunk `c` of rank `r` is stage `c·P + r`)
//! whose forward ends more than three periods before their backward (the I, or the whole B) starts,
//! less that backward's length, are chosen. Each offload takes the first free offload slot after
//! its forward ends; then, from the end of the plan backwards, each reload takes the last free
//! reload slot that ends a backward's length before its backward starts (a pair whose reload slot
//! would not come after its offload's stays on the device). In the warm-up (before the first
//! reload of either rank of a pair), the offloads of both run back to back as soon as their
//! forwards end, planned at 0.7 of a transfer (PipeOffload's solo transfer). In the order, an
//! `OFFLOAD` sits before the first compute that starts once its slot ends (where the device copy
//! is freed; the link runs it right after its forward, [`pipeweave_core::link_order`]), a `RELOAD`
//! before the first compute that ends after its slot starts (where it allocates); between two
//! computes, offloads before reloads. The replay then runs every transfer at its full length.
//!
//! Requires: a scheduled plan (any pacing but unscheduled), any layout, split or whole backwards,
//! activations kept (no recompute or offload yet). May change: the orders and the residency fact;
//! a declared `--memory-limit` is checked on the result (this pass does not aim at one).
//! Preconditions: `1 <= K <= ` the plan's chunks per rank; some chosen pair's window holds a round
//! trip (else the error says so).
//!
//! Measured against sail-sg's generator on their grid (`tests/pipeoffload_sailsg.rs`: P 4 and 8,
//! M 2P and 4P, C 2 to 8, every group, K 1 to C, transfers of 0.25 to 2.24 forwards): with a
//! group `G > 1`, the same peak or less everywhere and the same makespan or less where a transfer
//! takes at most a forward (within 3.4% at 2.24); with `G = 1`, where their timeline is a grid of
//! slots rather than as early as possible, no slower but at up to twice their peak.
//!
//! Before (`zero_bubble(vpp(f1b(gpipe), chunks=2, order=block), policy=in_place)`) and after
//! (`chunks=1`), 2 ranks, 4 microbatches, unit costs, transfers of half a forward; peaks 2 and 1.5
//! before, 1 and 1 after (lower case: the second chunk; the rows under each rank are its link).
//! ```text
//! rank  0 | F0 F1 f0 f1 .  i0 w0 F2 i1 w1 F3 I0 W0 f2 I1 W1 f3 i2 w2 .  i3 w3 I2 W2 I3 W3
//! rank  1 | .  F0 F1 f0 i0 w0 f1 i1 w1 F2 I0 W0 F3 I1 W1 f2 i2 w2 f3 i3 w3 I2 W2 I3 W3 .
//!
//! rank  0 | F0 ~  F1 ~  f0 ~  f1 ~  .  .  i0 ~  w0 ~  F2 ~  i1 ~  w1 ~  F3 ~  I0 ~  W0 ~  f2 ~  I1 ~  W1 ~  f3 ~  i2 ~  w2 ~  .  .  i3 ~  w3 ~  I2 ~  W2 ~  I3 ~  W3 ~
//!    link | .  .  O0 .  O1 .  .  .  .  .  .  .  .  .  .  .  O2 .  L0 .  .  .  O3 .  L1 .  .  .  .  .  .  .  .  .  .  .  .  .  L2 .  .  .  .  .  L3 .  .  .  .  .  .  .
//! rank  1 | .  .  F0 ~  F1 ~  f0 ~  i0 ~  w0 ~  f1 ~  i1 ~  w1 ~  F2 ~  I0 ~  W0 ~  F3 ~  I1 ~  W1 ~  f2 ~  i2 ~  w2 ~  f3 ~  i3 ~  w3 ~  I2 ~  W2 ~  I3 ~  W3 ~  .  .
//!    link | .  .  .  .  O0 .  O1 .  .  .  .  .  .  .  .  .  L0 .  .  .  O2 .  L1 .  .  .  O3 .  .  .  .  .  .  .  .  .  .  .  L2 .  .  .  L3 .  .  .  .  .  .  .  .  .
//! ```

use crate::error::TransformError;
use crate::pass::{Changes, Contract, Pass, Requires};
use pipeweave_core::{simulate, Facts, Plan, RankId, Residency, Task, TimedTask, Work};

/// Largest chunk count accepted (the `vpp` pass's).
const MAX_CHUNKS: u32 = super::vpp::MAX_CHUNKS;

/// Within this of a slot's edge, a compute counts as on it.
const EPSILON: f64 = 1e-9;

/// The chunk-offload pass: `offload(schedule, chunks=K)`. Built with [`ChunkOffload::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkOffload {
    chunks: u32,
}

impl ChunkOffload {
    /// Its name in expressions (the `offload` pass with `chunks=K`).
    pub const NAME: &'static str = "offload";

    /// The pass offloading each rank's first `chunks` model chunks; `chunks >= 1`.
    pub fn new(chunks: u32) -> Result<ChunkOffload, TransformError> {
        if !(1..=MAX_CHUNKS).contains(&chunks) {
            return Err(TransformError::precondition(
                Self::NAME,
                "1 <= chunks <= 64",
                format!("chunks={chunks} offloads no chunk or more than a plan can have"),
            ));
        }
        Ok(ChunkOffload { chunks })
    }

    /// How many chunks of each rank it offloads.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }
}

/// One pair of a rank chosen for offload, with where its forward and backward run.
struct Candidate {
    work: Work,
    /// Positions in the rank's order.
    forward: usize,
    backward: usize,
    /// The transfer's length.
    transfer: f64,
}

/// A transfer placed in a slot: its pair, its kind and the slot's start and end, and for an
/// offload when its forward ends.
struct Slot {
    work: Work,
    offload: bool,
    start: f64,
    end: f64,
    ready: f64,
}

/// How long a transfer takes in the warm-up, where no reload shares the switch, as a share of a
/// slot's (PipeOffload's `solo_offload_time`).
const SOLO: f64 = 0.7;

/// The warm-up of two paired ranks' slots (PipeOffload's `adjust_warmup`): the offloads of both
/// that start before the first reload of either run back to back, in the order of their slots,
/// each as soon as its forward ended, at [`SOLO`] of a slot's length; their places in the order
/// follow (the link's replay then runs them at their full length).
fn warm_up(pair: &mut [Vec<Slot>]) {
    let first_reload = pair
        .iter()
        .flatten()
        .filter(|s| !s.offload)
        .map(|s| s.start)
        .fold(f64::INFINITY, f64::min);
    let mut early: Vec<(f64, usize, usize)> = pair
        .iter()
        .enumerate()
        .flat_map(|(r, slots)| {
            slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.offload && s.start < first_reload - EPSILON)
                .map(move |(k, s)| (s.start, r, k))
        })
        .collect();
    early.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let Some(&(mut at, _, _)) = early.first() else {
        return;
    };
    for (_, r, k) in early {
        let slot = &mut pair[r][k];
        let length = (slot.end - slot.start) * SOLO;
        slot.start = at.max(slot.ready);
        slot.end = slot.start + length;
        at = slot.end;
    }
}

impl Pass for ChunkOffload {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        Contract::new(
            Requires::paced(Requires::SCHEDULED).with_residency(Requires::KEPT),
            Changes::RESIDENCY,
        )
    }

    fn describe(&self) -> String {
        format!("{}(chunks={})", Self::NAME, self.chunks)
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let have = plan.chunks_per_rank().unwrap_or(1);
        if self.chunks > have {
            return Err(TransformError::precondition(
                Self::NAME,
                "chunks <= the plan's chunks per rank",
                format!(
                    "chunks={} but each rank holds {have} model chunk{}",
                    self.chunks,
                    if have == 1 { "" } else { "s" }
                ),
            ));
        }
        let simulation = simulate(&plan).map_err(|e| TransformError::PassFailed {
            pass: Self::NAME.to_string(),
            message: format!("the plan it was given does not replay: {e}"),
        })?;
        let planned = postponed(&plan, simulation.timeline());
        let mut slots: Vec<Vec<Slot>> = Vec::with_capacity(planned.len());
        for (r, timeline) in planned.iter().enumerate() {
            let candidates = self.candidates(&plan, r, timeline);
            let Some(transfer) = candidates.iter().map(|c| c.transfer).reduce(f64::max) else {
                slots.push(Vec::new());
                continue;
            };
            // Ranks 2i and 2i + 1 take turns on the grid: the odd one's starts a transfer
            // after the even one's (PipeOffload pairs them on one switch).
            let origin = match r % 2 {
                1 => planned[r - 1].first().map(|t| t.end + transfer),
                _ => timeline.first().map(|t| t.end),
            };
            slots.push(origin.map_or_else(Vec::new, |origin| {
                plan_slots(&candidates, timeline, origin, transfer)
            }));
        }
        for pair in slots.chunks_mut(2) {
            warm_up(pair);
        }
        let moved: usize = slots.iter().map(|s| s.len() / 2).sum();
        let orders: Vec<Vec<Task>> = slots
            .into_iter()
            .enumerate()
            .map(|(r, s)| placed(&plan.orders()[r], &planned[r], s))
            .collect();
        if moved == 0 {
            return Err(TransformError::precondition(
                Self::NAME,
                "a chosen pair's window holds a round trip",
                format!(
                    "no pair of the first {} chunk(s) of any rank is held long enough between its \
                     forward and its backward to move out and back over the host link",
                    self.chunks
                ),
            ));
        }
        let facts = Facts {
            residency: Residency {
                offloaded: true,
                ..plan.facts().residency
            },
            ..plan.facts()
        };
        plan.reshaped(None, orders, facts)
            .map_err(|e| TransformError::core(Self::NAME, e))
    }
}

impl ChunkOffload {
    /// The pairs of rank `r` in its first `self.chunks` chunks whose forward and backward (I or
    /// whole B) run as tasks of their own, in the order of their forwards.
    fn candidates(&self, plan: &Plan, r: usize, timeline: &[TimedTask]) -> Vec<Candidate> {
        let stages = plan.problem().stages_of(RankId::new(r as u32));
        let offloaded = |w: Work| {
            stages
                .iter()
                .position(|&s| s == w.stage)
                .is_some_and(|chunk| chunk < self.chunks as usize)
        };
        let mut forwards = Vec::new();
        let mut backwards = std::collections::HashMap::new();
        for (position, timed) in timeline.iter().enumerate() {
            match timed.task {
                Task::Forward(w) if offloaded(w) => forwards.push((w, position)),
                Task::InputGrad(w) | Task::Backward(w) if offloaded(w) => {
                    backwards.insert(w, position);
                }
                _ => {}
            }
        }
        forwards
            .into_iter()
            .filter_map(|(work, forward)| {
                let &backward = backwards.get(&work)?;
                let transfer = plan.costs().task_duration(&Task::Offload(work));
                Some(Candidate {
                    work,
                    forward,
                    backward,
                    transfer,
                })
            })
            .collect()
    }
}

/// The timeline the slots are planned on: `timeline` with each rank's warm-up forwards (those
/// before its first backward, after the first forward of its last chunk) as late as the next
/// stage and the backward allow, ranks from the last to the first (PipeOffload plans on its
/// timeline so: a forward's activations then wait the least for their transfer).
fn postponed(plan: &Plan, timeline: &[Vec<TimedTask>]) -> Vec<Vec<TimedTask>> {
    let mut planned = timeline.to_vec();
    let comm = plan.costs().comm();
    let mut forward_at = std::collections::HashMap::new();
    for (r, row) in timeline.iter().enumerate() {
        for (i, t) in row.iter().enumerate() {
            if let Task::Forward(w) = t.task {
                forward_at.insert(w, (r, i));
            }
        }
    }
    for r in (0..planned.len()).rev() {
        let last_chunk = plan
            .problem()
            .stages_of(RankId::new(r as u32))
            .last()
            .copied();
        let Some(first_backward) = planned[r]
            .iter()
            .position(|t| matches!(t.task, Task::InputGrad(_) | Task::Backward(_)))
        else {
            continue;
        };
        let b = planned[r][first_backward];
        let mut latest = b.start - (b.end - b.start);
        for i in (0..first_backward).rev() {
            let t = planned[r][i];
            let Task::Forward(w) = t.task else { break };
            if Some(w.stage) == last_chunk && w.microbatch.index() == 0 {
                break;
            }
            let length = t.end - t.start;
            let next = Work::new(w.stage.index() as u32 + 1, w.microbatch.index() as u32);
            let needed = forward_at
                .get(&next)
                .map_or(f64::INFINITY, |&(q, k)| planned[q][k].start - comm);
            let start = needed.min(latest) - length;
            if start > t.start {
                planned[r][i].start = start;
                planned[r][i].end = start + length;
            }
            latest = planned[r][i].start;
        }
    }
    planned
}

/// The slots of a rank's transfers (see the module doc): offloads and reloads of the pairs kept
/// for offload, in no particular order.
fn plan_slots(
    candidates: &[Candidate],
    timeline: &[TimedTask],
    origin: f64,
    transfer: f64,
) -> Vec<Slot> {
    let Some(last) = timeline.last() else {
        return Vec::new();
    };
    if transfer <= 0.0 {
        return Vec::new();
    }
    let period = 2.0 * transfer;
    // The latest a reload may end: a backward's length before the backward starts.
    let deadline = |c: &Candidate| {
        let b = &timeline[c.backward];
        b.start - (b.end - b.start)
    };
    let chosen: Vec<&Candidate> = candidates
        .iter()
        .filter(|c| deadline(c) - timeline[c.forward].end > 3.0 * period + EPSILON)
        .collect();
    // Offloads: the first free offload slot after the forward ends.
    let mut sent = Vec::with_capacity(chosen.len());
    let mut at = origin;
    for c in &chosen {
        let ready = timeline[c.forward].end;
        if at < ready - EPSILON {
            at += ((ready - at) / period - EPSILON).ceil().max(0.0) * period;
        }
        sent.push((at, at + c.transfer));
        at += period;
    }
    let end = timeline.iter().map(|t| t.end).fold(last.end, f64::max);
    if at < end - EPSILON {
        at += ((end - at) / period - EPSILON).ceil().max(0.0) * period;
    }
    // Reloads: from the end backwards, the last free reload slot ending by the deadline.
    let mut by_backward: Vec<usize> = (0..chosen.len()).collect();
    by_backward.sort_by_key(|&k| std::cmp::Reverse(chosen[k].backward));
    let mut slots = Vec::with_capacity(2 * chosen.len());
    for k in by_backward {
        let c = chosen[k];
        let latest = deadline(c);
        if at > latest + EPSILON {
            at -= ((at - latest) / period - EPSILON).ceil().max(0.0) * period;
        }
        let (reload_start, reload_end) = (at - c.transfer, at);
        let (offload_start, offload_end) = sent[k];
        if reload_start <= offload_end + EPSILON {
            continue;
        }
        slots.push(Slot {
            work: c.work,
            offload: true,
            start: offload_start,
            end: offload_end,
            ready: timeline[c.forward].end,
        });
        slots.push(Slot {
            work: c.work,
            offload: false,
            start: reload_start,
            end: reload_end,
            ready: offload_end,
        });
        at -= period;
    }
    slots
}

/// `order` (whose simulated tasks are `timeline`) with `slots`' transfers in place: an offload
/// before the first compute starting once its slot ends, a reload before the first compute
/// ending after its slot starts, and after its offload.
fn placed(order: &[Task], timeline: &[TimedTask], mut slots: Vec<Slot>) -> Vec<Task> {
    let place = |slot: &Slot| -> usize {
        if slot.offload {
            timeline
                .iter()
                .position(|t| t.start >= slot.end - EPSILON)
                .unwrap_or(order.len())
        } else {
            timeline
                .iter()
                .position(|t| t.end > slot.start + EPSILON)
                .unwrap_or(order.len())
        }
    };
    // Before the compute at `place`: the offloads, then the reloads, each by time. Between two
    // computes an offload's place before a reload's frees memory sooner at no cost: no compute
    // waits on either there, and the link runs them in the order they were issued.
    let key = |slot: &Slot| if slot.offload { slot.end } else { slot.start };
    slots.sort_by(|a, b| b.offload.cmp(&a.offload).then(key(a).total_cmp(&key(b))));
    let mut before: Vec<Vec<Task>> = vec![Vec::new(); order.len() + 1];
    let mut offloaded_at = std::collections::HashMap::new();
    for slot in &slots {
        let mut at = place(slot);
        if slot.offload {
            offloaded_at.insert(slot.work, at);
            before[at].push(Task::Offload(slot.work));
        } else {
            // A reload comes after its offload's place.
            if let Some(&o) = offloaded_at.get(&slot.work) {
                at = at.max(o);
            }
            before[at].push(Task::Reload(slot.work));
        }
    }
    let mut out = Vec::with_capacity(order.len() + slots.len());
    for (position, task) in order.iter().enumerate() {
        out.append(&mut before[position]);
        out.push(*task);
    }
    out.append(&mut before[order.len()]);
    out
}

#[cfg(test)]
mod tests {
    use crate::error::TransformError;
    use crate::testing::built;
    use pipeweave_core::{max_peak, peak_per_rank, simulate, Plan, StageCostsSpec, Task};

    /// PipeOffload's block of 2 chunks at 2 ranks, its first `chunks` chunks offloaded, unit
    /// costs and transfers of half a forward, at `microbatches`.
    fn build(base: &str, chunks: u32, microbatches: u32) -> Result<Plan, TransformError> {
        let costs = StageCostsSpec::builder()
            .offload(0.5)
            .build()
            .validate()
            .unwrap();
        built(
            &format!("offload({base}, chunks={chunks})"),
            2,
            microbatches,
            costs,
        )
    }

    const BLOCK: &str = "zero_bubble(vpp(f1b(gpipe), chunks=2, order=block), policy=in_place)";

    #[test]
    fn the_first_chunk_moves_out_behind_the_computes() {
        let plan = build(BLOCK, 1, 4).unwrap();
        let base = built(BLOCK, 2, 4, pipeweave_core::StageCosts::default()).unwrap();
        let (ours, theirs) = (simulate(&plan).unwrap(), simulate(&base).unwrap());
        assert_eq!(ours.makespan(), theirs.makespan());
        let peaks: Vec<f64> = peak_per_rank(&plan).iter().map(|p| p.peak).collect();
        assert_eq!((max_peak(&base), peaks), (2.0, vec![1.0, 1.0]));
        assert!(plan.facts().residency.offloaded);
        // Only the first chunk (stages 0 and 1) moves, every pair of it, each out once.
        let offloaded: Vec<u32> = plan.orders()[0]
            .iter()
            .filter_map(|t| match t {
                Task::Offload(w) => Some(w.stage.index() as u32),
                _ => None,
            })
            .collect();
        assert_eq!(offloaded, vec![0, 0, 0, 0]);
    }

    #[test]
    fn more_chunks_than_the_plan_has_are_refused() {
        let error = build(BLOCK, 3, 4).unwrap_err().to_string();
        assert!(
            error.contains("chunks <= the plan's chunks per rank"),
            "{error}"
        );
        assert!(error.contains("each rank holds 2 model chunks"), "{error}");
        let error = build("f1b(gpipe)", 0, 4).unwrap_err().to_string();
        assert!(error.contains("1 <= chunks <= 64"), "{error}");
    }

    #[test]
    fn windows_too_short_for_a_round_trip_are_an_error() {
        let error = build("zero_bubble(f1b(gpipe), policy=in_place)", 1, 5)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("a chosen pair's window holds a round trip"),
            "{error}"
        );
    }

    #[test]
    fn a_plan_already_offloaded_is_refused() {
        let error = build("offload(f1b(gpipe), memory=1)", 1, 4)
            .unwrap_err()
            .to_string();
        assert!(error.contains("it needs activations kept"), "{error}");
    }
}
