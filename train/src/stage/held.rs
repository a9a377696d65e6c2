//! The stages a rank holds: each one's position in the model cut and its layers (a
//! [`StageModel`], its tensors shared with the model's; on an expert rank, its mixtures' experts
//! those of the rank's shard), and which of them hand their output to
//! another rank (or to the loss), whose output stays live until freed.

use crate::cut::ModelCut;
use crate::error::TrainError;
use pipeweave_backends::StageError;
use pipeweave_core::{Problem, RankId, StageId};
use pipeweave_kernels::{ExpertPlacement, StageModel};
use std::collections::{BTreeMap, HashSet};

/// A stage of this rank: its position along the route and its layers.
#[derive(Debug, Clone)]
pub(crate) struct HeldStage {
    pub(crate) position: usize,
    pub(crate) model: StageModel,
}

/// A rank's stages.
pub(crate) struct HeldStages {
    rank: RankId,
    stages: BTreeMap<StageId, HeldStage>,
    /// Stages whose output leaves the rank (sent, or consumed by the loss): their output stays
    /// live until freed; a hand-over to a local next stage is not counted twice.
    outputs_leave: HashSet<StageId>,
}

impl HeldStages {
    /// The stages of `rank` of `problem`: the models of `cut`'s positions, in `models`, cloned
    /// (tensors are shared, not copied).
    pub(crate) fn new(
        rank: RankId,
        problem: &Problem,
        cut: &ModelCut,
        models: &[StageModel],
    ) -> Result<HeldStages, TrainError> {
        let mut stages = BTreeMap::new();
        for stage in problem.stages_of(rank) {
            let position = cut.position(stage).ok_or_else(|| {
                TrainError::invariant(format!("stage {stage} has no position in the model cut"))
            })?;
            let model = models
                .get(position)
                .ok_or_else(|| TrainError::invariant(format!("no model for position {position}")))?
                .clone();
            stages.insert(stage, HeldStage { position, model });
        }
        Ok(HeldStages {
            rank,
            stages,
            outputs_leave: outputs_leaving(rank, problem),
        })
    }

    /// Runs every stage's mixtures of experts as the expert rank of `placement` does: its
    /// experts only, their rows exchanged with its group.
    pub(crate) fn place_experts(&mut self, placement: &ExpertPlacement) -> Result<(), TrainError> {
        for (stage, held) in &mut self.stages {
            held.model =
                held.model
                    .clone()
                    .with_experts(placement)
                    .map_err(TrainError::kernel_config(format!(
                        "the experts of stage {stage}"
                    )))?;
        }
        Ok(())
    }

    /// The rank.
    pub(crate) fn rank(&self) -> RankId {
        self.rank
    }

    /// `stage`, which this rank must hold.
    pub(crate) fn get(&self, stage: StageId) -> Result<&HeldStage, StageError> {
        self.stages
            .get(&stage)
            .ok_or_else(|| StageError::bug(format!("rank {} holds no stage {stage}", self.rank)))
    }

    /// Whether `stage`'s output leaves the rank.
    pub(crate) fn output_leaves(&self, stage: StageId) -> bool {
        self.outputs_leave.contains(&stage)
    }
}

/// The stages of `rank` whose output leaves it on some route: the route ends there, or goes on
/// to a stage of another rank.
fn outputs_leaving(rank: RankId, problem: &Problem) -> HashSet<StageId> {
    problem
        .stages_of(rank)
        .into_iter()
        .filter(|&stage| {
            problem.routes().iter().any(|route| {
                route.contains(stage)
                    && route
                        .next(stage)
                        .is_none_or(|next| problem.rank_of(next) != Some(rank))
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cut::tests::v_on_two_ranks;

    #[test]
    fn outputs_leave_where_the_route_goes_to_another_rank_or_ends() {
        // The V on 2 ranks: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
        let problem = v_on_two_ranks();
        let leaving = |rank: u32| {
            let mut stages: Vec<u32> = outputs_leaving(RankId::new(rank), &problem)
                .into_iter()
                .map(StageId::get)
                .collect();
            stages.sort_unstable();
            stages
        };
        assert_eq!(leaving(0), [0, 3]);
        assert_eq!(leaving(1), [2]);
    }
}
