//! Building blocks for per-rank orders shared by the passes.

use pipeweave_core::{Problem, StageId, Task, Work};

/// Fill-drain (GPipe) orders for any problem: every rank runs all its forwards, then all its full
/// backwards, microbatch after microbatch, route by route; on a rank holding several stages of a
/// route, forwards go in route order and backwards in reverse. Always a runnable schedule.
pub fn fill_drain(problem: &Problem) -> Vec<Vec<Task>> {
    let ranks = problem.ranks() as usize;
    let owner = |stage: StageId| {
        problem
            .rank_of(stage)
            .expect("route stages are in range in a validated problem")
            .index()
    };
    // Each rank's order is sized first: every (stage, microbatch) pair it holds, twice.
    let mut sizes = vec![0usize; ranks];
    for route in problem.routes() {
        let microbatches = (route.end().get() - route.first().get()) as usize;
        for &stage in route.stages() {
            sizes[owner(stage)] += 2 * microbatches;
        }
    }
    let mut orders: Vec<Vec<Task>> = sizes.into_iter().map(Vec::with_capacity).collect();
    for route in problem.routes() {
        for mb in route.first().get()..route.end().get() {
            for &stage in route.stages() {
                orders[owner(stage)].push(Task::Forward(Work::new(stage.get(), mb)));
            }
        }
    }
    for route in problem.routes() {
        for mb in route.first().get()..route.end().get() {
            for &stage in route.stages().iter().rev() {
                orders[owner(stage)].push(Task::Backward(Work::new(stage.get(), mb)));
            }
        }
    }
    orders
}

/// Merges a rank's forwards and backwards the way every warm-up / steady / cool-down schedule
/// does: the first `warmup` forwards, then pairs (next forward, next backward) while both remain,
/// then whatever is left (backwards, in order). `warmup` is capped at the number of forwards.
pub fn warmup_merge(forwards: &[Task], backwards: &[Task], warmup: usize) -> Vec<Task> {
    warmup_merge_with(
        (forwards.len(), |i| forwards[i]),
        (backwards.len(), |i| backwards[i]),
        warmup,
    )
}

/// [`warmup_merge`] of forwards and backwards given by their number and the task at each
/// position: the merged order without building either list first.
pub fn warmup_merge_with(
    (forwards, forward): (usize, impl Fn(usize) -> Task),
    (backwards, backward): (usize, impl Fn(usize) -> Task),
    warmup: usize,
) -> Vec<Task> {
    let warmup = warmup.min(forwards);
    let mut out = Vec::with_capacity(forwards + backwards);
    out.extend((0..warmup).map(&forward));
    let steady = (forwards - warmup).min(backwards);
    for i in 0..steady {
        out.push(forward(warmup + i));
        out.push(backward(i));
    }
    out.extend((warmup + steady..forwards).map(&forward));
    out.extend((steady..backwards).map(&backward));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::tasks;

    #[test]
    fn merge_has_warmup_steady_and_cooldown() {
        let f = tasks("0F0 0F1 0F2 0F3");
        let b = tasks("0B0 0B1 0B2 0B3");
        let merged: Vec<String> = warmup_merge(&f, &b, 2)
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(merged.join(" "), "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3");
        let all: Vec<String> = warmup_merge(&f, &b, 9)
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(all.join(" "), "0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3");
    }
}
