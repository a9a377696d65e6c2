//! Building blocks for per-rank orders shared by the passes.

use pipeweave_core::{Problem, Task, Work};

/// Fill-drain (GPipe) orders for any problem: every rank runs all its forwards, then all its full
/// backwards, microbatch after microbatch, route by route; on a rank holding several stages of a
/// route, forwards go in route order and backwards in reverse. Always a runnable schedule.
pub fn fill_drain(problem: &Problem) -> Vec<Vec<Task>> {
    let ranks = problem.ranks() as usize;
    let mut forwards: Vec<Vec<Task>> = vec![Vec::new(); ranks];
    let mut backwards: Vec<Vec<Task>> = vec![Vec::new(); ranks];
    for route in problem.routes() {
        for mb in route.first().get()..route.end().get() {
            for &stage in route.stages() {
                let rank = problem
                    .rank_of(stage)
                    .expect("route stages are in range in a validated problem");
                forwards[rank.index()].push(Task::Forward(Work::new(stage.get(), mb)));
            }
            for &stage in route.stages().iter().rev() {
                let rank = problem
                    .rank_of(stage)
                    .expect("route stages are in range in a validated problem");
                backwards[rank.index()].push(Task::Backward(Work::new(stage.get(), mb)));
            }
        }
    }
    forwards
        .into_iter()
        .zip(backwards)
        .map(|(mut f, b)| {
            f.extend(b);
            f
        })
        .collect()
}

/// Merges a rank's forwards and backwards the way every warm-up / steady / cool-down schedule
/// does: the first `warmup` forwards, then pairs (next forward, next backward) while both remain,
/// then whatever is left (backwards, in order). `warmup` is capped at the number of forwards.
pub fn warmup_merge(forwards: &[Task], backwards: &[Task], warmup: usize) -> Vec<Task> {
    let warmup = warmup.min(forwards.len());
    let mut out = Vec::with_capacity(forwards.len() + backwards.len());
    out.extend_from_slice(&forwards[..warmup]);
    let steady = (forwards.len() - warmup).min(backwards.len());
    for i in 0..steady {
        out.push(forwards[warmup + i]);
        out.push(backwards[i]);
    }
    out.extend_from_slice(&forwards[warmup + steady..]);
    out.extend_from_slice(&backwards[steady..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(text: &str) -> Vec<Task> {
        text.split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect()
    }

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
