//! A certified lower bound on the makespan of every schedule of a plan's problem (issue 29's
//! first combinatorial bounds): no order of the plan's ops, whatever pass builds it, ends earlier.
//!
//! The problem is relaxed: memory, recomputes and transfers are dropped (they only add work or
//! constraints), so the bound holds at every memory limit. Each (stage, microbatch) pair has a
//! forward, an input-gradient backward and a weight-gradient backward, priced as cheap as any
//! task form allows ([`CheapestForms`]: a fused B as the lesser of `I + W` and `B`; where F&B
//! tasks have a given price, on any layout, a forward and a backward each a share of it that no
//! pair of them can undercut; without a given price an F&B costs its forward plus its backward,
//! so nothing). Then:
//! - **heads and tails**: per op, the longest dependency chain before it (with the cross-rank
//!   latency) and after it; their largest sum with the op is the longest chain bound;
//! - **each rank alone**: its ops with those heads and tails on one machine that may even
//!   interrupt them (Jackson's preemptive schedule, optimal for that relaxation): the rank's
//!   work plus what its first op must wait and its last op leaves to do, at their best overlap.
//!
//! The bound is the largest of these. It is exact when one rank's work or one chain decides
//! (one rank; a single microbatch).

use crate::ir::ids::{MicrobatchId, RankId};
use crate::ir::op::Work;
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// One op of the relaxed problem: its rank, duration, head (the earliest it can start) and tail
/// (the least time that must follow its end).
#[derive(Clone, Copy, Debug)]
pub struct Job {
    /// The rank that runs it.
    pub rank: usize,
    /// How long it runs.
    pub duration: f64,
    /// The earliest it can start.
    pub head: f64,
    /// The least time that must follow its end.
    pub tail: f64,
}

/// The lower bound on the makespan of every schedule of `plan`'s problem under its costs
/// (see the module doc).
pub fn lower_bound(plan: &Plan) -> f64 {
    let (jobs, chain) = jobs(plan);
    let ranks = plan.problem().ranks() as usize;
    let mut per_rank: Vec<Vec<Job>> = vec![Vec::new(); ranks];
    for job in jobs {
        if let Some(list) = per_rank.get_mut(job.rank) {
            list.push(job);
        }
    }
    per_rank
        .into_iter()
        .map(|mut jobs| preemptive_bound(&mut jobs))
        .fold(chain, f64::max)
}

/// A lower bound on the longest per-rank span (first compute's start to last compute's end) of
/// every schedule of `plan`'s problem: the largest sum, over a rank's ops, of their least
/// durations ([`CheapestForms`]). A rank runs its computes one at a time, so its span covers
/// them all; recomputes and transfers only add to it.
pub fn least_span(plan: &Plan) -> f64 {
    let pricing = CheapestForms::of(plan);
    let problem = plan.problem();
    let mut work = vec![0.0_f64; problem.ranks() as usize];
    for w in all_works(problem) {
        let (f, i, wg) = pricing.durations(w);
        if let Some(total) = problem
            .rank_of(w.stage)
            .and_then(|r| work.get_mut(r.index()))
        {
            *total += f + i + wg;
        }
    }
    work.into_iter().fold(0.0, f64::max)
}

/// What each op costs at least in any task form a schedule may run it in: a fused B as the
/// lesser of `I + W` and `B`, and, where an F&B task with a given price may run a forward and a
/// backward of the same rank for one price (on every layout and route: DualPipe's two routes,
/// DualPipeV's V, or two microbatches of one stage), a share of that price. The one pricing of
/// every relaxation that bounds all task forms.
///
/// An F&B of forward `a` and backward `b` costs `max(X_a, X_b)`, `X` a work's F&B price at its
/// microbatch's scale ([`CostModel::task_duration`](crate::ir::cost::CostModel::task_duration)).
/// Each rank splits that price by a share `α` in 0..=1: a forward costs at least the lesser of
/// its own price and `α·X`, a backward the lesser of its own and `(1-α)·X`. Any pair then costs
/// at least `α·X_a + (1-α)·X_b <= max(X_a, X_b)`, so every `α` is sound; the rank's share of
/// forward work in its fused-priced works is taken, which is exact where its stages cost alike
/// (every pair then prices at its F&B, and nothing is lost where fusing saves nothing).
#[derive(Clone, Debug)]
pub struct CheapestForms<'p> {
    plan: &'p Plan,
    /// Per rank, the forward's share `α` of a fused price.
    forward_share: Vec<f64>,
}

impl<'p> CheapestForms<'p> {
    /// The pricing of `plan`'s ops.
    pub fn of(plan: &'p Plan) -> CheapestForms<'p> {
        let problem = plan.problem();
        let costs = plan.costs();
        let ranks = problem.ranks() as usize;
        // Per rank, the forward and backward work of its stages whose F&B price is given.
        let mut forward = vec![0.0_f64; ranks];
        let mut backward = vec![0.0_f64; ranks];
        for w in &all_works(problem) {
            let Some(stage) = costs.stage(w.stage).filter(|c| c.overlapped_given()) else {
                continue;
            };
            let Some(rank) = problem.rank_of(w.stage) else {
                continue;
            };
            let scale = costs.microbatch_scale(w.microbatch);
            forward[rank.index()] += stage.forward() * scale;
            backward[rank.index()] +=
                (stage.input_grad() + stage.weight_grad()).min(stage.full_backward()) * scale;
        }
        let forward_share = forward
            .iter()
            .zip(&backward)
            .map(|(f, b)| if f + b > 0.0 { f / (f + b) } else { 0.5 })
            .collect();
        CheapestForms {
            plan,
            forward_share,
        }
    }

    /// The least durations of `w`'s forward, input gradient and weight gradient.
    pub fn durations(&self, w: Work) -> (f64, f64, f64) {
        let costs = self.plan.costs();
        let stage = costs.stage(w.stage).copied().unwrap_or_default();
        let scale = costs.microbatch_scale(w.microbatch);
        let (mut f, i, wg) = (
            stage.forward() * scale,
            stage.input_grad() * scale,
            stage.weight_grad() * scale,
        );
        let backward = stage.full_backward() * scale;
        let mut whole = (i + wg).min(backward);
        if stage.overlapped_given() {
            let rank = self
                .plan
                .problem()
                .rank_of(w.stage)
                .map_or(0, RankId::index);
            let alpha = self.forward_share.get(rank).copied().unwrap_or(0.5);
            let fused = stage.overlapped() * scale;
            f = f.min(alpha * fused);
            whole = whole.min((1.0 - alpha) * fused);
        }
        let i = i.min(backward).min(whole);
        (f, i, (whole - i).max(0.0))
    }
}

/// The ops of `plan`'s problem with their least durations, heads and tails (those of identical
/// microbatches merged), and the longest chain through one op.
fn jobs(plan: &Plan) -> (Vec<Job>, f64) {
    let problem = plan.problem();
    let costs = plan.costs();
    let comm = costs.comm();
    let pricing = CheapestForms::of(plan);
    let durations = |w: &Work| pricing.durations(*w);
    let rank_of = |w: &Work| problem.rank_of(w.stage).map_or(0, RankId::index);
    let latency = |a: &Work, b: &Work| {
        if problem.rank_of(a.stage) == problem.rank_of(b.stage) {
            0.0
        } else {
            comm
        }
    };
    // Microbatches on one route at one cost scale have the same heads and tails: their jobs
    // are computed once and merged (one job of their summed work: the preemptive schedule is
    // the same), which keeps the bound linear in the routes and scales, not the ops.
    let mut groups: Vec<(MicrobatchId, f64)> = Vec::new();
    let mut index: HashMap<(usize, u64), usize> = HashMap::new();
    for m in 0..problem.microbatches() {
        let microbatch = MicrobatchId::new(m);
        let Some(route) = problem.route_of(microbatch) else {
            continue;
        };
        let key = (
            std::ptr::from_ref(route) as usize,
            costs.microbatch_scale(microbatch).to_bits(),
        );
        let at = *index.entry(key).or_insert_with(|| {
            groups.push((microbatch, 0.0));
            groups.len() - 1
        });
        groups[at].1 += 1.0;
    }
    let mut out = Vec::with_capacity(groups.len() * problem.stages() as usize * 3);
    let mut longest = 0.0_f64;
    for (microbatch, count) in groups {
        let Some(route) = problem.route_of(microbatch) else {
            continue;
        };
        let chain: Vec<Work> = route
            .stages()
            .iter()
            .filter(|s| problem.has_work(**s, microbatch))
            .map(|s| Work {
                stage: *s,
                microbatch,
            })
            .collect();
        let d: Vec<(f64, f64, f64)> = chain.iter().map(durations).collect();
        let n = chain.len();
        // Heads: forwards down the route, input gradients back up it.
        let mut head_f = vec![0.0; n];
        for k in 1..n {
            head_f[k] = head_f[k - 1] + d[k - 1].0 + latency(&chain[k - 1], &chain[k]);
        }
        let mut head_i = vec![0.0; n];
        for k in (0..n).rev() {
            let own = head_f[k] + d[k].0;
            let after = if k + 1 < n {
                head_i[k + 1] + d[k + 1].1 + latency(&chain[k + 1], &chain[k])
            } else {
                0.0
            };
            head_i[k] = own.max(after);
        }
        // Tails: what must run after an op ends.
        let mut tail_i = vec![0.0; n];
        for k in 0..n {
            let before = if k > 0 {
                latency(&chain[k], &chain[k - 1]) + d[k - 1].1 + tail_i[k - 1]
            } else {
                0.0
            };
            tail_i[k] = d[k].2.max(before);
        }
        let mut tail_f = vec![0.0; n];
        for k in (0..n).rev() {
            let own = d[k].1 + tail_i[k];
            let next = if k + 1 < n {
                latency(&chain[k], &chain[k + 1]) + d[k + 1].0 + tail_f[k + 1]
            } else {
                0.0
            };
            tail_f[k] = own.max(next);
        }
        for k in 0..n {
            let rank = rank_of(&chain[k]);
            let (f, i, w) = d[k];
            let ops = [
                (f, head_f[k], tail_f[k]),
                (i, head_i[k], tail_i[k]),
                (w, head_i[k] + i, 0.0),
            ];
            for (duration, head, tail) in ops {
                longest = longest.max(head + duration + tail);
                out.push(Job {
                    rank,
                    duration: duration * count,
                    head,
                    tail,
                });
            }
        }
    }
    (out, longest)
}

/// Every (stage, microbatch) pair with work.
fn all_works(problem: &Problem) -> Vec<Work> {
    let mut out = Vec::new();
    for m in 0..problem.microbatches() {
        for s in 0..problem.stages() {
            let w = Work::new(s, m);
            if problem.has_work(w.stage, w.microbatch) {
                out.push(w);
            }
        }
    }
    out
}

/// A released job waiting on the machine, ordered by its tail (largest first).
#[derive(Clone, Copy, Debug)]
struct Ready {
    tail: f64,
    left: f64,
}

impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ready {
    fn cmp(&self, other: &Self) -> Ordering {
        self.tail.total_cmp(&other.tail)
    }
}

/// Jackson's preemptive schedule of `jobs` on one machine (their ranks are not read): at every
/// moment the released job with the longest tail runs; the largest end plus tail is the optimum
/// of the preemptive relaxation, so a lower bound on every schedule of those jobs on one machine.
/// `jobs` is sorted by head in place.
pub fn preemptive_bound(jobs: &mut [Job]) -> f64 {
    jobs.sort_by(|a, b| a.head.total_cmp(&b.head));
    let mut ready = BinaryHeap::new();
    let (mut now, mut best, mut next) = (0.0_f64, 0.0_f64, 0);
    while next < jobs.len() || !ready.is_empty() {
        if ready.is_empty() {
            now = now.max(jobs[next].head);
        }
        while next < jobs.len() && jobs[next].head <= now {
            ready.push(Ready {
                tail: jobs[next].tail,
                left: jobs[next].duration,
            });
            next += 1;
        }
        let Some(mut job) = ready.pop() else {
            continue;
        };
        // Runs until it ends or the next release, which may preempt it.
        let release = jobs.get(next).map_or(f64::INFINITY, |j| j.head);
        let run = job.left.min(release - now);
        now += run;
        job.left -= run;
        if job.left > 0.0 {
            ready.push(job);
        } else {
            best = best.max(now + job.tail);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{costs, unscheduled, unscheduled_with_latency};

    #[test]
    fn one_rank_is_bounded_by_its_work_exactly() {
        let plan = unscheduled(1, 5, costs(1.0, 1.0, 1.0));
        assert_eq!(lower_bound(&plan), 15.0);
    }

    #[test]
    fn one_microbatch_is_bounded_by_its_chain_exactly() {
        // F down 4 ranks, I back up, the last W: 4 + 4 + 1, plus 6 hops of 0.5.
        let plan = unscheduled_with_latency(4, 1, costs(1.0, 1.0, 1.0), 0.5);
        assert_eq!(lower_bound(&plan), 12.0);
    }

    #[test]
    fn a_rank_waits_for_its_first_forward_and_leaves_the_last_gradient_to_others() {
        // P = 4, M = 8, unit costs: the last rank cannot start before 3 and has 24 of work, so
        // no schedule ends before 27; ZB-H2 reaches it (3M + P - 1, the Zero Bubble paper).
        let plan = unscheduled(4, 8, costs(1.0, 1.0, 1.0));
        let bound = lower_bound(&plan);
        assert_eq!(bound, 27.0);
    }

    #[test]
    fn the_least_span_is_the_busiest_rank_s_work() {
        let plan = unscheduled(4, 8, costs(1.0, 2.0, 0.5));
        assert_eq!(least_span(&plan), 8.0 * 3.5);
        // Every schedule's span covers it: GPipe's does.
        let gpipe = crate::testing::plan_on(
            crate::testing::problem(2, 3),
            costs(1.0, 2.0, 0.5),
            crate::ir::memory::StageMemory::default(),
            &["0F0 0F1 0F2 0B2 0B1 0B0", "1F0 1F1 1F2 1B2 1B1 1B0"],
        );
        let span = crate::simulate(&gpipe).unwrap().max_span();
        assert_eq!(least_span(&gpipe), 3.0 * 3.5);
        assert!(least_span(&gpipe) <= span);
    }
}
