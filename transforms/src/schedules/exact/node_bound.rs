//! The lower bound of one node of the exact search: no completion of its partial schedule ends
//! earlier.
//!
//! Every op not yet placed gets a head (the earliest it can start: its rank's clock, its placed
//! inputs' ends with latency, its unplaced inputs' heads plus their durations) and its static
//! tail. Then per rank:
//! - **memory**: a forward can only start once enough of what the rank holds is released. The
//!   rank's releases cannot end before their heads plus durations, so the j-th forward still to
//!   run waits for the earliest time the releases that can have ended by then reach the held
//!   activations plus j forwards' minus the limit. Used where the rank's remaining forwards are
//!   alike (same duration, tail and size: interchangeable, so the j-th smallest head may take
//!   the j-th wait);
//! - **Jackson's preemptive schedule** over those heads and tails
//!   ([`pipeweave_core::analysis::bound::preemptive_bound`]).
//!
//! The bound is the largest of the ranks' clocks and their preemptive bounds; infinite where a
//! rank can never free enough memory for its remaining forwards.

use super::model::Model;
use super::state::State;
use pipeweave_core::analysis::bound::{preemptive_bound, Job};
use pipeweave_core::TOLERANCE;

/// Reusable buffers of the bound.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    heads: Vec<f64>,
    /// Per rank, its unplaced ops as jobs and which op each is.
    jobs: Vec<Vec<Job>>,
    job_ops: Vec<Vec<usize>>,
    forwards: Vec<usize>,
    releases: Vec<(f64, f64)>,
    slots: Vec<f64>,
    /// A rank's forwards still to run: head, least hold, tail after the hold.
    holds: Vec<(f64, f64, f64)>,
}

/// The lower bound of `state` (see the module doc).
pub(super) fn node_bound(model: &Model, state: &State, scratch: &mut Scratch) -> f64 {
    let ops = &model.ops;
    scratch.heads.resize(ops.len(), 0.0);
    scratch.jobs.resize_with(model.ranks, Vec::new);
    scratch.job_ops.resize_with(model.ranks, Vec::new);
    for (jobs, job_ops) in scratch.jobs.iter_mut().zip(&mut scratch.job_ops) {
        jobs.clear();
        job_ops.clear();
    }
    for &op in &model.topo {
        if state.is_placed(op) {
            continue;
        }
        let info = &ops[op];
        let mut head = state.free(info.rank);
        for e in &info.preds {
            let ready = match state.end(e.op) {
                Some(end) => end,
                None => scratch.heads[e.op] + ops[e.op].duration,
            };
            head = head.max(ready + e.latency);
        }
        scratch.heads[op] = head;
        scratch.jobs[info.rank].push(Job {
            rank: info.rank,
            duration: info.duration,
            head,
            tail: info.tail,
        });
        scratch.job_ops[info.rank].push(op);
    }
    let mut bound = (0..model.ranks).map(|r| state.free(r)).fold(0.0, f64::max);
    for rank in 0..model.ranks {
        if model.limit.is_finite() && !raise_forward_heads(model, state, rank, scratch) {
            return f64::INFINITY;
        }
        if let Some(slots) = model.slots[rank] {
            bound = bound.max(slot_bound(model, state, rank, slots, scratch));
        }
        let jobs = &mut scratch.jobs[rank];
        if !jobs.is_empty() {
            bound = bound.max(preemptive_bound(jobs));
        }
    }
    bound
}

/// The memory limit as `slots` places on `rank`, each holding one forward's activations from its
/// start to its release's end: the forwards in flight hold theirs until their releases can end,
/// and each forward still to run takes a place from its head on for at least its least hold.
/// Where those holds are alike, earliest place first in head order is optimal, so the last
/// release it ends, plus the tail after it, bounds the makespan; where they differ, the holds
/// that start at or after a time `t` fill the places from `t` on at best evenly (the largest such
/// bound over the heads `t`).
fn slot_bound(
    model: &Model,
    state: &State,
    rank: usize,
    slots: usize,
    scratch: &mut Scratch,
) -> f64 {
    let ops = &model.ops;
    let Scratch {
        heads,
        job_ops,
        slots: free_at,
        holds,
        ..
    } = scratch;
    free_at.clear();
    holds.clear();
    for &op in &job_ops[rank] {
        let info = &ops[op];
        if let Some(forward) = info.frees {
            if state.is_placed(forward) {
                free_at.push(heads[op] + info.duration);
            }
        }
        if let Some((release, least)) = info.release {
            holds.push((heads[op], least, ops[release].tail));
        }
    }
    if holds.is_empty() || free_at.len() > slots || slots == 0 {
        return 0.0;
    }
    holds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (_, least, tail) = holds[0];
    let alike = holds
        .iter()
        .all(|h| (h.1 - least).abs() <= TOLERANCE && (h.2 - tail).abs() <= TOLERANCE);
    if alike {
        free_at.resize(slots, f64::NEG_INFINITY);
        let mut last: f64 = 0.0;
        for &(head, _, _) in holds.iter() {
            let (k, earliest) = free_at
                .iter()
                .copied()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap_or((0, f64::NEG_INFINITY));
            let end = earliest.max(head) + least;
            if let Some(place) = free_at.get_mut(k) {
                *place = end;
            }
            last = last.max(end);
        }
        return last + tail;
    }
    // From the latest head down: the holds starting then or later, their least tail.
    let (mut work, mut tail, mut best) = (0.0, f64::INFINITY, 0.0_f64);
    for &(head, least, own_tail) in holds.iter().rev() {
        work += least;
        tail = tail.min(own_tail);
        let busy: f64 = free_at.iter().map(|&f| (f - head).max(0.0)).sum();
        best = best.max(head + (work + busy) / slots as f64 + tail);
    }
    best
}

/// Raises the heads of `rank`'s remaining forwards (in `scratch.jobs[rank]`) to when the memory
/// limit lets them start (see the module doc); false where it never does.
fn raise_forward_heads(model: &Model, state: &State, rank: usize, scratch: &mut Scratch) -> bool {
    let Scratch {
        jobs,
        job_ops,
        forwards,
        releases,
        ..
    } = scratch;
    let (jobs, job_ops) = (&mut jobs[rank], &job_ops[rank]);
    forwards.clear();
    releases.clear();
    for (k, &op) in job_ops.iter().enumerate() {
        let delta = model.ops[op].delta;
        if delta > TOLERANCE {
            forwards.push(k);
        } else if delta < -TOLERANCE {
            releases.push((jobs[k].head + jobs[k].duration, -delta));
        }
    }
    let Some(&first) = forwards.first() else {
        return true;
    };
    let (sample, first_size) = (jobs[first], model.ops[job_ops[first]].delta);
    let alike = forwards.iter().all(|&k| {
        let j = jobs[k];
        (j.duration - sample.duration).abs() <= TOLERANCE
            && (j.tail - sample.tail).abs() <= TOLERANCE
            && (model.ops[job_ops[k]].delta - first_size).abs() <= TOLERANCE
    });
    let size = forwards
        .iter()
        .map(|&k| model.ops[job_ops[k]].delta)
        .fold(f64::INFINITY, f64::min);
    if size > model.limit + TOLERANCE {
        // Not even the smallest forward fits.
        return false;
    }
    releases.sort_by(|a, b| a.0.total_cmp(&b.0));
    forwards.sort_by(|&a, &b| jobs[a].head.total_cmp(&jobs[b].head));
    let held = state.held(rank);
    let (mut released, mut next, mut at) = (0.0, 0, f64::NEG_INFINITY);
    for j in 0..forwards.len() {
        // Forwards unlike each other: only the first to run is known to wait, and every one
        // of them might be it.
        let need = held + (j + 1) as f64 * size - model.limit;
        if need > TOLERANCE {
            while released < need - TOLERANCE {
                let Some(&(end, amount)) = releases.get(next) else {
                    return false;
                };
                released += amount;
                at = end;
                next += 1;
            }
        }
        if !alike {
            for &k in forwards.iter() {
                jobs[k].head = jobs[k].head.max(at);
            }
            break;
        }
        jobs[forwards[j]].head = jobs[forwards[j]].head.max(at);
    }
    true
}
