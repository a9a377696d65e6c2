//! [`CheckedPrograms`]: a program set the communication checker accepted for its problem. The
//! backends run nothing else, so no backend checks again: a value of this type is the proof.

use crate::ir::problem::Problem;
use crate::spmd::check::{check_programs, CheckReport, CommError};
use crate::spmd::program::ProgramSet;

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
    }
}
