//! The order of the activation-residency instructions in rank programs (part of the
//! communication checker, [`crate::spmd::check`]): what `recompute` and `offload` plans project
//! to, checked on the programs themselves, whatever built them.
//!
//! Per rank program, per (stage, microbatch) pair, the pair's activations are in one state:
//! none yet; on the device after its forward; dropped (`Drop`, keeping the stage input) until its
//! recompute (`R`) puts them back; on the host after an `Offload` until its `Reload`. So:
//! - a `Drop` or an `Offload` follows the pair's forward on this rank, with the activations on
//!   the device and not reloaded or recomputed already (each happens once), except a second
//!   `Offload` after a reload (what the W keeps, moved out between the I and the W);
//! - an `R` finds the pair dropped, a `Reload` finds it offloaded;
//! - after the pair's input-gradient backward, a `Drop` of what its W keeps (the pair on the
//!   device) and then an `RW` that rebuilds it (the pair dropped) may run;
//! - the pair's input-gradient backward (an I, a B, or an overlapped F&B's backward) finds its
//!   activations on the device, and so does its weight-gradient backward (an offload between a
//!   split backward's I and W moves what the W needs; its reload, or the `RW` after a drop there,
//!   must come before the W);
//! - every residency instruction names a stage of the rank.

use crate::ir::ids::{RankId, StageId};
use crate::ir::op::{OpKind, Task};
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::program::{Instr, ProgramSet};
use std::fmt;

/// Where a pair's activations are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// No forward ran yet.
    NotYet,
    /// On the device, as the forward left them (`moved`: they were recomputed or reloaded).
    Device { moved: bool },
    /// Dropped, the stage input kept for the recompute.
    Dropped,
    /// On the host.
    Host,
}

/// What is wrong with a program's residency instructions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResidencyFault {
    /// The instruction names a stage another rank holds (or none).
    NotOnRank {
        /// The instruction, as written.
        instr: String,
        /// The stage.
        stage: StageId,
    },
    /// A drop, recompute, offload or reload finds the pair's activations elsewhere than it
    /// needs them.
    OutOfOrder {
        /// The instruction, as written.
        instr: String,
        /// Where the activations are.
        found: &'static str,
    },
    /// A backward runs while its pair's activations are dropped or on the host.
    BackwardWithout {
        /// The backward.
        task: Task,
        /// Where the activations are.
        found: &'static str,
    },
}

fn place(held: Held) -> &'static str {
    match held {
        Held::NotYet => "not computed yet",
        Held::Device { moved: false } => "on the device",
        Held::Device { moved: true } => "on the device again",
        Held::Dropped => "dropped for a recompute",
        Held::Host => "on the host",
    }
}

impl fmt::Display for ResidencyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResidencyFault::NotOnRank { instr, stage } => {
                write!(
                    f,
                    "{instr} names stage {stage}, which this rank does not hold"
                )
            }
            ResidencyFault::OutOfOrder { instr, found } => {
                write!(f, "{instr} finds the pair's activations {found}")
            }
            ResidencyFault::BackwardWithout { task, found } => write!(
                f,
                "{task} needs its forward's activations on the device, but they are {found}"
            ),
        }
    }
}

/// A fault with where it is: (rank, instruction index).
pub type Located = (RankId, usize, ResidencyFault);

/// Checks the residency instructions of every program (see the module doc). Programs without
/// any pass at once.
pub fn check_residency(problem: &Problem, set: &ProgramSet) -> Result<(), Located> {
    let uses = set.programs.iter().flat_map(|p| &p.instrs).any(|i| {
        matches!(
            i,
            Instr::Drop(_)
                | Instr::Offload(_)
                | Instr::Reload(_)
                | Instr::Compute(Task::Recompute(_) | Task::RecomputeWeightGrad(_))
        )
    });
    if !uses {
        return Ok(());
    }
    let slots = OpSlots::of(problem);
    let mut held = vec![Held::NotYet; slots.pairs()];
    // Per pair, whether its input-gradient backward ran (what is held after it is what the W
    // keeps).
    let mut backed = vec![false; slots.pairs()];
    for program in &set.programs {
        let rank = program.rank;
        for (i, instr) in program.instrs.iter().enumerate() {
            let fault = |f| (rank, i, f);
            let (work, to) = match instr {
                Instr::Drop(w) => (*w, Held::Dropped),
                Instr::Offload(w) => (*w, Held::Host),
                Instr::Reload(w)
                | Instr::Compute(Task::Recompute(w) | Task::RecomputeWeightGrad(w)) => {
                    (*w, Held::Device { moved: true })
                }
                Instr::Compute(task) => {
                    backward_finds_activations(&slots, &held, task).map_err(fault)?;
                    forward_leaves_activations(&slots, &mut held, task);
                    for pair in pairs_of(&slots, task, OpKind::InputGrad) {
                        backed[pair] = true;
                    }
                    continue;
                }
                _ => continue,
            };
            let on_rank = problem.rank_of(work.stage) == Some(rank);
            let pair = slots.pair(work.stage, work.microbatch).filter(|_| on_rank);
            let Some(pair) = pair else {
                return Err(fault(ResidencyFault::NotOnRank {
                    instr: instr.to_string(),
                    stage: work.stage,
                }));
            };
            let needed = match to {
                Held::Dropped | Held::Host => Held::Device { moved: false },
                _ if matches!(instr, Instr::Reload(_)) => Held::Host,
                _ => Held::Dropped,
            };
            // A second offload (what the W keeps, after the I) may follow a reload; after the
            // I, what the W keeps may be dropped wherever it is on the device.
            let again =
                matches!(instr, Instr::Offload(_)) && held[pair] == Held::Device { moved: true };
            let after_input = backed[pair]
                && matches!(instr, Instr::Drop(_))
                && matches!(held[pair], Held::Device { .. });
            // An R rebuilds a forward's activations (before the I), an RW what the W keeps
            // (after it).
            let misplaced = match instr {
                Instr::Compute(Task::Recompute(_)) => backed[pair],
                Instr::Compute(Task::RecomputeWeightGrad(_)) => !backed[pair],
                _ => false,
            };
            if (held[pair] != needed && !again && !after_input) || misplaced {
                let found = match (misplaced, backed[pair]) {
                    (true, true) => "past its input-gradient backward already",
                    (true, false) => "before its input-gradient backward",
                    (false, _) => place(held[pair]),
                };
                return Err(fault(ResidencyFault::OutOfOrder {
                    instr: instr.to_string(),
                    found,
                }));
            }
            held[pair] = to;
        }
    }
    Ok(())
}

/// The dense pair indices of `task`'s ops of `kind` (those in range).
fn pairs_of<'a>(slots: &'a OpSlots, task: &Task, kind: OpKind) -> impl Iterator<Item = usize> + 'a {
    task.ops()
        .into_iter()
        .filter(move |op| op.kind == kind)
        .filter_map(|op| slots.pair(op.stage, op.microbatch))
}

/// A backward in `task` needs its pair's activations on the device (a W: not on the host).
fn backward_finds_activations(
    slots: &OpSlots,
    held: &[Held],
    task: &Task,
) -> Result<(), ResidencyFault> {
    for pair in pairs_of(slots, task, OpKind::InputGrad) {
        if matches!(held[pair], Held::Dropped | Held::Host) {
            return Err(ResidencyFault::BackwardWithout {
                task: *task,
                found: place(held[pair]),
            });
        }
    }
    for pair in pairs_of(slots, task, OpKind::WeightGrad) {
        if matches!(held[pair], Held::Dropped | Held::Host) {
            return Err(ResidencyFault::BackwardWithout {
                task: *task,
                found: place(held[pair]),
            });
        }
    }
    Ok(())
}

/// A forward in `task` leaves its pair's activations on the device.
fn forward_leaves_activations(slots: &OpSlots, held: &mut [Held], task: &Task) {
    for pair in pairs_of(slots, task, OpKind::Forward) {
        held[pair] = Held::Device { moved: false };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::op::Work;
    use crate::spmd::project::{project, ProjectionOptions};
    use crate::testing::plan;

    fn projected(orders: &[&str]) -> (Problem, ProgramSet) {
        let plan = plan(2, orders);
        let set = project(&plan, ProjectionOptions::default()).unwrap();
        (plan.problem().clone(), set)
    }

    /// `set` with the first reload of `rank`'s program moved to its end.
    fn first_reload_last(set: &ProgramSet, rank: usize) -> ProgramSet {
        let mut broken = set.clone();
        let instrs = &mut broken.programs[rank].instrs;
        let reload = instrs
            .iter()
            .position(|i| matches!(i, Instr::Reload(_)))
            .expect("the fixture reloads on that rank");
        let moved = instrs.remove(reload);
        instrs.push(moved);
        broken
    }

    #[test]
    fn what_a_w_keeps_may_leave_between_its_halves_but_must_be_back_for_it() {
        let (problem, set) = projected(&[
            "0F0 0OFFLOAD0 0F1 0RELOAD0 0I0 0OFFLOAD0 0I1 0RELOAD0 0W0 0W1",
            "1F0 1I0 1F1 1I1 1OFFLOAD1 1W0 1RELOAD1 1W1",
        ]);
        check_residency(&problem, &set).unwrap();
        // The second reload moved behind the W it is for.
        let broken = first_reload_last(&set, 1);
        let (rank, _, fault) = check_residency(&problem, &broken).unwrap_err();
        assert_eq!(rank, RankId::new(1));
        assert_eq!(
            fault.to_string(),
            "1W1 needs its forward's activations on the device, but they are on the host"
        );
    }

    #[test]
    fn what_a_w_keeps_is_dropped_after_its_i_and_rebuilt_before_it() {
        let (problem, set) =
            projected(&["0F0 0F1 0I0 0I1 0RW0 0W0 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"]);
        check_residency(&problem, &set).unwrap();
        let text: Vec<String> = set.programs[0]
            .instrs
            .iter()
            .map(Instr::to_string)
            .collect();
        let at = |s: &str| text.iter().position(|i| i == s).unwrap();
        assert!(at("0I0") < at("drop(stage 0, mb 0)"), "{text:?}");
        assert!(at("drop(stage 0, mb 0)") < at("0RW0"), "{text:?}");
        assert!(at("0RW0") < at("0W0"), "{text:?}");

        // The RW moved in front of the I.
        let mut broken = set.clone();
        let instrs = &mut broken.programs[0].instrs;
        let rw = instrs.remove(at("0RW0"));
        instrs.insert(at("0I0"), rw);
        let (_, _, fault) = check_residency(&problem, &broken).unwrap_err();
        assert_eq!(
            fault.to_string(),
            "0RW0 finds the pair's activations before its input-gradient backward"
        );

        // The RW left out: the W finds its state dropped.
        let mut broken = set;
        broken.programs[0]
            .instrs
            .retain(|i| !matches!(i, Instr::Compute(Task::RecomputeWeightGrad(_))));
        let (_, _, fault) = check_residency(&problem, &broken).unwrap_err();
        assert_eq!(
            fault.to_string(),
            "0W0 needs its forward's activations on the device, but they are dropped for a recompute"
        );
    }

    #[test]
    fn projected_residency_passes_and_broken_orders_are_named() {
        let (problem, set) =
            projected(&["0F0 0OFFLOAD0 0F1 0RELOAD0 0B0 0B1", "1F0 1B0 1F1 1R1 1B1"]);
        check_residency(&problem, &set).unwrap();
        let text: Vec<String> = set.programs[1]
            .instrs
            .iter()
            .map(Instr::to_string)
            .collect();
        let at = |s: &str| text.iter().position(|i| i == s).unwrap();
        assert_eq!(at("drop(stage 1, mb 1)"), at("1F1") + 2, "{text:?}");
        assert!(at("1R1") < at("1B1"));
        let text0: Vec<String> = set.programs[0]
            .instrs
            .iter()
            .map(Instr::to_string)
            .collect();
        assert!(
            text0.contains(&"offload(stage 0, mb 0)".to_string()),
            "{text0:?}"
        );

        // The reload moved behind the backward.
        let broken = first_reload_last(&set, 0);
        let (rank, _, fault) = check_residency(&problem, &broken).unwrap_err();
        assert_eq!(rank, RankId::new(0));
        assert_eq!(
            fault.to_string(),
            "0B0 needs its forward's activations on the device, but they are on the host"
        );

        // A recompute without its drop.
        let mut broken = set.clone();
        broken.programs[1]
            .instrs
            .retain(|i| !matches!(i, Instr::Drop(_)));
        let (_, _, fault) = check_residency(&problem, &broken).unwrap_err();
        assert_eq!(
            fault.to_string(),
            "1R1 finds the pair's activations on the device"
        );

        // A drop of a stage of another rank.
        let mut broken = set;
        broken.programs[0]
            .instrs
            .insert(0, Instr::Drop(Work::new(1, 0)));
        let (_, at, fault) = check_residency(&problem, &broken).unwrap_err();
        assert_eq!(at, 0);
        assert!(
            fault.to_string().contains("which this rank does not hold"),
            "{fault}"
        );
    }
}
