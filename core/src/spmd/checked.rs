//! [`CheckedPrograms`]: a program set the communication checker accepted for its problem. The
//! backends run nothing else, so no backend checks again: a value of this type is the proof.
//! [`CheckedPrograms::of_plan`] is the one home of "project a plan, then check its programs",
//! which the compile entry (the CLI, Python) and the trainers (threads, MPI) share.
//! [`CheckedRank`] is one rank's program of such a set, borrowed from it: what the backends'
//! interpreter runs, so a plain [`RankProgram`] never reaches it.

use crate::analysis::simulate::Simulation;
use crate::analysis::verify::Violations;
use crate::ir::ids::RankId;
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use crate::spmd::check::{check_programs, CheckReport, CommError};
use crate::spmd::program::{ProgramSet, RankProgram};
use crate::spmd::project::{project, project_simulated, ProjectionOptions};

/// Why a plan has no checked programs: the projection found it invalid, or the checker refused
/// what the projection made (a bug of the projection, reported as the checker saw it).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProgramsRefused {
    /// The plan does not verify, so it cannot be projected.
    #[error("the plan cannot be projected: {0}")]
    Projection(#[source] Violations),
    /// The projected programs fail the communication check.
    #[error("communication check failed: {0}")]
    Communication(#[source] CommError),
}

/// Programs checked for a problem ([`check_programs`]); fields private, so the only way to get
/// one is [`CheckedPrograms::check`].
#[derive(Clone, Debug)]
pub struct CheckedPrograms {
    problem: Problem,
    programs: ProgramSet,
    report: CheckReport,
}

impl CheckedPrograms {
    /// Checks `programs` against `problem` (every check of [`crate::spmd::check`]).
    pub fn check(problem: &Problem, programs: ProgramSet) -> Result<CheckedPrograms, CommError> {
        let report = check_programs(problem, &programs)?;
        Ok(CheckedPrograms {
            problem: problem.clone(),
            programs,
            report,
        })
    }

    /// [`CheckedPrograms::check`] on a thread of its own while `beside` runs on this one with
    /// the programs being checked (a caller renders files from them meanwhile and publishes
    /// nothing until the check passed): the check's result and what `beside` gave.
    pub fn check_beside<T>(
        problem: &Problem,
        programs: ProgramSet,
        beside: impl FnOnce(&ProgramSet) -> T,
    ) -> (Result<CheckedPrograms, CommError>, T) {
        let (report, given) = std::thread::scope(|scope| {
            let check = scope.spawn(|| check_programs(problem, &programs));
            let given = beside(&programs);
            let report = check
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (report, given)
        });
        let checked = report.map(|report| CheckedPrograms {
            problem: problem.clone(),
            programs,
            report,
        });
        (checked, given)
    }

    /// `plan` projected with `options` (along `simulation`'s timeline where it is the plan's
    /// simulation, else replayed) and its programs checked.
    pub fn of_plan(
        plan: &Plan,
        simulation: Option<&Simulation>,
        options: ProjectionOptions,
    ) -> Result<CheckedPrograms, ProgramsRefused> {
        let programs = match simulation {
            Some(simulation) => project_simulated(plan, simulation, options),
            None => project(plan, options),
        }
        .map_err(ProgramsRefused::Projection)?;
        CheckedPrograms::check(plan.problem(), programs).map_err(ProgramsRefused::Communication)
    }

    /// The problem the programs were checked for.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }

    /// The programs.
    pub fn programs(&self) -> &ProgramSet {
        &self.programs
    }

    /// What the check counted.
    pub fn report(&self) -> &CheckReport {
        &self.report
    }

    /// The checked program of `rank`, with the problem (None when the set has none for it).
    pub fn rank(&self, rank: RankId) -> Option<CheckedRank<'_>> {
        self.ranks().find(|r| r.rank() == rank)
    }

    /// Every rank's checked program, in the set's (rank) order.
    pub fn ranks(&self) -> impl ExactSizeIterator<Item = CheckedRank<'_>> + '_ {
        self.programs.programs.iter().map(|program| CheckedRank {
            problem: &self.problem,
            program,
        })
    }
}

/// One rank's program of a [`CheckedPrograms`], with the problem it was checked for. Its fields
/// are private and it is made only by [`CheckedPrograms::rank`] and [`CheckedPrograms::ranks`], so
/// holding one proves the program passed the checker as part of its whole set.
#[derive(Clone, Copy, Debug)]
pub struct CheckedRank<'a> {
    problem: &'a Problem,
    program: &'a RankProgram,
}

impl<'a> CheckedRank<'a> {
    /// The rank.
    pub fn rank(&self) -> RankId {
        self.program.rank
    }

    /// The problem the set was checked for.
    pub fn problem(&self) -> &'a Problem {
        self.problem
    }

    /// The rank's program.
    pub fn program(&self) -> &'a RankProgram {
        self.program
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spmd::project::{project, ProjectionOptions};

    #[test]
    fn only_programs_that_pass_the_checker_are_checked() {
        let plan = crate::testing::plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
        let set = project(&plan, ProjectionOptions::default()).unwrap();
        let checked = CheckedPrograms::check(plan.problem(), set.clone()).unwrap();
        assert_eq!(checked.programs(), &set);
        assert_eq!(checked.report().messages, 4);
        let mut broken = set;
        broken.programs[1].instrs.remove(0);
        assert!(CheckedPrograms::check(plan.problem(), broken).is_err());
        let of_plan = CheckedPrograms::of_plan(&plan, None, ProjectionOptions::default()).unwrap();
        assert_eq!(of_plan.programs(), checked.programs());
        let simulation = crate::simulate(&plan).unwrap();
        let along = CheckedPrograms::of_plan(&plan, Some(&simulation), Default::default()).unwrap();
        assert_eq!(along.report(), checked.report());
        let ranks: Vec<_> = checked.ranks().collect();
        assert_eq!(ranks.len(), 2);
        for (r, program) in ranks.iter().zip(&checked.programs().programs) {
            assert_eq!(r.program(), program);
            assert_eq!(r.problem(), checked.problem());
        }
        let one = checked.rank(RankId::new(1)).unwrap();
        assert_eq!(one.rank(), RankId::new(1));
        assert!(checked.rank(RankId::new(2)).is_none());
    }

    #[test]
    fn a_check_beside_other_work_gives_the_same_proof_and_the_work_sees_the_programs() {
        let plan = crate::testing::plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
        let set = project(&plan, ProjectionOptions::default()).unwrap();
        let (checked, ranks) =
            CheckedPrograms::check_beside(plan.problem(), set.clone(), |p| p.programs.len());
        assert_eq!(ranks, 2);
        let alone = CheckedPrograms::check(plan.problem(), set.clone()).unwrap();
        assert_eq!(checked.unwrap().report(), alone.report());
        let mut broken = set;
        broken.programs[1].instrs.remove(0);
        let (refused, ()) = CheckedPrograms::check_beside(plan.problem(), broken, |_| ());
        assert!(refused.is_err());
    }
}
