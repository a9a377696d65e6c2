//! `pipeweave run`: execute a plan's programs on a backend with the numeric stage model, and
//! report measured against simulated time and whether the gradients equal the single-device
//! computation.
//!
//! Backends: `threads` (one OS thread per rank) and `mpi` (one process per rank: run the same
//! command under `mpirun -np P`; needs the cargo feature `mpi`). Under MPI every process builds
//! the plan, projects and checks it itself, runs its own rank, and rank 0 gathers the gradients and
//! measured times and prints the report; every process exits with the same status. An error that
//! every process finds alike (bad input, a world of the wrong size) is printed once, by rank 0.

use crate::cli::options::number;
use crate::cli::outputs::{check_plan, RecvArg, Source};
use crate::cli::plan_command::ScheduleArgs;
use crate::compile::build_and_simulate;
use crate::error::Error;
use clap::Args;
use pipeweave_backends::numeric::{total_gradients, AffineModel, AffineStage, Gradients};
use pipeweave_backends::{run_threads, ThreadOptions};
use pipeweave_core::{simulate_with, CheckedPrograms, CostModel, Plan, Problem, Task};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;

/// Relative tolerance for "equal to the single-device computation" (f64 sums in another order).
pub const GRADIENT_TOLERANCE: f64 = 1e-12;

/// Which backend runs the programs (the one choice `pipeweave train` and `train_gpt` take too).
pub use pipeweave_backends::Backend;

/// Arguments of `pipeweave run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    schedule: ScheduleArgs,
    /// The backend.
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    backend: Backend,
    /// Milliseconds of wall time each unit of cost takes in the run (0: run as fast as possible).
    #[arg(long, default_value = "0", allow_negative_numbers = true,
          value_parser = number("--time-scale"))]
    time_scale: f64,
    /// Receive placement of the projected programs.
    #[arg(long, value_enum, default_value_t = RecvArg::Early)]
    recv: RecvArg,
    /// Seconds a rank may wait for one message before the run is declared stuck.
    #[arg(long, value_name = "SECONDS", default_value = "60", allow_negative_numbers = true,
          value_parser = number("--timeout"))]
    timeout: f64,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// What a run measured.
#[derive(Debug, Serialize)]
pub struct RunReport {
    /// The expression.
    pub expression: String,
    /// The backend.
    pub backend: String,
    /// Simulated makespan in cost units.
    pub simulated_makespan: f64,
    /// Simulated makespan in seconds at the run's time scale.
    pub simulated_seconds: f64,
    /// Measured makespan in seconds: the last task's end less the first task's start over every
    /// rank (the checks, the ranks' start and, under MPI, the programs' agreement excluded; MPI
    /// ranks' clocks are aligned by a barrier).
    pub measured_seconds: f64,
    /// The plan replayed with the durations its tasks took in this run and no communication
    /// latency: the makespan had nothing but the tasks taken time (None when a task's duration
    /// is missing). `measured_seconds` over this is the cost of the interpreter and the
    /// transport, free of how far the kernels' own times strayed from the cost model.
    pub replayed_seconds: Option<f64>,
    /// `measured_seconds / replayed_seconds` (meaningful with a time scale above 0; the text
    /// report shows it only then).
    pub overhead: Option<f64>,
    /// Largest relative difference between the pipelined and the single-device gradients.
    pub max_relative_gradient_error: f64,
    /// Whether the gradients are equal within the tolerance.
    pub gradients_equal: bool,
}

/// A plan built, projected, checked and simulated, with the numeric model to run it on.
struct Prepared {
    plan: Plan,
    problem: Problem,
    programs: CheckedPrograms,
    makespan: f64,
    costs: CostModel,
    model: AffineModel,
    reference: Gradients,
}

impl Prepared {
    fn new(args: &RunArgs) -> Result<Prepared, Error> {
        let (plan, simulation) =
            build_and_simulate(&args.schedule.expression, &args.schedule.config()?.0)?;
        let checked = check_plan(Source::Built(plan, simulation), args.recv)?;
        let problem = checked.plan.problem().clone();
        let model = AffineModel::new(&problem);
        let reference = model.sequential_gradients(&problem);
        Ok(Prepared {
            makespan: checked.simulation.makespan(),
            costs: checked.plan.costs().clone(),
            programs: checked.programs,
            plan: checked.plan,
            problem,
            model,
            reference,
        })
    }

    /// One rank's stage, spending each op's cost at the run's time scale.
    fn stage(&self, scale: f64) -> AffineStage {
        let costs = self.costs.clone();
        self.model.stage(move |task: &Task| {
            Duration::from_secs_f64(costs.task_duration(task) * scale / 1000.0)
        })
    }

    /// The makespan in seconds of the plan replayed with `durations` (seconds per task) and no
    /// communication latency; None when a task of the plan has no duration.
    fn replayed(&self, durations: &HashMap<Task, f64>) -> Option<f64> {
        let complete = self
            .plan
            .orders()
            .iter()
            .flatten()
            .all(|task| durations.get(task).is_some_and(|d| d.is_finite()));
        if !complete {
            return None;
        }
        // Every task has a duration: the lookup's default is never used.
        simulate_with(
            &self.plan,
            |task| durations.get(task).copied().unwrap_or(0.0),
            0.0,
        )
        .ok()
        .map(|simulation| simulation.makespan())
    }

    /// The report of a run that measured `measured` seconds, whose tasks took `durations`, and
    /// that computed `gradients`.
    fn report(
        &self,
        args: &RunArgs,
        measured: f64,
        durations: &HashMap<Task, f64>,
        gradients: &Gradients,
    ) -> RunReport {
        let error = AffineModel::max_relative_error(gradients, &self.reference);
        let replayed = self.replayed(durations);
        RunReport {
            expression: args.schedule.expression.clone(),
            backend: args.backend.name().to_string(),
            simulated_makespan: self.makespan,
            simulated_seconds: self.makespan * args.time_scale / 1000.0,
            measured_seconds: measured,
            replayed_seconds: replayed,
            overhead: replayed.filter(|r| *r > 0.0).map(|r| measured / r),
            max_relative_gradient_error: error,
            gradients_equal: error <= GRADIENT_TOLERANCE,
        }
    }
}

/// Runs `pipeweave run`; returns whether the gradients were equal.
pub fn run(args: &RunArgs, stdout: &mut dyn Write) -> Result<bool, Error> {
    if !(args.time_scale.is_finite() && args.time_scale >= 0.0) {
        return Err(Error::Option {
            option: "--time-scale",
            message: format!("{} must be >= 0", args.time_scale),
        });
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 1e9) {
        return Err(Error::Option {
            option: "--timeout",
            message: format!("{} must be a number of seconds > 0", args.timeout),
        });
    }
    match args.backend {
        Backend::Threads => run_on_threads(args, stdout),
        Backend::Mpi => run_on_mpi(args, stdout),
    }
}

fn run_on_threads(args: &RunArgs, stdout: &mut dyn Write) -> Result<bool, Error> {
    let prepared = Prepared::new(args)?;
    let stages = run_threads(
        &prepared.programs,
        |_| prepared.stage(args.time_scale),
        ThreadOptions {
            receive_timeout: Duration::from_secs_f64(args.timeout),
        },
    )
    .map_err(Error::Backend)?;
    let spans: Vec<_> = stages.iter().filter_map(AffineStage::busy).collect();
    let measured = match (
        spans.iter().map(|s| s.0).min(),
        spans.iter().map(|s| s.1).max(),
    ) {
        (Some(first), Some(last)) => last.duration_since(first).as_secs_f64(),
        _ => 0.0,
    };
    let durations: HashMap<Task, f64> = stages.iter().flat_map(AffineStage::task_seconds).collect();
    let report = prepared.report(args, measured, &durations, &total_gradients(&stages));
    write_report(args, &prepared.problem, &report, stdout)?;
    Ok(report.gradients_equal)
}

/// Without the feature: a one-line error (exit 2).
#[cfg(not(feature = "mpi"))]
fn run_on_mpi(_args: &RunArgs, _stdout: &mut dyn Write) -> Result<bool, Error> {
    Err(Error::Option {
        option: "--backend",
        message: "mpi needs pipeweave built with the cargo feature `mpi` \
                  (cargo build --release --features mpi)"
            .to_string(),
    })
}

/// Under MPI: every process runs its rank; rank 0 reports; all exit alike.
///
/// An error is printed here, by rank 0 only (every process finds the same errors before the run;
/// the run's own failures abort the job inside it), and every process then waits for the others
/// (so that `mpirun` does not end rank 0 before it has printed), finalises MPI and exits with the
/// status of that error.
#[cfg(feature = "mpi")]
fn run_on_mpi(args: &RunArgs, stdout: &mut dyn Write) -> Result<bool, Error> {
    use pipeweave_backends::mpi::rsmpi;
    use rsmpi::collective::CommunicatorCollectives;
    use rsmpi::topology::Communicator;

    let Some(universe) = rsmpi::initialize() else {
        return Err(Error::Option {
            option: "--backend",
            message: "MPI was already initialised in this process".to_string(),
        });
    };
    let world = universe.world();
    let result = mpi_rank(args, &world, stdout);
    let _ = stdout.flush();
    if let Err(e) = &result {
        if world.rank() == 0 {
            eprintln!("error: {}", e.to_string().replace('\n', " "));
        }
    }
    // Every process gets here (see `mpi_rank`), also rank 0 after an error of its own.
    world.barrier();
    // MPI_Finalize before any exit.
    drop(world);
    drop(universe);
    match result {
        Err(e) => std::process::exit(super::exit_code(&e)),
        Ok(equal) => Ok(equal),
    }
}

/// This process's part of an MPI run of `pipeweave run`. Every process returns from it: an error
/// before the run is found by every process alike, a failure in the run aborts the job, and after
/// the run only rank 0's writing of the report can fail.
#[cfg(feature = "mpi")]
fn mpi_rank(
    args: &RunArgs,
    world: &pipeweave_backends::mpi::rsmpi::topology::SimpleCommunicator,
    stdout: &mut dyn Write,
) -> Result<bool, Error> {
    use pipeweave_backends::mpi::{rsmpi, run_mpi, MpiOptions};
    use rsmpi::collective::{CommunicatorCollectives, Root};
    use rsmpi::topology::Communicator;

    let processes = world.size();
    if i64::from(processes) != i64::from(args.schedule.ranks) {
        return Err(Error::Option {
            option: "--ranks",
            message: format!(
                "{} ranks need mpirun -np {}, but this MPI job has {processes} processes",
                args.schedule.ranks, args.schedule.ranks
            ),
        });
    }
    let prepared = Prepared::new(args)?;
    let mut stage = prepared.stage(args.time_scale);
    world.barrier();
    // The ranks' clocks are compared from here: the barrier ends on all of them at once, within
    // its latency.
    let epoch = std::time::Instant::now();
    run_mpi(
        world,
        &prepared.programs,
        &mut stage,
        MpiOptions {
            receive_timeout: Duration::from_secs_f64(args.timeout),
        },
    )?;
    // Every rank: its gradients (one pair per weight set, as many on every rank), then its first
    // task's start and last task's end since the epoch, then the seconds each task of its order
    // took (NaN for one it did not run), padded with NaN to the longest order.
    let (first, last) = stage.busy().map_or((f64::INFINITY, 0.0), |(first, last)| {
        (
            first.duration_since(epoch).as_secs_f64(),
            last.duration_since(epoch).as_secs_f64(),
        )
    });
    let mine: Vec<f64> = stage
        .gradients()
        .iter()
        .flat_map(|&(a, b)| [a, b])
        .chain([first, last])
        .chain(order_durations(&prepared.plan, &stage, world.rank()))
        .collect();
    let root = world.process_at_rank(0);
    let mut equal = false;
    if world.rank() == 0 {
        let mut all = vec![0.0f64; mine.len() * processes as usize];
        root.gather_into_root(&mine[..], &mut all[..]);
        let mut gradients: Gradients = vec![(0.0, 0.0); stage.gradients().len()];
        let (mut first, mut last) = (f64::INFINITY, 0.0f64);
        let pairs = stage.gradients().len() * 2;
        let mut durations = HashMap::new();
        for (rank, values) in all.chunks_exact(mine.len()).enumerate() {
            let order = prepared
                .plan
                .orders()
                .get(rank)
                .map_or(&[][..], Vec::as_slice);
            for (task, &seconds) in order.iter().zip(&values[pairs + 2..]) {
                if seconds.is_finite() {
                    durations.insert(*task, seconds);
                }
            }
            for (total, pair) in gradients.iter_mut().zip(values[..pairs].chunks_exact(2)) {
                total.0 += pair[0];
                total.1 += pair[1];
            }
            first = first.min(values[pairs]);
            last = last.max(values[pairs + 1]);
        }
        let measured = if first.is_finite() { last - first } else { 0.0 };
        let report = prepared.report(args, measured, &durations, &gradients);
        equal = report.gradients_equal;
        root.broadcast_into(&mut equal);
        write_report(args, &prepared.problem, &report, stdout)?;
    } else {
        root.gather_into(&mine[..]);
        root.broadcast_into(&mut equal);
    }
    Ok(equal)
}

/// The seconds each task of rank `rank`'s order took on `stage` (NaN for one it did not run),
/// padded with NaN to the plan's longest order so that every rank sends as many.
#[cfg(feature = "mpi")]
fn order_durations(plan: &Plan, stage: &AffineStage, rank: i32) -> Vec<f64> {
    let longest = plan.orders().iter().map(Vec::len).max().unwrap_or(0);
    let took: HashMap<Task, f64> = stage.task_seconds().collect();
    let order = usize::try_from(rank)
        .ok()
        .and_then(|r| plan.orders().get(r))
        .map_or(&[][..], Vec::as_slice);
    let mut seconds: Vec<f64> = order
        .iter()
        .map(|task| took.get(task).copied().unwrap_or(f64::NAN))
        .collect();
    seconds.resize(longest, f64::NAN);
    seconds
}

/// Writes the report as text or JSON.
fn write_report(
    args: &RunArgs,
    problem: &Problem,
    report: &RunReport,
    stdout: &mut dyn Write,
) -> Result<(), Error> {
    let text = if args.json {
        serde_json::to_string_pretty(report).expect("a run report always serialises") + "\n"
    } else {
        format!(
            "{}  ({} ranks, {}) on {}\nsimulated   {:.3} units = {:.4} s at {} ms per unit\nmeasured    {:.4} s\n{}gradients   {} the single-device computation (max relative error {:.2e}, tolerance {:.0e})\n",
            report.expression,
            problem.ranks(),
            problem.describe_microbatches(),
            report.backend,
            report.simulated_makespan,
            report.simulated_seconds,
            args.time_scale,
            report.measured_seconds,
            // Without a time scale the tasks take no time of their own: the ratio would be noise.
            match (report.replayed_seconds, report.overhead) {
                (Some(replayed), Some(overhead)) if args.time_scale > 0.0 => format!(
                    "replayed    {replayed:.4} s with the tasks' measured times: measured / replayed = {overhead:.3}\n"
                ),
                _ => String::new(),
            },
            if report.gradients_equal { "equal" } else { "DIFFER from" },
            report.max_relative_gradient_error,
            GRADIENT_TOLERANCE
        )
    };
    stdout
        .write_all(text.as_bytes())
        .map_err(|source| Error::Io {
            path: "<stdout>".to_string(),
            source,
        })
}
