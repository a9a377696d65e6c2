//! `pipeweave run`: execute a plan's programs on a backend with the numeric stage model, and
//! report measured against simulated time and whether the gradients equal the single-device
//! computation.

use crate::cli::outputs::{check_plan, RecvArg};
use crate::cli::plan_command::ScheduleArgs;
use crate::config::build_plan;
use crate::error::Error;
use clap::{Args, ValueEnum};
use pipeweave_backends::numeric::{total_gradients, AffineModel};
use pipeweave_backends::{run_threads, ThreadOptions};
use pipeweave_core::{OpKind, Work};
use serde::Serialize;
use std::io::Write;
use std::time::{Duration, Instant};

/// Relative tolerance for "equal to the single-device computation" (f64 sums in another order).
pub const GRADIENT_TOLERANCE: f64 = 1e-12;

/// Which backend runs the programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// One OS thread per rank, channels as links.
    Threads,
}

/// Arguments of `pipeweave run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    schedule: ScheduleArgs,
    /// The backend.
    #[arg(long, value_enum, default_value_t = Backend::Threads)]
    backend: Backend,
    /// Milliseconds of wall time each unit of cost takes in the run (0: run as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    time_scale: f64,
    /// Receive placement of the projected programs.
    #[arg(long, value_enum, default_value_t = RecvArg::Early)]
    recv: RecvArg,
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
    /// Measured wall time of the run in seconds.
    pub measured_seconds: f64,
    /// Largest relative difference between the pipelined and the single-device gradients.
    pub max_relative_gradient_error: f64,
    /// Whether the gradients are equal within the tolerance.
    pub gradients_equal: bool,
}

/// Runs `pipeweave run`; returns whether the gradients were equal.
pub fn run(args: &RunArgs, stdout: &mut dyn Write) -> Result<bool, Error> {
    if !(args.time_scale.is_finite() && args.time_scale >= 0.0) {
        return Err(Error::Option {
            option: "--time-scale",
            message: format!("{} must be >= 0", args.time_scale),
        });
    }
    let plan = build_plan(&args.schedule.expression, &args.schedule.config()?)?;
    let checked = check_plan(plan, None, args.recv)?;
    let problem = checked.plan.problem().clone();
    let model = AffineModel::new(&problem);
    let reference = model.sequential_gradients(&problem);
    let stage_costs = checked.plan.costs().stages().to_vec();
    let scale = args.time_scale;
    let start = Instant::now();
    let stages = run_threads(
        &problem,
        &checked.programs,
        |_| {
            let stage_costs = stage_costs.clone();
            model.stage(move |work: Work, kind: OpKind| {
                let Some(c) = stage_costs.get(work.stage.index()) else {
                    return Duration::ZERO;
                };
                Duration::from_secs_f64(c.of(kind) * scale / 1000.0)
            })
        },
        ThreadOptions::default(),
    )
    .map_err(Error::Backend)?;
    let measured = start.elapsed().as_secs_f64();
    let gradients = total_gradients(&stages);
    let error = AffineModel::max_relative_error(&gradients, &reference);
    let report = RunReport {
        expression: args.schedule.expression.clone(),
        backend: format!("{:?}", args.backend).to_lowercase(),
        simulated_makespan: checked.simulation.makespan(),
        simulated_seconds: checked.simulation.makespan() * scale / 1000.0,
        measured_seconds: measured,
        max_relative_gradient_error: error,
        gradients_equal: error <= GRADIENT_TOLERANCE,
    };
    let text = if args.json {
        serde_json::to_string_pretty(&report).expect("a run report always serialises") + "\n"
    } else {
        format!(
            "{}  ({} ranks, {} microbatches) on {}\nsimulated   {:.3} units = {:.4} s at {} ms per unit\nmeasured    {:.4} s\ngradients   {} the single-device computation (max relative error {:.2e}, tolerance {:.0e})\n",
            report.expression,
            problem.ranks(),
            problem.microbatches(),
            report.backend,
            report.simulated_makespan,
            report.simulated_seconds,
            scale,
            report.measured_seconds,
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
        })?;
    Ok(report.gradients_equal)
}
