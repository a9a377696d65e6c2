//! The one compile entry: an expression (or an imported schedule) to a verified plan, its
//! simulation and its checked programs. The CLI's `plan`, `check` and `run` and their outputs,
//! the Python module and the trainers go through it; what a backend runs is its
//! [`Compiled::programs`]. The plan alone (`build_plan`, `build_plan_with` a registry,
//! `build_plan_observed`, `build_and_simulate`) comes from the same passes on the same layout.

use crate::config::PipelineConfig;
use crate::error::Error;
use crate::report::PlanReport;
use pipeweave_core::spmd::project::project_simulated;
use pipeweave_core::{
    simulate, verify, CheckedPrograms, CutCosts, Plan, ProgramSet, ProjectionOptions, RecvPolicy,
    Simulation,
};
use pipeweave_transforms::Registry;

/// A verified plan, simulated, with programs the communication checker accepted.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The plan.
    pub plan: Plan,
    /// Its programs (projected, or imported from a lowered file), checked.
    pub programs: CheckedPrograms,
    /// Its simulation.
    pub simulation: Simulation,
}

impl Compiled {
    /// The report `plan --format json` prints, titled `title` (the expression or the file).
    pub fn report(&self, title: &str, cut: Option<&CutCosts>) -> PlanReport {
        PlanReport::new(title, &self.plan, &self.simulation)
            .with_cut(cut)
            .with_programs(self.programs.programs(), self.programs.report())
    }
}

/// Compiles `expression`, runs its passes on the plain layout of `config` and returns the verified
/// plan.
pub fn build_plan(expression: &str, config: &PipelineConfig) -> Result<Plan, Error> {
    build_plan_observed(expression, config, &mut |_, _| {})
}

/// [`build_plan`], calling `observer` with every intermediate (verified) plan.
pub fn build_plan_observed(
    expression: &str,
    config: &PipelineConfig,
    observer: &mut dyn FnMut(&str, &Plan),
) -> Result<Plan, Error> {
    let passes = Registry::builtin().compile_expression(expression)?;
    Ok(passes.run_observed(config.unscheduled_plan()?, observer)?)
}

/// [`build_plan`] and the plan's simulation: the simulation runs while the final plan is
/// verified, and every intermediate plan is verified while the next passes run
/// ([`pipeweave_transforms::PassList::run_beside`]); the same plan and errors as [`build_plan`]
/// then [`pipeweave_core::simulate`], in about half the time on two cores.
pub fn build_and_simulate(
    expression: &str,
    config: &PipelineConfig,
) -> Result<(Plan, Simulation), Error> {
    run_passes(&Registry::builtin(), expression, config)
}

/// [`build_plan`] with the passes of `registry` (the built-ins and a user's own, see
/// [`Registry::register`]).
pub fn build_plan_with(
    registry: &Registry,
    expression: &str,
    config: &PipelineConfig,
) -> Result<Plan, Error> {
    let passes = registry.compile_expression(expression)?;
    Ok(passes.run(config.unscheduled_plan()?)?)
}

/// Compiles `expression` with the passes of `registry`, runs them on the plain layout of
/// `config` (verifying after every pass, the verifications beside the passes and the
/// simulation: [`pipeweave_transforms::PassList::run_beside`]), projects the plan along its
/// simulated timeline with receives placed by `recv`, and checks the programs.
pub fn compile(
    registry: &Registry,
    expression: &str,
    config: &PipelineConfig,
    recv: RecvPolicy,
) -> Result<Compiled, Error> {
    let (plan, simulation) = run_passes(registry, expression, config)?;
    finish(plan, simulation, None, recv)
}

/// The passes of `expression` (from `registry`) on `config`'s plain layout, verified, and the
/// plan's simulation on `config`'s machine.
pub fn run_passes(
    registry: &Registry,
    expression: &str,
    config: &PipelineConfig,
) -> Result<(Plan, Simulation), Error> {
    let passes = registry.compile_expression(expression)?;
    let (plan, simulation) =
        passes.run_beside(config.unscheduled_plan()?, |p| config.simulate(p))?;
    Ok((plan, simulation?))
}

/// Where a plan to compile comes from, which says what is left to do with it.
pub enum Source {
    /// Built by the pass driver with its simulation ([`run_passes`]); the driver verified it
    /// after its last pass, memory bound included: verifying it again would find what the
    /// driver found.
    Built(Plan, Simulation),
    /// Read from a file, with the programs of a lowered file: verified and simulated here first.
    Imported(Plan, Option<ProgramSet>),
}

impl Source {
    /// The plan.
    pub fn plan(&self) -> &Plan {
        match self {
            Source::Built(plan, _) | Source::Imported(plan, _) => plan,
        }
    }
}

/// An imported plan (a schedule file) verified, simulated and, unless `programs` came with it
/// (a lowered file), projected; then its programs checked.
pub fn compile_imported(
    plan: Plan,
    programs: Option<ProgramSet>,
    recv: RecvPolicy,
) -> Result<Compiled, Error> {
    finish_source(Source::Imported(plan, programs), recv)
}

/// A verified plan and its simulation, with programs (projected where none are given), checked.
/// The figures must be finite.
pub fn finish(
    plan: Plan,
    simulation: Simulation,
    programs: Option<ProgramSet>,
    recv: RecvPolicy,
) -> Result<Compiled, Error> {
    match programs {
        None => finish_source(Source::Built(plan, simulation), recv),
        Some(programs) => {
            let checked = CheckedPrograms::check(plan.problem(), programs)?;
            compiled(plan, checked, simulation)
        }
    }
}

/// [`finish_beside`] with nothing beside the check.
pub fn finish_source(source: Source, recv: RecvPolicy) -> Result<Compiled, Error> {
    finish_beside(source, recv, |_, _, _| ()).map(|(compiled, ())| compiled)
}

/// The compile entry's last steps for `source`: an imported plan verified and simulated; the
/// plan projected along its simulated timeline with receives placed by `recv` (unless programs
/// came with it); the programs checked on a thread of their own while `beside` runs with the
/// plan, the programs and the simulation (the CLI renders its files there, and puts none in
/// place unless this returns Ok); the figures finite.
pub fn finish_beside<T>(
    source: Source,
    recv: RecvPolicy,
    beside: impl FnOnce(&Plan, &ProgramSet, &Simulation) -> T,
) -> Result<(Compiled, T), Error> {
    let (plan, programs, simulation) = match source {
        Source::Built(plan, simulation) => (plan, None, simulation),
        Source::Imported(plan, programs) => {
            verify(&plan)?;
            // A verified plan runs to its end: its timeline is the one the projection replays.
            let simulation = simulate(&plan)?;
            (plan, programs, simulation)
        }
    };
    let programs = match programs {
        Some(programs) => programs,
        None => project_simulated(&plan, &simulation, projection(recv))?,
    };
    let (checked, given) = CheckedPrograms::check_beside(plan.problem(), programs, |programs| {
        beside(&plan, programs, &simulation)
    });
    Ok((compiled(plan, checked?, simulation)?, given))
}

/// The compiled plan, once its figures are finite.
fn compiled(
    plan: Plan,
    programs: CheckedPrograms,
    simulation: Simulation,
) -> Result<Compiled, Error> {
    finite(&simulation)?;
    Ok(Compiled {
        plan,
        programs,
        simulation,
    })
}

/// The projection options of `recv` (all ops, not only forwards).
pub fn projection(recv: RecvPolicy) -> ProjectionOptions {
    ProjectionOptions {
        recv,
        forward_only: false,
    }
}

/// An error where the makespan or bubble rate is not a finite number.
pub fn finite(simulation: &Simulation) -> Result<(), Error> {
    for (what, value) in [
        ("makespan", simulation.makespan()),
        ("bubble rate", simulation.bubble_rate()),
    ] {
        if !value.is_finite() {
            return Err(Error::Overflow { what, value });
        }
    }
    Ok(())
}
