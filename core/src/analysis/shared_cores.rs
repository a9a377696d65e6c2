//! Ranks that share fewer cores than they need: a CPU run of more ranks than the machine has
//! cores, where the operating system time-shares the busy ranks.
//!
//! The model is processor sharing: while `n` ranks compute at once on room for `slots` of them
//! (cores over each rank's compute threads), each runs at `min(1, slots / n)` of its speed.
//! [`simulate_on_cores`] finds the timeline where every task's length is its cost times the
//! mean slowdown over its own span: starting from the unshared replay, it replays the plan with
//! each task stretched by the slowdown the previous timeline shows over it (half of the change
//! per round, so the rounds settle), until no factor moves by more than 1e-4 or after
//! [`MAX_ROUNDS`] rounds. Transfers on the host links use no core. With room for every rank it
//! is the plain [`simulate`](crate::analysis::simulate::simulate).

use crate::analysis::replay::{ReplayError, TimedTask};
use crate::analysis::simulate::{simulate, simulate_with, Simulation};
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use std::collections::HashMap;

/// The most rounds [`simulate_on_cores`] replays the plan.
pub const MAX_ROUNDS: usize = 60;

/// Simulates `plan` with room for `slots` ranks computing at full speed at once (`> 0`; cores
/// over compute threads per rank); see the module docs.
pub fn simulate_on_cores(plan: &Plan, slots: f64) -> Result<Simulation, ReplayError> {
    let ranks = plan.problem().ranks() as f64;
    if !(slots.is_finite() && slots > 0.0) || slots >= ranks {
        return simulate(plan);
    }
    let costs = plan.costs();
    let mut factor: HashMap<Task, f64> = HashMap::new();
    let mut sim = simulate(plan)?;
    for _ in 0..MAX_ROUNDS {
        let slowdown = Slowdown::of(sim.timeline(), slots);
        let mut moved = 0.0f64;
        for task in sim.timeline().iter().flatten() {
            if task.task.on_link() || task.end <= task.start {
                continue;
            }
            let seen = slowdown.mean(task.start, task.end);
            let old = factor.get(&task.task).copied().unwrap_or(1.0);
            let new = 0.5 * (old + seen);
            moved = moved.max((new - old).abs());
            factor.insert(task.task, new);
        }
        sim = simulate_with(
            plan,
            |t| costs.task_duration(t) * factor.get(t).copied().unwrap_or(1.0),
            costs.comm(),
        )?;
        if moved < 1e-4 {
            break;
        }
    }
    Ok(sim)
}

/// `max(1, n(t) / slots)` of a timeline, `n(t)` the ranks computing at `t`, as a
/// piecewise-constant function with its running integral.
struct Slowdown {
    /// Breakpoints in time order.
    times: Vec<f64>,
    /// The integral from the first breakpoint to each.
    integral: Vec<f64>,
    /// The value on `[times[i], times[i + 1])`.
    value: Vec<f64>,
}

impl Slowdown {
    fn of(timeline: &[Vec<TimedTask>], slots: f64) -> Slowdown {
        let mut events: Vec<(f64, i32)> = timeline
            .iter()
            .flatten()
            .filter(|t| !t.task.on_link() && t.end > t.start)
            .flat_map(|t| [(t.start, 1), (t.end, -1)])
            .collect();
        // Ends before starts at the same time.
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut times = Vec::with_capacity(events.len());
        let mut value = Vec::with_capacity(events.len());
        let mut running = 0i32;
        for (t, change) in events {
            running += change;
            let v = (f64::from(running) / slots).max(1.0);
            if times.last() == Some(&t) {
                if let Some(last) = value.last_mut() {
                    *last = v;
                }
            } else {
                times.push(t);
                value.push(v);
            }
        }
        let mut integral = Vec::with_capacity(times.len());
        let mut sum = 0.0;
        for i in 0..times.len() {
            integral.push(sum);
            if i + 1 < times.len() {
                sum += value[i] * (times[i + 1] - times[i]);
            }
        }
        Slowdown {
            times,
            integral,
            value,
        }
    }

    /// The integral from the first breakpoint to `t`.
    fn at(&self, t: f64) -> f64 {
        match self.times.partition_point(|&b| b <= t) {
            0 => 0.0,
            i => self.integral[i - 1] + self.value[i - 1] * (t - self.times[i - 1]),
        }
    }

    /// The mean over `[start, end]` (`end > start`).
    fn mean(&self, start: f64, end: f64) -> f64 {
        (self.at(end) - self.at(start)) / (end - start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::plan;

    /// Two ranks, four microbatches, unit costs: rank 0 runs its forwards first.
    fn two_ranks() -> Plan {
        plan(
            4,
            &[
                "0F0 0F1 0F2 0F3 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3",
                "1F0 1I0 1W0 1F1 1I1 1W1 1F2 1I2 1W2 1F3 1I3 1W3",
            ],
        )
    }

    #[test]
    fn with_room_for_every_rank_it_is_the_plain_simulation() {
        let plan = two_ranks();
        let plain = simulate(&plan).unwrap();
        assert_eq!(simulate_on_cores(&plan, 2.0).unwrap(), plain);
        assert_eq!(simulate_on_cores(&plan, 8.0).unwrap(), plain);
    }

    #[test]
    fn ranks_sharing_one_core_take_as_long_as_all_their_work_in_one_line() {
        // Some rank can always compute, so one core is never idle: 24 units of work take 24.
        let plan = two_ranks();
        let plain = simulate(&plan).unwrap().makespan();
        let shared = simulate_on_cores(&plan, 1.0).unwrap().makespan();
        assert!(plain < 20.0, "{plain}");
        assert!((shared - 24.0).abs() < 0.5, "{shared}");
        // Room for one and a half ranks: between the two.
        let between = simulate_on_cores(&plan, 1.5).unwrap().makespan();
        assert!(
            between > plain && between < shared,
            "{plain} < {between} < {shared}"
        );
    }

    #[test]
    fn the_slowdown_is_integrated_piecewise() {
        let task = |rank: &str, start: f64, end: f64| TimedTask {
            task: rank.parse().unwrap(),
            start,
            end,
            sequence: 0,
        };
        // Two ranks busy on [0, 2), one on [2, 4); room for one.
        let timeline = vec![vec![task("0F0", 0.0, 4.0)], vec![task("1F0", 0.0, 2.0)]];
        let slowdown = Slowdown::of(&timeline, 1.0);
        assert_eq!(slowdown.mean(0.0, 2.0), 2.0);
        assert_eq!(slowdown.mean(2.0, 4.0), 1.0);
        assert_eq!(slowdown.mean(0.0, 4.0), 1.5);
        assert_eq!(slowdown.mean(1.0, 3.0), 1.5);
    }
}
