//! The per-rank activation-memory replay: how much each rank holds at its peak.
//!
//! Independent of timing: memory depends only on the order of a rank's own ops (F adds `total`,
//! I frees `total - weight_grad`, W frees `weight_grad`; see [`crate::ir::memory`]).

use crate::ir::ids::RankId;
use crate::ir::op::Op;
use crate::ir::plan::Plan;
use std::ops::ControlFlow;

/// Peak held activation memory of one rank and the op at which it is first reached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankPeak {
    /// The rank.
    pub rank: RankId,
    /// Peak memory, in units of one microbatch of the rank's share.
    pub peak: f64,
    /// The op after which the peak is first reached (None for a rank that runs nothing).
    pub at: Option<Op>,
}

/// Replays each rank's order and returns its activation-memory peak. Independent of timing: memory
/// only depends on the order of a rank's own ops. Ops whose stage is out of range are skipped (the
/// verifier reports them).
pub fn peak_per_rank(plan: &Plan) -> Vec<RankPeak> {
    let figures = plan.memory().stages();
    plan.orders()
        .iter()
        .enumerate()
        .map(|(r, order)| {
            let mut held = 0.0f64;
            let mut best = RankPeak {
                rank: RankId::new(r as u32),
                peak: 0.0,
                at: None,
            };
            for task in order {
                let _ = task.try_for_each_op(|op| {
                    if let Some(m) = figures.get(op.stage.index()) {
                        held += m.delta(op.kind);
                    }
                    if held > best.peak + 1e-12 {
                        best.peak = held;
                        best.at = Some(op);
                    }
                    ControlFlow::<()>::Continue(())
                });
            }
            best
        })
        .collect()
}

/// The largest peak over all ranks.
pub fn max_peak(plan: &Plan) -> f64 {
    peak_per_rank(plan)
        .iter()
        .map(|p| p.peak)
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::cost::{CostModel, StageCosts};
    use crate::ir::memory::{MemoryModel, StageMemorySpec};
    use crate::ir::op::Task;
    use crate::ir::problem::ProblemSpec;

    #[test]
    fn peaks_follow_each_ranks_order() {
        let problem = ProblemSpec::builder()
            .ranks(1)
            .microbatches(2)
            .build()
            .validate()
            .unwrap();
        let memory = StageMemorySpec::builder()
            .total(1.0)
            .weight_grad(0.25)
            .build()
            .validate()
            .unwrap();
        let order: Vec<Task> = ["0F0", "0F1", "0I0", "0W0", "0I1", "0W1"]
            .iter()
            .map(|t| t.parse().unwrap())
            .collect();
        let plan = Plan::new(
            problem,
            CostModel::uniform(1, StageCosts::default(), 0.0).unwrap(),
            MemoryModel::uniform(1, memory),
            vec![order],
        )
        .unwrap();
        let peaks = peak_per_rank(&plan);
        assert_eq!(peaks[0].peak, 2.0);
        assert_eq!(peaks[0].at.unwrap().to_string(), "0F1");
        assert_eq!(max_peak(&plan), 2.0);
    }
}
