//! V-Half and V-Min: the controllable-memory V schedules of Qi et al., "Pipeline Parallelism with
//! Controllable Memory" (NeurIPS 2024), as sail-sg's generator builds them
//! (`zerobubble/scheduler/zbv_greedy.py`), for the V placement: rank `r` holds chunk 0 = stage
//! `r` and chunk 1 = stage `2P - 1 - r`.
//!
//! Six op types per rank, as sail-sg numbers them: 0 = F of chunk 0, 1 = F of chunk 1, 2 = I of
//! chunk 1, 3 = I of chunk 0, 4 = W of chunk 1, 5 = W of chunk 0. On unit time slots:
//! 1. **pattern**: a stable pattern gives each rank the slot of its first op of types 0..3 (V-Min
//!    about a third of 1F1B's activations, V-Half about half); microbatch `k` repeats it `6k`
//!    slots later;
//! 2. **weights**: one W per I, put into the rank's free slots in order ([`put_weights`]);
//! 3. **squeeze**: outside the steady phase, ops move to the earliest free slot after their
//!    dependencies that keeps the rank's peak memory ([`reorder`]), once with the Ws in place and
//!    once without, each followed by an as-early-as-possible replay on unit slots;
//! 4. the Ws are put again, one list per chunk, and the replay's per-rank order is the schedule.
//!
//! The orders do not depend on the costs (sail-sg's generator runs on unit slots whatever the
//! costs); [`controllable_orders`] returns `None` where sail-sg's generator would fail (its
//! replay meets an op whose dependency has not run), which happens at few microbatches.
//! Memory as sail-sg counts it: an F holds one chunk activation until its W.

use crate::schedules::kernel::Agenda;
use pipeweave_core::{Task, Work};

/// Which controllable-memory schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controllable {
    /// V-Half: about half of 1F1B's activation memory.
    Half,
    /// V-Min: about a third.
    Min,
}

/// Slot times: `[rank][type][microbatch]`.
type Slots = Vec<Vec<Vec<i64>>>;

/// The stable pattern: per rank, the first slot of op types 0..3.
fn pattern(kind: Controllable, ranks: i64) -> Vec<[i64; 4]> {
    (0..ranks)
        .map(|i| match kind {
            Controllable::Min => {
                let interval = if ranks % 3 == 0 { 2 } else { 0 };
                [
                    i,
                    2 * ranks - i - 1,
                    2 * ranks + interval + i,
                    4 * ranks + interval - i - 1,
                ]
            }
            Controllable::Half => {
                let interval = if ranks % 2 == 0 { 3 } else { 0 };
                [
                    2 * i,
                    3 * ranks - i - 2,
                    3 * ranks + interval + 2 * i - 1,
                    6 * ranks + interval - i - 2,
                ]
            }
        })
        .collect()
}

/// The heads of every (rank, type) list of `slots` (types `0..types`) in the order sail-sg's
/// generator visits ops: by slot, then rank, then type (its `min` over (slot, rank, type)).
fn heads(slots: &Slots, types: usize) -> Agenda<(i64, usize, usize)> {
    let mut agenda = Agenda::new(0);
    for (s, rank) in slots.iter().enumerate() {
        for (t, list) in rank.iter().enumerate().take(types) {
            if let Some(&first) = list.first() {
                agenda.push((first, s, t), 0);
            }
        }
    }
    agenda
}

/// Puts the next op of list (`s`, `t`) on the agenda, if the list has one.
fn advance(agenda: &mut Agenda<(i64, usize, usize)>, slots: &Slots, s: usize, t: usize, at: usize) {
    if let Some(&next) = slots[s][t].get(at) {
        agenda.push((next, s, t), 0);
    }
}

/// The index of the smallest `key(t)` over `0..count`, ties to the smaller index (Python's `min`
/// over tuples whose second field is the index).
fn argmin<K: PartialOrd + Copy>(count: usize, key: impl Fn(usize) -> K) -> (K, usize) {
    let mut best = (key(0), 0);
    for t in 1..count {
        let k = key(t);
        if k < best.0 {
            best = (k, t);
        }
    }
    best
}

/// The largest slot of a rank (the last op of each type is its latest).
fn bound(rank: &[Vec<i64>]) -> i64 {
    rank.iter()
        .filter_map(|t| t.last().copied())
        .max()
        .unwrap_or(0)
}

/// The next slot of each of the first `types` lists, `inf` where a list is used up.
fn next_slot(rank: &[Vec<i64>], at: &[usize], t: usize, inf: i64) -> i64 {
    rank[t].get(at[t]).copied().unwrap_or(inf)
}

/// Appends the Ws of a rank (types 0..3 given): one W per I, each into the first free slot after
/// it, in order; `split` keeps one list per chunk (types 4 and 5), else one list (type 4).
fn put_weights(rank: &mut Vec<Vec<i64>>, split: bool) {
    let bound = bound(rank);
    let inf = bound + 1;
    rank.push(Vec::new());
    if split {
        rank.push(Vec::new());
    }
    let mut pending = [0usize; 2];
    let mut at = [0usize; 4];
    let mut i = 0;
    while i <= bound {
        let (next, t) = argmin(4, |t| next_slot(rank, &at, t, inf));
        if next == i {
            at[t] += 1;
            if (2..4).contains(&t) {
                pending[if split { t - 2 } else { 0 }] += 1;
            }
        } else if let Some(w) = (0..2).find(|&w| pending[w] > 0) {
            rank[w + 4].push(i);
            pending[w] -= 1;
        }
        i += 1;
    }
    let mut i = bound;
    for w in 0..2 {
        while pending[w] > 0 {
            i += 1;
            rank[w + 4].push(i);
            pending[w] -= 1;
        }
    }
}

/// A rank's peak of chunk activations held (F and f hold one until the W; without W lists, each
/// free slot after an I frees one).
fn peak(rank: &[Vec<i64>]) -> i64 {
    const HELD: [i64; 5] = [1, 1, 0, 0, -1];
    let has_w = rank.len() > 4;
    let bound = bound(rank);
    let inf = bound + 1;
    let mut at = vec![0usize; rank.len()];
    let (mut waiting, mut current, mut peak) = (0, 0, 0);
    for i in 0..=bound {
        let (next, t) = argmin(rank.len(), |t| next_slot(rank, &at, t, inf));
        if next == i {
            at[t] += 1;
            current += HELD[t.min(4)];
            if (2..4).contains(&t) {
                waiting += 1;
            }
        } else if !has_w && waiting > 0 {
            current += HELD[4];
            waiting -= 1;
        }
        peak = peak.max(current);
    }
    peak
}

/// The as-early-as-possible replay of every rank's ops in slot order with the given costs and
/// latency: each op's start (`[rank][type][mb]`) and each rank's order of (type, microbatch).
/// None when an op's dependency comes later in slot order (sail-sg's generator fails there).
type Replay = (Vec<Vec<Vec<f64>>>, Vec<Vec<(usize, usize)>>);

fn replay(slots: &Slots, cost: &[f64], comm: f64) -> Option<Replay> {
    let types = cost.len();
    let ranks = slots.len();
    let mut at = vec![vec![0usize; types]; ranks];
    let mut end: Vec<Vec<Vec<Option<f64>>>> = slots
        .iter()
        .map(|r| r.iter().map(|t| vec![None; t.len()]).collect())
        .collect();
    let total: usize = ranks * slots[0].iter().map(Vec::len).sum::<usize>();
    let mut order: Vec<Vec<(usize, usize)>> = vec![Vec::new(); ranks];
    let mut agenda = heads(slots, types);
    for _ in 0..total {
        let ((_, s, t), _) = agenda.pop_current()?;
        let mb = at[s][t];
        at[s][t] += 1;
        advance(&mut agenda, slots, s, t, at[s][t]);
        let get = |s: usize, t: usize, mb: usize| end[s][t].get(mb).copied().flatten();
        let mut ready: f64 = 0.0;
        let mut need = |value: Option<f64>| -> Option<()> {
            ready = ready.max(value?);
            Some(())
        };
        if (t == 0 || t == 2) && s > 0 {
            need(get(s - 1, t, mb).map(|e| e + comm))?;
        }
        if (t == 1 || t == 3) && s + 1 < ranks {
            need(get(s + 1, t, mb).map(|e| e + comm))?;
        }
        if t > 0 && t < 4 {
            need(get(s, t - 1, mb))?;
        }
        if mb > 0 {
            need(get(s, t, mb - 1))?;
        }
        if let Some(&(lt, lm)) = order[s].last() {
            need(get(s, lt, lm))?;
        }
        end[s][t][mb] = Some(ready + cost[t]);
        order[s].push((t, mb));
    }
    let starts = end
        .iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .map(|(t, mbs)| mbs.iter().map(|e| e.unwrap_or(0.0) - cost[t]).collect())
                .collect()
        })
        .collect();
    Some((starts, order))
}

/// sail-sg's squeeze: outside the steady phase, each op (in slot order) moves to the earliest
/// free slot after its dependencies that keeps the rank's peak memory; then the unit replay's
/// starts are the new slots. `with_weights`: the Ws are put first and move too.
fn reorder(mut slots: Slots, with_weights: bool) -> Option<Slots> {
    let mut types = 4;
    if with_weights {
        slots.iter_mut().for_each(|r| put_weights(r, false));
        types = 5;
    }
    let limit = slots.iter().map(|r| peak(r)).max().unwrap_or(0);
    let ranks = slots.len();
    let mut at = vec![vec![0usize; types]; ranks];
    // Sized as sail-sg sizes it, by the last op of the last type (a slot beyond it fails there).
    let mut occupied: Vec<Vec<bool>> = slots
        .iter()
        .map(|r| {
            vec![
                false;
                r.last()
                    .and_then(|t| t.last())
                    .map_or(1, |&x| x.max(0) as usize + 1)
            ]
        })
        .collect();
    let total: usize = ranks * slots[0].iter().map(Vec::len).sum::<usize>();
    let forwards = slots[0][0].len();
    let mut phase = 0;
    let mut agenda = heads(&slots, types);
    for _ in 0..total {
        let ((next, s, t), _) = agenda.pop_current()?;
        let mb = at[s][t];
        at[s][t] += 1;
        // The list's next op keeps its slot whatever this one's becomes.
        advance(&mut agenda, &slots, s, t, at[s][t]);
        if t == 3 && s == 0 && phase == 0 {
            phase = 1;
        }
        let keep = phase == 1 || (phase == 0 && !with_weights);
        if phase == 1 && t == 0 && mb + 1 == forwards {
            phase = 2;
        }
        if !keep {
            let mut deps = -1;
            if (t == 0 || t == 2) && s > 0 {
                deps = deps.max(slots[s - 1][t][mb]);
            }
            if (t == 1 || t == 3) && s + 1 < ranks {
                deps = deps.max(slots[s + 1][t][mb]);
            }
            if t > 0 && t < 4 {
                deps = deps.max(slots[s][t - 1][mb]);
            }
            if t == 4 {
                let mut inputs: Vec<i64> =
                    slots[s][2].iter().chain(&slots[s][3]).copied().collect();
                inputs.sort_unstable();
                deps = deps.max(*inputs.get(mb)?);
            }
            if mb > 0 {
                deps = deps.max(slots[s][t][mb - 1]);
            }
            deps += 1;
            if deps > next {
                return None;
            }
            let mut placed = false;
            for candidate in deps..next {
                if !*occupied[s].get(candidate.max(0) as usize)? {
                    slots[s][t][mb] = candidate;
                    if peak(&slots[s]) <= limit {
                        placed = true;
                        break;
                    }
                }
            }
            if !placed {
                slots[s][t][mb] = next;
            }
        }
        let slot = slots[s][t][mb] as usize;
        *occupied[s].get_mut(slot)? = true;
    }
    if !with_weights {
        slots.iter_mut().for_each(|r| put_weights(r, false));
    }
    let (starts, _) = replay(&slots, &[1.0; 5], 0.0)?;
    Some(
        starts
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .map(|t| t.into_iter().map(|x| x.round() as i64).collect())
                    .collect()
            })
            .collect(),
    )
}

/// Per rank, sail-sg's order as (type, microbatch), or None where its generator fails.
pub fn controllable_types(
    kind: Controllable,
    ranks: u32,
    microbatches: u32,
) -> Option<Vec<Vec<(usize, usize)>>> {
    if ranks == 0 || microbatches == 0 {
        return None;
    }
    let slots: Slots = pattern(kind, i64::from(ranks))
        .iter()
        .map(|firsts| {
            firsts
                .iter()
                .map(|&x| (0..i64::from(microbatches)).map(|k| x + 6 * k).collect())
                .collect()
        })
        .collect();
    let first = reorder(slots, true)?;
    let first: Slots = first
        .into_iter()
        .map(|mut r| {
            r.truncate(4);
            r
        })
        .collect();
    let mut second: Slots = reorder(first, false)?
        .into_iter()
        .map(|mut r| {
            r.truncate(4);
            r
        })
        .collect();
    second.iter_mut().for_each(|r| put_weights(r, true));
    let (_, order) = replay(&second, &[1.0; 6], 0.0)?;
    Some(order)
}

/// Every rank's V-Half or V-Min order on the V placement, or None where sail-sg's generator
/// fails. The orders depend on the sizes alone: searches across memory limits ask for them
/// through a [`crate::schedules::cache::SearchCache`], which remembers them.
pub fn controllable_orders(
    kind: Controllable,
    ranks: u32,
    microbatches: u32,
) -> Option<Vec<Vec<Task>>> {
    let order = controllable_types(kind, ranks, microbatches)?;
    Some(
        order
            .iter()
            .enumerate()
            .map(|(r, ops)| {
                let (near, far) = (r as u32, 2 * ranks - 1 - r as u32);
                ops.iter()
                    .map(|&(t, mb)| {
                        let mb = mb as u32;
                        match t {
                            0 => Task::Forward(Work::new(near, mb)),
                            1 => Task::Forward(Work::new(far, mb)),
                            2 => Task::InputGrad(Work::new(far, mb)),
                            3 => Task::InputGrad(Work::new(near, mb)),
                            4 => Task::WeightGrad(Work::new(far, mb)),
                            _ => Task::WeightGrad(Work::new(near, mb)),
                        }
                    })
                    .collect()
            })
            .collect(),
    )
}
