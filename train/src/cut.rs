//! How a GPT is cut into a plan's stages, from the plan's own problem.
//!
//! Every route of the problem passes the same number `S` of stages; a stage's *position* is its
//! index along its route. The model is its list of layers ([`model_layers`]): those placed first
//! (the embedding) go to position 0, those placed last (the head, with the loss) to position
//! `S - 1`, and the `L` free layers between them (the transformer blocks) are spread over the
//! positions in order. By default position `k` holds free layers `⌊k L / S⌋ .. ⌊(k + 1) L / S⌋`
//! (a layer count need not divide the positions, and a position may then hold no block);
//! `--layers-per-stage a,b,...` ([`ModelCut::with_layers`]) gives each position's block count
//! instead, for stages as uneven as the embedding and the head make them; where ranks hold
//! several positions (interleaved and V plans), one count per rank (a rank's share, as
//! `pipeweave plan/tune --layers-per-stage` count) is spread over the positions the rank holds.
//! Stages at the same position of different routes (DualPipe's mirrored replicas, the problem's
//! tied stages) hold the same layers and one set of weights: their gradients are summed every
//! step. The cut names no layer kind: it reads each layer's placement.

use crate::error::TrainError;
use pipeweave_core::{cut_violation, even_cut, spread_shares, PinnedEnds, Problem, StageId};
use pipeweave_kernels::{model_layers, GptConfig, LayerId, Placement, StageLayout};

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
    /// spread over its positions. The counts must be one per position and sum to the model's
    /// blocks, and a position between the first and the last must hold at least one (it would
    /// hold nothing at all), else [`TrainError::Cut`].
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
        let model = ModelLayers::of(config);
        let starts = model.free_starts(positions, layers)?;
        let layouts = (0..positions)
            .map(|k| {
                StageLayout::new(config, model.span(&starts, k)).map_err(TrainError::kernel_config(
                    format!("the layout of position {k}"),
                ))
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

    /// The free layers (blocks) of every position, in order.
    pub fn layers_per_position(&self) -> Vec<usize> {
        self.layouts.iter().map(StageLayout::free_layers).collect()
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

/// The model's layers as a cut sees them: how many are pinned to the first position, how many
/// are free, how many are pinned to the last, and what the pinned ones are called in messages.
struct ModelLayers {
    first: usize,
    free: usize,
    total: usize,
    pinned: PinnedEnds,
}

impl ModelLayers {
    fn of(config: &GptConfig) -> ModelLayers {
        let layers = model_layers(config);
        let placed = |placement: Placement| -> Vec<LayerId> {
            let ids = layers.iter().copied();
            ids.filter(|id| id.placement() == placement).collect()
        };
        let (first, last) = (placed(Placement::First), placed(Placement::Last));
        ModelLayers {
            first: first.len(),
            free: layers.len() - first.len() - last.len(),
            total: layers.len(),
            pinned: PinnedEnds::new(named(&first).as_deref(), named(&last).as_deref()),
        }
    }

    /// Where each position's free layers start (counted among the free layers), with the end
    /// last (`positions + 1` entries).
    fn free_starts(
        &self,
        positions: usize,
        layers: Option<&[usize]>,
    ) -> Result<Vec<usize>, TrainError> {
        let even;
        let counts = match layers {
            Some(counts) => counts,
            None => {
                even = even_cut(self.free, positions, &self.pinned);
                &even
            }
        };
        if counts.len() != positions {
            let shown: Vec<String> = counts.iter().map(usize::to_string).collect();
            let ends: String = [(&self.pinned.first, "first"), (&self.pinned.last, "last")]
                .into_iter()
                .filter_map(|(name, end)| {
                    name.as_ref().map(|name| format!(", {name} on the {end}"))
                })
                .collect();
            return Err(TrainError::Cut {
                reason: format!(
                    "--layers-per-stage {} gives {} counts; the plan's routes pass {positions} \
                     stages (one count per stage{ends})",
                    shown.join(","),
                    counts.len()
                ),
            });
        }
        if layers.is_some() {
            if let Some(reason) = cut_violation(counts, self.free, &self.pinned) {
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

    /// The model's layers at position `k` of `starts.len() - 1`: its free ones, the pinned
    /// first ones on the first position and the pinned last ones on the last.
    fn span(&self, starts: &[usize], k: usize) -> std::ops::Range<usize> {
        let start = match k {
            0 => 0,
            _ => self.first + starts[k],
        };
        let end = match k + 2 == starts.len() {
            true => self.total,
            false => self.first + starts[k + 1],
        };
        start..end
    }
}

/// How a message names pinned layers: `the embedding`, `the embedding and the norm`; `None`
/// where there are none.
fn named(pinned: &[LayerId]) -> Option<String> {
    let names: Vec<String> = pinned
        .iter()
        .map(|id| format!("the {}", id.label()))
        .collect();
    (!names.is_empty()).then(|| names.join(" and "))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pipeweave_core::testing::problem as plain;
    use pipeweave_core::ProblemSpec;
    use pipeweave_kernels::LayerInput;

    /// The plain problem of `ranks` ranks (stage `r` on rank `r`), two microbatches.
    fn problem(ranks: u32) -> Problem {
        plain(ranks, 2)
    }

    /// The V layout on 2 ranks, 4 microbatches: rank 0 holds stages 0 and 3, rank 1 stages 1
    /// and 2.
    pub(crate) fn v_on_two_ranks() -> Problem {
        let v = ProblemSpec::builder().ranks(2).microbatches(4);
        v.stage_to_rank(vec![0, 1, 1, 0])
            .build()
            .validate()
            .unwrap()
    }

    /// The free layers (blocks) of every position of `cut`, as global block indices.
    fn blocks(cut: &ModelCut) -> Vec<std::ops::Range<usize>> {
        let mut start = 0;
        let counts = cut.layers_per_position().into_iter();
        counts
            .map(|count| {
                let blocks = start..start + count;
                start += count;
                blocks
            })
            .collect()
    }

    #[test]
    fn blocks_spread_over_positions_unevenly_when_needed() {
        let config = GptConfig::new(5, 16, 2, 8).unwrap();
        let cut = ModelCut::new(&config, &problem(3)).unwrap();
        assert_eq!(blocks(&cut), [0..1, 1..3, 3..5]);
        // The model's layers: the embedding, five blocks, the head.
        let spans: Vec<_> = (0..3).map(|k| cut.layout(k).unwrap().span()).collect();
        assert_eq!(spans, [0..2, 2..4, 4..7]);
        let first = cut.layout(0).unwrap();
        assert!(first.input() == LayerInput::TokenIds && !first.ends_model());
        assert!(cut.layout(2).unwrap().ends_model());
    }

    #[test]
    fn given_counts_place_the_blocks() {
        let config = GptConfig::new(6, 16, 2, 8).unwrap();
        let cut = ModelCut::with_layers(&config, &problem(3), Some(&[1, 3, 2])).unwrap();
        assert_eq!(blocks(&cut), [0..1, 1..4, 4..6]);
        assert_eq!(cut.layers_per_position(), [1, 3, 2]);
        // The first and the last may hold no block: they hold the embedding and the head.
        let ends = ModelCut::with_layers(&config, &problem(3), Some(&[0, 6, 0])).unwrap();
        assert_eq!(ends.layers_per_position(), [0, 6, 0]);
        assert_eq!(ends.layout(0).unwrap().span(), 0..1);
    }

    #[test]
    fn one_count_per_rank_spreads_over_its_positions() {
        // The V layout on 2 ranks: rank 0 holds positions 0 and 3, rank 1 positions 1 and 2.
        let config = GptConfig::new(5, 16, 2, 8).unwrap();
        let cut = ModelCut::with_layers(&config, &v_on_two_ranks(), Some(&[3, 2])).unwrap();
        assert_eq!(cut.layers_per_position(), [2, 1, 1, 1]);
    }

    #[test]
    fn bad_counts_are_cut_errors_naming_the_rule() {
        let config = GptConfig::new(6, 16, 2, 8).unwrap();
        let cases: [(&[usize], &str); 4] = [
            (&[3, 3], "gives 2 counts; the plan's routes pass 3 stages"),
            (
                &[3, 3],
                "(one count per stage, the embedding on the first, the head on the last)",
            ),
            (&[1, 2, 2], "sums to 5; the model has 6 blocks"),
            (
                &[3, 0, 3],
                "leaves stage 1 empty (only the first holds the embedding",
            ),
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
        let cut = ModelCut::new(&config, &problem(4)).unwrap();
        assert_eq!(cut.layers_per_position(), [0, 0, 0, 1]);
    }
}
