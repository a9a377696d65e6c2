//! How a GPT is cut into a plan's stages, from the plan's own problem.
//!
//! Every route of the problem passes the same number `S` of stages; a stage's *position* is its
//! index along its route. Position 0 holds the embedding, position `S - 1` the head with the loss,
//! and the `L` transformer blocks are spread over the positions in order. By default position `k`
//! holds blocks `⌊k L / S⌋ .. ⌊(k + 1) L / S⌋` (a layer count need not divide the positions, and a
//! position may then hold no block); `--layers-per-stage a,b,...` ([`ModelCut::with_layers`])
//! gives each position's block count instead, for stages as uneven as the embedding and the head
//! make them; where ranks hold several positions (interleaved and V plans), one count per rank
//! (a rank's share, as `pipeweave plan/tune --layers-per-stage` count) is spread over the
//! positions the rank holds. Stages at the same position of different routes (DualPipe's mirrored replicas, the
//! problem's tied stages) hold the same layers and one set of weights: their gradients are summed
//! every step.

use crate::error::TrainError;
use pipeweave_core::{cut_violation, even_blocks, spread_shares, PinnedEnds, Problem, StageId};
use pipeweave_kernels::{GptConfig, StageLayout};

/// The layers of every position and the position of every stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelCut {
    layouts: Vec<StageLayout>,
    position_of: Vec<usize>,
}

impl ModelCut {
    /// Cuts `config` into the stages of `problem`, the blocks as even as their count allows.
    pub fn new(config: &GptConfig, problem: &Problem) -> Result<ModelCut, TrainError> {
        ModelCut::with_layers(config, problem, None)
    }

    /// Cuts `config` into the stages of `problem`, position `k` holding `layers[k]` blocks (in
    /// order; the embedding on position 0, the head on the last), or evenly for `None`; with
    /// one count per rank on a plan whose ranks hold several positions, each rank's count
    /// spread over its positions. The
    /// counts must be one per position and sum to the model's blocks, and a position between
    /// the first and the last must hold at least one (it would hold nothing at all), else
    /// [`TrainError::Cut`].
    pub fn with_layers(
        config: &GptConfig,
        problem: &Problem,
        layers: Option<&[usize]>,
    ) -> Result<ModelCut, TrainError> {
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
        // One count per rank (a share, as `pipeweave plan/tune --layers-per-stage` count) where
        // the ranks hold several positions: each share spread over its rank's positions.
        let spread;
        let layers = match layers {
            Some(counts)
                if counts.len() == problem.ranks() as usize && counts.len() != positions =>
            {
                spread = spread_over_positions(problem, counts)?;
                Some(spread.as_slice())
            }
            other => other,
        };
        let starts = block_starts(config.n_layer(), positions, layers)?;
        let layouts = starts
            .windows(2)
            .enumerate()
            .map(|(k, w)| {
                StageLayout::new(config, k == 0, w[0]..w[1], k + 1 == positions).map_err(
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

    /// The blocks of every position, in order.
    pub fn layers_per_position(&self) -> Vec<usize> {
        self.layouts.iter().map(|l| l.blocks().len()).collect()
    }
}

/// Position counts from one count per rank: rank `r`'s `shares[r]` blocks spread over the
/// positions it holds along the first route ([`spread_shares`]).
fn spread_over_positions(problem: &Problem, shares: &[usize]) -> Result<Vec<usize>, TrainError> {
    let route = problem.routes().first().ok_or_else(|| TrainError::Cut {
        reason: "the plan has no route".to_string(),
    })?;
    let owners: Vec<usize> = route
        .stages()
        .iter()
        .map(|&s| problem.rank_of(s).map_or(usize::MAX, |r| r.index()))
        .collect();
    Ok(spread_shares(&owners, shares))
}

/// Where each position's blocks start, with the end last (`positions + 1` entries).
fn block_starts(
    blocks: usize,
    positions: usize,
    layers: Option<&[usize]>,
) -> Result<Vec<usize>, TrainError> {
    let even;
    let counts = match layers {
        Some(counts) => counts,
        None => {
            even = even_blocks(blocks, positions);
            &even
        }
    };
    if counts.len() != positions {
        let shown: Vec<String> = counts.iter().map(usize::to_string).collect();
        return Err(TrainError::Cut {
            reason: format!(
                "--layers-per-stage {} gives {} counts; the plan's routes pass {positions} \
                 stages (one count per stage, the embedding on the first, the head on the last)",
                shown.join(","),
                counts.len()
            ),
        });
    }
    if layers.is_some() {
        let pinned = PinnedEnds::new(Some("the embedding"), Some("the head"));
        if let Some(reason) = cut_violation(counts, blocks, &pinned) {
            return Err(TrainError::Cut { reason });
        }
    }
    let mut starts = Vec::with_capacity(positions + 1);
    let mut at = 0;
    starts.push(at);
    for c in counts {
        at += c;
        starts.push(at);
    }
    Ok(starts)
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

    fn problem(ranks: u32) -> Problem {
        ProblemSpec::builder()
            .ranks(ranks)
            .microbatches(2)
            .build()
            .validate()
            .unwrap()
    }

    #[test]
    fn given_counts_place_the_blocks() {
        let config = GptConfig::new(6, 16, 2, 8).unwrap();
        let cut = ModelCut::with_layers(&config, &problem(3), Some(&[1, 3, 2])).unwrap();
        let blocks: Vec<_> = (0..3).map(|k| cut.layout(k).unwrap().blocks()).collect();
        assert_eq!(blocks, [0..1, 1..4, 4..6]);
        assert_eq!(cut.layers_per_position(), [1, 3, 2]);
        // The first and the last may hold no block: they hold the embedding and the head.
        let ends = ModelCut::with_layers(&config, &problem(3), Some(&[0, 6, 0])).unwrap();
        assert_eq!(ends.layers_per_position(), [0, 6, 0]);
    }

    #[test]
    fn one_count_per_rank_spreads_over_its_positions() {
        // The V layout on 2 ranks: rank 0 holds positions 0 and 3, rank 1 positions 1 and 2.
        let config = GptConfig::new(5, 16, 2, 8).unwrap();
        let problem = ProblemSpec::builder()
            .ranks(2)
            .microbatches(4)
            .stage_to_rank(vec![0, 1, 1, 0])
            .build()
            .validate()
            .unwrap();
        let cut = ModelCut::with_layers(&config, &problem, Some(&[3, 2])).unwrap();
        assert_eq!(cut.layers_per_position(), [2, 1, 1, 1]);
    }

    #[test]
    fn bad_counts_are_cut_errors_naming_the_rule() {
        let config = GptConfig::new(6, 16, 2, 8).unwrap();
        let cases: [(&[usize], &str); 3] = [
            (&[3, 3], "gives 2 counts; the plan's routes pass 3 stages"),
            (&[1, 2, 2], "sums to 5; the model has 6 blocks"),
            (&[3, 0, 3], "leaves stage 1 empty"),
        ];
        for (counts, expected) in cases {
            let err = ModelCut::with_layers(&config, &problem(3), Some(counts)).unwrap_err();
            assert!(matches!(err, TrainError::Cut { .. }), "{err:?}");
            assert!(err.to_string().contains(expected), "{err}");
            assert!(err.is_bad_input(), "{err}");
        }
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
