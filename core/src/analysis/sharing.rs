//! Ranks that share what the simulator otherwise gives each its own: cores (a CPU run of more
//! ranks than the machine has cores, where the operating system time-shares the busy ranks) and
//! host links (neighbouring ranks offloading over one link, or several GPUs behind one PCIe
//! switch).
//!
//! The model is processor sharing. While `n` ranks compute at once on room for `slots` of them
//! (cores over each rank's compute threads), each runs at `min(1, slots / n)` of its speed; while
//! `n` transfers of the ranks on one shared link run at once, each moves at `1 / n` of the link's
//! speed (a rank's own transfers run one at a time, [`crate::analysis::replay`]). Ranks share a
//! link in consecutive groups of [`Sharing::ranks_per_link`]: ranks `0..k` the first, `k..2k` the
//! next. [`simulate_shared`] finds the timeline where every task's length is its cost times the
//! mean slowdown over its own span: starting from the unshared replay, it replays the plan with
//! each task stretched by the slowdown the previous timeline shows over it (half of the change
//! per round, so the rounds settle), until no factor moves by more than 1e-4 or after
//! [`MAX_ROUNDS`] rounds. Computes use no link and transfers no core. With room for every rank
//! and a link per rank it is the plain [`simulate`](crate::analysis::simulate::simulate).

use crate::analysis::replay::{ReplayError, TimedTask};
use crate::analysis::simulate::{simulate, simulate_with, Simulation};
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use std::collections::HashMap;
use std::num::NonZeroU32;

/// The most rounds [`simulate_shared`] replays the plan.
pub const MAX_ROUNDS: usize = 60;

/// What the ranks of a run share: room for `slots` ranks computing at full speed at once (None:
/// a core, or device, per rank) and how many consecutive ranks share one host link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sharing {
    slots: Option<f64>,
    ranks_per_link: NonZeroU32,
}

impl Default for Sharing {
    /// A core and a host link per rank.
    fn default() -> Sharing {
        Sharing {
            slots: None,
            ranks_per_link: NonZeroU32::MIN,
        }
    }
}

impl Sharing {
    /// Room for `slots` ranks computing at once (cores over compute threads per rank; a value
    /// that is not finite and positive, or not below the ranks, shares nothing).
    pub fn with_cores(self, slots: Option<f64>) -> Sharing {
        let slots = slots.filter(|s| s.is_finite() && *s > 0.0);
        Sharing { slots, ..self }
    }

    /// `ranks` consecutive ranks on each host link (1: a link per rank).
    pub fn with_ranks_per_link(self, ranks: NonZeroU32) -> Sharing {
        Sharing {
            ranks_per_link: ranks,
            ..self
        }
    }

    /// Room for how many ranks computing at once (None: every rank).
    pub fn slots(&self) -> Option<f64> {
        self.slots
    }

    /// How many consecutive ranks share one host link.
    pub fn ranks_per_link(&self) -> u32 {
        self.ranks_per_link.get()
    }

    /// The host link rank `rank` uses.
    pub fn link_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_link.get() as usize
    }
}

/// Simulates `plan` with room for `slots` ranks computing at full speed at once (`> 0`; cores
/// over compute threads per rank) and a host link per rank; see the module docs.
pub fn simulate_on_cores(plan: &Plan, slots: f64) -> Result<Simulation, ReplayError> {
    simulate_shared(plan, Sharing::default().with_cores(Some(slots)))
}

/// Simulates `plan` on ranks that share cores or host links as `sharing` says; see the module
/// docs.
pub fn simulate_shared(plan: &Plan, sharing: Sharing) -> Result<Simulation, ReplayError> {
    let ranks = plan.problem().ranks() as usize;
    let cores = sharing.slots.filter(|&s| s < ranks as f64);
    let links = (sharing.ranks_per_link() > 1 && plan.facts().residency.offloaded)
        .then(|| sharing.link_of(ranks.saturating_sub(1)) + 1);
    if cores.is_none() && links.is_none() {
        return simulate(plan);
    }
    let costs = plan.costs();
    let mut factor: HashMap<Task, f64> = HashMap::new();
    let mut sim = simulate(plan)?;
    for _ in 0..MAX_ROUNDS {
        let computing = cores.map(|slots| {
            let spans = sim
                .timeline()
                .iter()
                .flatten()
                .filter(|t| !t.task.on_link());
            Slowdown::of(spans, slots)
        });
        let on_links: Vec<Slowdown> = (0..links.unwrap_or(0))
            .map(|link| {
                let spans = sim
                    .timeline()
                    .iter()
                    .enumerate()
                    .filter(|(r, _)| sharing.link_of(*r) == link)
                    .flat_map(|(_, tasks)| tasks.iter().filter(|t| t.task.on_link()));
                Slowdown::of(spans, 1.0)
            })
            .collect();
        let mut moved = 0.0f64;
        for (r, tasks) in sim.timeline().iter().enumerate() {
            for task in tasks.iter().filter(|t| t.end > t.start) {
                let slowdown = if task.task.on_link() {
                    on_links.get(sharing.link_of(r))
                } else {
                    computing.as_ref()
                };
                let Some(slowdown) = slowdown else {
                    continue;
                };
                let seen = slowdown.mean(task.start, task.end);
                let old = factor.get(&task.task).copied().unwrap_or(1.0);
                let new = 0.5 * (old + seen);
                moved = moved.max((new - old).abs());
                factor.insert(task.task, new);
            }
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

/// `max(1, n(t) / slots)` of a set of spans, `n(t)` those running at `t`, as a
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
    fn of<'a>(spans: impl Iterator<Item = &'a TimedTask>, slots: f64) -> Slowdown {
        let mut events: Vec<(f64, i32)> = spans
            .filter(|t| t.end > t.start)
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
    fn ranks_on_one_link_share_its_speed_while_their_transfers_overlap() {
        // Each rank offloads both microbatches; rank 0's reloads run while rank 1 still moves
        // its own out: on one link each moves at half speed while both run.
        let plan = plan(
            2,
            &[
                "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0RELOAD0 0B0 0RELOAD1 0B1",
                "1F0 1OFFLOAD0 1F1 1OFFLOAD1 1RELOAD0 1B0 1RELOAD1 1B1",
            ],
        );
        let plain = simulate(&plan).unwrap();
        let own = Sharing::default();
        assert_eq!(simulate_shared(&plan, own).unwrap(), plain);
        let two = own.with_ranks_per_link(NonZeroU32::new(2).unwrap());
        assert_eq!((two.link_of(0), two.link_of(1), two.link_of(2)), (0, 0, 1));
        let shared = simulate_shared(&plan, two).unwrap();
        assert!(
            shared.makespan() > plain.makespan(),
            "{} vs {}",
            shared.makespan(),
            plain.makespan()
        );
        let transfer = |sim: &Simulation, r: usize, name: &str| {
            let t = sim.timeline()[r]
                .iter()
                .find(|t| t.task.to_string() == name)
                .unwrap();
            t.end - t.start
        };
        assert_eq!(transfer(&plain, 0, "0RELOAD0"), 1.0);
        // 0RELOAD0 and 1OFFLOAD1 run together throughout: each takes twice its cost; the
        // transfers alone on the link keep theirs.
        assert!(
            (transfer(&shared, 0, "0RELOAD0") - 2.0).abs() < 1e-3,
            "{shared:?}"
        );
        assert!(
            (transfer(&shared, 1, "1OFFLOAD1") - 2.0).abs() < 1e-3,
            "{shared:?}"
        );
        assert_eq!(transfer(&shared, 1, "1OFFLOAD0"), 1.0);
        // Computes share no link: with cores to spare they keep their costs.
        for r in 0..2 {
            for t in shared.timeline()[r].iter().filter(|t| !t.task.on_link()) {
                assert_eq!(
                    t.end - t.start,
                    plan.costs().task_duration(&t.task),
                    "{t:?}"
                );
            }
        }
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
        let timeline = [vec![task("0F0", 0.0, 4.0)], vec![task("1F0", 0.0, 2.0)]];
        let slowdown = Slowdown::of(timeline.iter().flatten(), 1.0);
        assert_eq!(slowdown.mean(0.0, 2.0), 2.0);
        assert_eq!(slowdown.mean(2.0, 4.0), 1.0);
        assert_eq!(slowdown.mean(0.0, 4.0), 1.5);
        assert_eq!(slowdown.mean(1.0, 3.0), 1.5);
    }
}
