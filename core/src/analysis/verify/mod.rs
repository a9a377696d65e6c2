//! The plan verifier. Running it on a plan produced by a pass is always cheap enough to do after
//! every pass; a failure there is a bug in the pass, never a user error.
//!
//! Invariants, in the order they are checked (every violation is collected, not just the first):
//!
//! 1. **Ranges.** Every op's stage is below the stage count and its microbatch below the microbatch
//!    count, and the stage lies on that microbatch's route.
//! 2. **Placement.** Every op runs on the rank that owns its stage, and an overlapped F&B pairs
//!    work of different (stage, microbatch) pairs (a backward cannot overlap its own forward).
//! 3. **Exactly once.** Every op (F, I and W of every (stage, microbatch) pair on a route) appears
//!    exactly once over all orders; none is missing, none is repeated.
//! 4. **Dependency order on a rank.** When an op and an op it depends on (F along the route, I back
//!    along it, W after its I) run on the same rank, the dependency comes first in that rank's order.
//! 5. **Acyclic.** The per-rank orders together with the dependencies admit an execution: replaying
//!    them as early as possible finishes every rank. Otherwise the cycle of waiting ranks is reported.
//! 6. **Memory bound.** When the plan declares a per-rank activation-memory limit, no rank's held
//!    activations on the device ([`crate::analysis::peak`]: F adds `total`, I frees
//!    `total - weight_grad`, W frees `weight_grad`, with the residency tasks' moves) exceed it.
//! 7. **Residency.** Every recompute and transfer names an existing (stage, microbatch) pair and
//!    runs on the rank of its stage; a pair is recomputed at most once, offloaded and reloaded at
//!    most once each before its I and once each between a split backward's I and W, never both
//!    recomputed and offloaded before its I, and an offload has its reload in the same window; on
//!    the rank, the pair's F comes before its R, and the R before the task running its I; F before
//!    OFFLOAD, OFFLOAD before RELOAD, RELOAD before the I (or, between the I and the W, before
//!    the W).
//!
//! Check 7 runs right after 1 to 3 (the replay of check 5 relies on it); checks 4 to 7 run only
//! when 1 to 3 hold, because they are meaningless on an incomplete plan.
//!
//! Shortcuts keep a sound plan cheap and leave every report as it is. Check 3 counts the ops it
//! sees and looks for missing ones only when the count falls short. The replay of check 5 runs
//! before check 4's pass: a plan it runs to the end respects 4 (an op needing a later op of its
//! own rank blocks that rank on itself; inside one task, every task kind runs an op's
//! dependencies before it), so check 4's pass runs only after a failed replay, whose cycle is
//! reported when check 4 finds nothing.
//!
//! The parts: the findings ([`Violation`], [`Violations`]: `violation.rs`), checks 1 to 4
//! (`structure.rs`) and check 7 (`residency.rs`); this module runs them in the order above, with
//! the replay of check 5 and the memory bound of check 6.

mod residency;
mod structure;
#[cfg(test)]
mod tests;
mod violation;

pub use violation::{Violation, Violations};

use crate::analysis::peak::peak_per_rank;
use crate::analysis::replay::replay_linked;
use crate::ir::deps::Links;
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use crate::tolerance::TOLERANCE;
use residency::check_residency;
use structure::{check_local_order, check_structure};

/// Checks every invariant of the module doc; `Ok` or the full list of violations.
pub fn verify(plan: &Plan) -> Result<(), Violations> {
    into_result(violations(plan))
}

/// Checks invariants 1 to 5 and leaves out the memory bound: the check for intermediate plans of
/// a pass pipeline, whose memory only the final plan must respect.
pub fn verify_schedule(plan: &Plan) -> Result<(), Violations> {
    into_result(collect(plan, false))
}

fn into_result(violations: Vec<Violation>) -> Result<(), Violations> {
    if violations.is_empty() {
        Ok(())
    } else {
        Err(Violations(violations))
    }
}

/// Every violation of `plan` (empty when it is sound).
pub fn violations(plan: &Plan) -> Vec<Violation> {
    collect(plan, true)
}

/// Most violations one report holds; the rest are counted in [`Violation::Omitted`], so a plan
/// that misses almost everything costs no memory beyond its tables.
pub const MAX_LISTED: usize = 10_000;

fn collect(plan: &Plan, with_memory: bool) -> Vec<Violation> {
    let mut out = Report::default();
    let links = Links::of(plan.problem());
    let seen = check_structure(plan, &links, &mut out);
    if !out.is_empty() {
        return out.finish();
    }
    if plan.manages_residency() {
        check_residency(plan, &links, &mut out);
        if !out.is_empty() {
            return out.finish();
        }
    }
    // Check 5's replay before check 4's pass (see the module doc).
    if let Err(stuck) = replay_linked(plan, &links, |_: &Task| 1.0, 0.0, false) {
        check_local_order(plan, &links, &seen, &mut out);
        if out.is_empty() {
            out.push(stuck.into());
        }
    }
    if with_memory {
        check_memory(plan, &mut out);
    }
    out.finish()
}

/// The violations found so far: the first [`MAX_LISTED`], and how many more.
#[derive(Default)]
struct Report {
    list: Vec<Violation>,
    omitted: usize,
}

impl Report {
    fn push(&mut self, violation: Violation) {
        if self.list.len() < MAX_LISTED {
            self.list.push(violation);
        } else {
            self.omitted += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn finish(mut self) -> Vec<Violation> {
        if self.omitted > 0 {
            self.list.push(Violation::Omitted {
                count: self.omitted,
            });
        }
        self.list
    }
}

fn check_memory(plan: &Plan, out: &mut Report) {
    let Some(limit) = plan.memory_limit() else {
        return;
    };
    for peak in peak_per_rank(plan) {
        if peak.peak > limit + TOLERANCE {
            out.push(Violation::MemoryBound {
                rank: peak.rank,
                peak: peak.peak,
                limit,
                at: peak.at.expect("a positive peak is reached at some task"),
            });
        }
    }
}
