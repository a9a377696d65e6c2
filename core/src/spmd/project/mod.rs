//! Projection of a verified global plan into one program per rank.
//!
//! Every cross-rank dependency becomes a message ([`crate::spmd::messages`]): an activation when a
//! forward's next stage runs on another rank, a gradient when an input-gradient backward's previous
//! stage does. Messages are ordered globally by the simulated time at which their producing task
//! ends (the replay engine's completion order, a topological order, breaking ties), and every rank
//! lays out its events on that one time line: a compute at its simulated start, its sends at its
//! end, a receive where its message is produced (early) or just before its consumer. So the
//! programs follow the simulated schedule: executed with the costs of the model, they take the
//! simulated time. With `Early` receives every rank's communication follows the one global key, so
//! the programs complete even under blocking rendezvous semantics; `JustInTime` receives keep each
//! peer's send order but are guaranteed to complete under batched semantics only (a two-rank
//! exchange of one send each way deadlocks when each blocks on its send).
//!
//! Receive placement is a policy ([`RecvPolicy`]): `Early` posts a receive at the message's place in
//! the global order (as soon as it can exist; each early receive holds a buffer), `JustInTime`
//! right before the compute that consumes it (fewest buffers). Sends and receives that fall between
//! the same two computes form one [`CommGroup`](crate::spmd::program::CommGroup), posted together
//! like `batch_isend_irecv`, so two ranks that exchange at the same time (in a two-rank pipeline
//! the previous and the next peer are one rank) never block each other.
//!
//! Markers: `Loss` after the forward of a route's last stage; `FreeOutput` after an activation is
//! sent; `GradSync(stage)` before the last task producing weight gradients of that stage on the
//! rank; `FlushWeightGrads` at the end. The residency tasks: a recompute is a compute like any
//! other, `Drop` follows (with its sends) the forward of every pair the plan recomputes, and a
//! transfer (`Offload`, `Reload`) sits where the plan's order puts it, right after the compute
//! before it (which is when it is issued on the link). PyTorch's parameter actions
//! ([`Instr::Params`](crate::spmd::program::Instr::Params)) where its own lowering puts them
//! ([`crate::spmd::params::place`]): unshards and reshards right before a compute, a stage's
//! gradient reduction and its wait right after the compute of its last weight gradient and that
//! compute's sends, the last reshards at the end. `forward_only` projects the forwards and losses
//! alone (and the residency actions, no reductions).
//!
//! The steps: [`timed_source`] replays the plan (forward part only, for evaluation), unless the
//! caller hands in its simulation ([`project_simulated`]). Then each rank on its own (ranks are
//! independent once the timeline is known; a large plan's ranks are split into blocks projected
//! on threads of their own): a [`Receives`] (`receives.rs`) walks the timelines of the ranks
//! that send to it and turns each output for it into a receive, keyed on the time line
//! ([`EventKey`](events::EventKey), [`EventClass`](events::EventClass), in `events.rs`) and
//! sorted; a [`RankProjection`](rank::RankProjection) (`rank.rs`) walks the rank's tasks
//! emitting their events, parameter actions included, which come out in key order (a rank's
//! tasks follow each other in time and in the topological order), with the receives merged in;
//! a [`Layout`](layout::Layout) (`layout.rs`) groups neighbouring sends and receives into
//! instructions. Every key is distinct, so the merge is the one order a full sort of all events
//! would give.

mod all_to_all;
mod events;
mod layout;
mod rank;
mod receives;
#[cfg(test)]
mod tests;

use crate::analysis::replay::{replay, TimedTask};
use crate::analysis::simulate::Simulation;
use crate::analysis::verify::{verify_schedule, Violations};
use crate::ir::deps::Links;
use crate::ir::facts::{Facts, Residency};
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use crate::spmd::program::{ProgramSet, Semantics};
use all_to_all::Experts;
use rank::{project_rank, Shared};
use receives::{senders, Receives, Starts};
use std::borrow::Cow;

/// Where receives go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum RecvPolicy {
    /// At the message's place in the global order.
    #[default]
    Early,
    /// Right before the consuming compute.
    JustInTime,
}

/// Options of [`project`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ProjectionOptions {
    /// Receive placement.
    pub recv: RecvPolicy,
    /// Project the forwards (and losses) only: evaluation.
    pub forward_only: bool,
}

/// The part of a task a forward-only program runs.
fn forward_part(task: &Task) -> Option<Task> {
    match *task {
        Task::Forward(_) => Some(*task),
        Task::Overlapped { forward, .. } => Some(Task::Forward(forward)),
        _ => None,
    }
}

/// Projects `plan` into per-rank programs. The plan must be complete and runnable: an
/// incomplete plan or one that cannot finish is rejected with the verifier's violations; the
/// programs themselves are for [`crate::spmd::check::check_programs`] to check.
pub fn project(plan: &Plan, options: ProjectionOptions) -> Result<ProgramSet, Violations> {
    check_complete(plan)?;
    let (source, timeline) = timed_source(plan, options.forward_only)?;
    Ok(programs_of(&source, &timeline, options))
}

/// [`project`] for a plan already simulated: the programs follow `simulation`'s timeline instead
/// of a replay of their own (it must be [`crate::simulate`]'s result for `plan`; a timeline that
/// does not hold the plan's orders, or whose tasks on a rank overlap, is replayed again, and so
/// are forward-only programs, which run a part of the plan).
pub fn project_simulated(
    plan: &Plan,
    simulation: &Simulation,
    options: ProjectionOptions,
) -> Result<ProgramSet, Violations> {
    let timeline = simulation.timeline();
    let matches = timeline.len() == plan.orders().len()
        && timeline
            .iter()
            .zip(plan.orders())
            .all(|(timed, order)| timed.len() == order.len());
    if options.forward_only || !matches || !is_sequential(timeline) {
        return project(plan, options);
    }
    check_complete(plan)?;
    Ok(programs_of(plan, timeline, options))
}

/// An incomplete plan is rejected with the verifier's violations (a complete one may still not
/// run; the replay finds that).
fn check_complete(plan: &Plan) -> Result<(), Violations> {
    let ops: usize = plan.orders().iter().flatten().map(|t| t.op_array().1).sum();
    if ops != plan.problem().work_count() * 3 {
        verify_schedule(plan)?;
    }
    Ok(())
}

/// Plans with fewer tasks than this are projected on the calling thread alone.
const PARALLEL_TASKS: usize = 1 << 15;

/// The programs of `source` laid out along its `timeline`. Ranks are independent once the
/// timeline is known: a large plan's ranks are split into contiguous blocks projected on
/// threads of their own (each reusing its receive buffers from one rank to the next).
fn programs_of(
    source: &Plan,
    timeline: &[Vec<TimedTask>],
    options: ProjectionOptions,
) -> ProgramSet {
    let links = Links::of(source.problem());
    let senders = senders(source.problem());
    let dropped = source.recomputed_pairs();
    let experts = Experts::of(source.costs());
    let shared = Shared {
        links: &links,
        dropped: &dropped,
        experts: experts.as_ref(),
    };
    let starts = (options.recv == RecvPolicy::JustInTime).then(|| Starts::index(&links, timeline));
    let project = |ranks: std::ops::Range<usize>| {
        let mut receives = Receives::new(
            &links,
            timeline,
            &senders,
            starts.as_ref(),
            experts.as_ref(),
        );
        let mut buffer = Vec::new();
        ranks
            .map(|r| project_rank(&shared, &mut receives, &mut buffer, r, options))
            .collect::<Vec<_>>()
    };
    let tasks: usize = timeline.iter().map(Vec::len).sum();
    let threads = if tasks < PARALLEL_TASKS {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(timeline.len()))
    };
    let programs = if threads <= 1 {
        project(0..timeline.len())
    } else {
        let block = timeline.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..timeline.len())
                .step_by(block)
                .map(|first| {
                    let ranks = first..(first + block).min(timeline.len());
                    scope.spawn(move || project(ranks))
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    };
    let semantics = match options.recv {
        RecvPolicy::Early => Semantics::Blocking,
        RecvPolicy::JustInTime => Semantics::Batched,
    };
    ProgramSet {
        programs,
        forward_only: options.forward_only,
        semantics,
    }
}

/// Whether every rank's timed tasks follow each other (each starts after the previous ends, in
/// completion order): what a replay produces, and what laying out a rank's own events in the
/// order they are generated relies on.
fn is_sequential(timeline: &[Vec<TimedTask>]) -> bool {
    timeline.iter().all(|tasks| {
        let mut computes = tasks.iter().filter(|t| !t.task.on_link()).peekable();
        tasks.iter().all(|t| t.start >= 0.0 && t.end >= t.start)
            && std::iter::from_fn(|| {
                let t = computes.next()?;
                Some(
                    computes
                        .peek()
                        .is_none_or(|next| next.start >= t.end && next.sequence > t.sequence),
                )
            })
            .all(|ok| ok)
    })
}

/// The plan the programs run (its forward part alone for evaluation) and its simulated timeline.
fn timed_source(
    plan: &Plan,
    forward_only: bool,
) -> Result<(Cow<'_, Plan>, Vec<Vec<TimedTask>>), Violations> {
    let source = if forward_only {
        let orders = plan
            .orders()
            .iter()
            .map(|o| o.iter().filter_map(forward_part).collect())
            .collect();
        // The forward part runs no recompute or transfer: its activations are kept.
        let facts = Facts {
            residency: Residency::KEPT,
            ..plan.facts()
        };
        Cow::Owned(
            plan.clone()
                .reshaped(None, orders, facts)
                .expect("a plan's forward part keeps its problem, models and layout"),
        )
    } else {
        Cow::Borrowed(plan)
    };
    let costs = source.costs();
    match replay(&source, |t| costs.task_duration(t), costs.comm(), true) {
        Ok(outcome) => Ok((source, outcome.timeline)),
        Err(stuck) => Err(Violations(vec![stuck.into()])),
    }
}
