//! The waits a deadlock reports: the cycle of blocked ranks, each waiting for an op of the next.

use super::Blocked;
use crate::ir::plan::Plan;

/// Follows "rank waits for an op of rank q" from the first blocked rank until a rank repeats and
/// returns the waits on that cycle (all blocked ranks when no cycle closes, which a structurally
/// sound plan cannot produce).
pub(super) fn wait_cycle(plan: &Plan, blocked: &[Blocked]) -> Vec<Blocked> {
    let mut by_rank: Vec<Option<Blocked>> = vec![None; plan.orders().len()];
    for b in blocked {
        by_rank[b.rank.index()] = Some(*b);
    }
    let Some(start) = blocked.first() else {
        return Vec::new();
    };
    let mut path: Vec<Blocked> = Vec::new();
    let mut on_path = vec![usize::MAX; by_rank.len()];
    let mut current = *start;
    loop {
        if on_path[current.rank.index()] != usize::MAX {
            return path.split_off(on_path[current.rank.index()]);
        }
        on_path[current.rank.index()] = path.len();
        path.push(current);
        let owner = plan.problem().rank_of(current.needs.stage);
        match owner.and_then(|o| by_rank[o.index()]) {
            Some(next) => current = next,
            None => return blocked.to_vec(),
        }
    }
}
