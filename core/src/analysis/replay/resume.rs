//! Where a resumed replay ([`super::replay_within`]) picks up: the prefix of an earlier replay
//! that begins the plan's orders and that no changed offload issue makes stale.

use super::{Replay, TimedTask};
use crate::analysis::link::offload_producers;
use crate::ir::op::Task;
use crate::ir::plan::Plan;

/// Per rank, the tasks `earlier` completed before sequence number `cut`, when they begin the
/// rank's order in `plan` (None when some do not: the replay then starts afresh).
/// With offloads, the prefix ends before the first compute (on any rank) that issues another
/// offload in `plan` than in `earlier` (`producers`: `plan`'s, per rank), as the link's times
/// after it change.
pub(super) fn agreeing_prefix<'r>(
    plan: &Plan,
    producers: &[Vec<(usize, usize)>],
    earlier: &'r Replay,
    cut: usize,
) -> Option<Vec<&'r [TimedTask]>> {
    if earlier.timeline.len() != plan.orders().len() {
        return None;
    }
    let mut cut = cut;
    if !producers.is_empty() {
        let slots = plan.slots();
        for (r, row) in earlier.timeline.iter().enumerate() {
            let tasks: Vec<Task> = row.iter().map(|t| t.task).collect();
            let before = offload_producers(&tasks, slots);
            let now = &producers[r];
            let issuing = |list: &[(usize, usize)], k: usize| {
                list.get(k)
                    .map(|&(p, o)| (p, plan.orders()[r].get(o).copied()))
            };
            let differs = (0..before.len().max(now.len())).find(|&k| {
                let earlier_issue = before.get(k).map(|&(p, o)| (p, Some(tasks[o])));
                earlier_issue != issuing(now, k)
            });
            if let Some(k) = differs {
                let first = [before.get(k), now.get(k)]
                    .into_iter()
                    .flatten()
                    .map(|&(p, _)| p)
                    .min()
                    .unwrap_or(0);
                if let Some(t) = row.get(first) {
                    cut = cut.min(t.sequence);
                }
            }
        }
    }
    earlier
        .timeline
        .iter()
        .zip(plan.orders())
        .map(|(row, order)| {
            let done = row.iter().take_while(|t| t.sequence < cut).count();
            let agrees = done <= order.len()
                && row[..done]
                    .iter()
                    .zip(order)
                    .all(|(t, task)| t.task == *task);
            agrees.then_some(&row[..done])
        })
        .collect()
}
