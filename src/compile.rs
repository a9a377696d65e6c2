//! The one compile entry: an expression (or an imported schedule) to a verified plan, its
//! simulation and its checked programs. The CLI's `plan`, `check` and `run` and the Python
//! module go through it; what a backend runs is its [`Compiled::programs`].

use crate::config::PipelineConfig;
use crate::error::Error;
use crate::report::PlanReport;
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

/// An imported plan (a schedule file) verified, simulated and, unless `programs` came with it
/// (a lowered file), projected; then its programs checked.
pub fn compile_imported(
    plan: Plan,
    programs: Option<ProgramSet>,
    recv: RecvPolicy,
) -> Result<Compiled, Error> {
    verify(&plan)?;
    let simulation = simulate(&plan)?;
    finish(plan, simulation, programs, recv)
}

/// A verified plan and its simulation, with programs (projected where none are given), checked.
/// The figures must be finite.
pub fn finish(
    plan: Plan,
    simulation: Simulation,
    programs: Option<ProgramSet>,
    recv: RecvPolicy,
) -> Result<Compiled, Error> {
    let programs = match programs {
        Some(p) => CheckedPrograms::check(plan.problem(), p)?,
        None => CheckedPrograms::of_plan(&plan, Some(&simulation), projection(recv))?,
    };
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
