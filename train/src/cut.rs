//! How a GPT is cut into a plan's stages, from the plan's own problem.
//!
//! Every route of the problem passes the same number `S` of stages; a stage's *position* is its
//! index along its route. Position 0 holds the embedding, position `S - 1` the head with the loss,
//! and the `L` transformer blocks are spread over the positions in order, position `k` holding
//! blocks `⌊k L / S⌋ .. ⌊(k + 1) L / S⌋` (uneven cuts are fine: a layer count need not divide the
//! positions, and a position may hold no block). Stages at the same position of different routes
//! (DualPipe's mirrored replicas, the problem's tied stages) hold the same layers and one set of
//! weights: their gradients are summed every step.

use crate::error::TrainError;
use pipeweave_core::{Problem, StageId};
use pipeweave_kernels::{GptConfig, StageLayout};

/// The layers of every position and the position of every stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelCut {
    layouts: Vec<StageLayout>,
    position_of: Vec<usize>,
}

impl ModelCut {
    /// Cuts `config` into the stages of `problem`.
    pub fn new(config: &GptConfig, problem: &Problem) -> Result<ModelCut, TrainError> {
        let routes = problem.routes();
        let positions = routes.first().map_or(0, |r| r.stages().len());
        if let Some(other) = routes.iter().find(|r| r.stages().len() != positions) {
            return Err(TrainError::Cut {
                reason: format!(
                    "every route must pass the same number of stages to cut one model into them; \
                     routes pass {positions} and {} stages",
                    other.stages().len()
                ),
            });
        }
        let mut position_of = vec![usize::MAX; problem.stages() as usize];
        for route in routes {
            for (k, stage) in route.stages().iter().enumerate() {
                let slot = &mut position_of[stage.index()];
                if *slot != usize::MAX && *slot != k {
                    return Err(TrainError::Cut {
                        reason: format!(
                            "stage {stage} is at position {} on one route and {k} on another",
                            *slot
                        ),
                    });
                }
                *slot = k;
            }
        }
        let layers = config.n_layer();
        let layouts = (0..positions)
            .map(|k| {
                let blocks = k * layers / positions..(k + 1) * layers / positions;
                StageLayout::new(config, k == 0, blocks, k + 1 == positions).map_err(
                    TrainError::kernel_config(format!("the layout of position {k}")),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ModelCut {
            layouts,
            position_of,
        })
    }

    /// Number of positions along a route.
    pub fn positions(&self) -> usize {
        self.layouts.len()
    }

    /// The position of `stage` along its route.
    pub fn position(&self, stage: StageId) -> Option<usize> {
        self.position_of.get(stage.index()).copied()
    }

    /// What position `k` holds.
    pub fn layout(&self, position: usize) -> Option<&StageLayout> {
        self.layouts.get(position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::ProblemSpec;

    #[test]
    fn blocks_spread_over_positions_unevenly_when_needed() {
        let config = GptConfig::new(5, 16, 2, 8).unwrap();
        let problem = ProblemSpec::builder()
            .ranks(3)
            .microbatches(2)
            .build()
            .validate()
            .unwrap();
        let cut = ModelCut::new(&config, &problem).unwrap();
        let blocks: Vec<_> = (0..3).map(|k| cut.layout(k).unwrap().blocks()).collect();
        assert_eq!(blocks, [0..1, 1..3, 3..5]);
        assert!(cut.layout(0).unwrap().has_embedding() && !cut.layout(0).unwrap().has_head());
        assert!(cut.layout(2).unwrap().has_head());
    }

    #[test]
    fn mirrored_stages_share_a_position() {
        let config = GptConfig::new(2, 16, 2, 8).unwrap();
        let problem = ProblemSpec::dualpipe(2, 4).validate().unwrap();
        let cut = ModelCut::new(&config, &problem).unwrap();
        assert_eq!(cut.positions(), 2);
        assert_eq!(cut.position(StageId::new(2)), Some(0));
        assert_eq!(cut.position(StageId::new(3)), Some(1));
    }

    #[test]
    fn more_positions_than_blocks_leave_some_without_blocks() {
        let config = GptConfig::new(1, 16, 2, 8).unwrap();
        let problem = ProblemSpec::builder()
            .ranks(4)
            .microbatches(1)
            .build()
            .validate()
            .unwrap();
        let cut = ModelCut::new(&config, &problem).unwrap();
        let counts: Vec<usize> = (0..4)
            .map(|k| cut.layout(k).unwrap().blocks().len())
            .collect();
        assert_eq!(counts, [0, 0, 0, 1]);
    }
}
