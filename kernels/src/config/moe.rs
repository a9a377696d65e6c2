//! [`MoeConfig`], the shape of a mixture-of-experts feed-forward sub-layer, and [`ExpertShard`],
//! which experts one expert-parallel rank holds: both validated on construction, so that a
//! [`crate::layers::Moe`] and its phases never meet an impossible setting.

use std::ops::Range;

use crate::error::{require, KernelError, Result};

/// The shape of a mixture of experts: `experts` expert MLPs of hidden width `hidden`, each token
/// routed to `top_k` of them, and the load-balancing loss scaled by `aux_coefficient`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    experts: usize,
    top_k: usize,
    hidden: usize,
    aux_coefficient: f64,
}

impl MoeConfig {
    /// A mixture of `experts` experts (at least one) of hidden width `hidden` (positive), each
    /// token going to `top_k` of them (`1..=experts`), with the load-balancing loss scaled by
    /// `aux_coefficient` (finite, non-negative; 0 turns the loss off).
    pub fn new(experts: usize, top_k: usize, hidden: usize, aux_coefficient: f64) -> Result<Self> {
        at_least_one_expert(experts)?;
        require(
            top_k > 0,
            "top_k",
            top_k,
            "each token must go to at least one expert",
        )?;
        if top_k > experts {
            return Err(KernelError::TopKAboveExperts { top_k, experts });
        }
        require(hidden > 0, "hidden", hidden, "must be positive")?;
        let aux_valid = aux_coefficient.is_finite() && aux_coefficient >= 0.0;
        require(
            aux_valid,
            "aux_coefficient",
            aux_coefficient,
            "must be finite and non-negative",
        )?;
        Ok(MoeConfig {
            experts,
            top_k,
            hidden,
            aux_coefficient,
        })
    }

    /// The number of experts `E`.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// How many experts each token goes to, `k`.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// The hidden width of every expert MLP.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The scale of the load-balancing loss.
    pub fn aux_coefficient(&self) -> f64 {
        self.aux_coefficient
    }

    /// The same mixture with the load-balancing loss scaled by `aux_coefficient` (finite,
    /// non-negative): e.g. a trainer's coefficient divided by its microbatches, for a loss that
    /// is a mean over them.
    pub fn with_aux_coefficient(self, aux_coefficient: f64) -> Result<Self> {
        MoeConfig::new(self.experts, self.top_k, self.hidden, aux_coefficient)
    }
}

// The coefficient is finite (checked on construction), so equality is reflexive: a model's
// configuration with a mixture compares as a whole (`GptConfig: Eq`).
impl Eq for MoeConfig {}

/// The experts one expert-parallel rank holds when `experts` experts are split evenly over
/// `ranks` ranks: rank `r` holds experts `r·E/X .. (r+1)·E/X`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExpertShard {
    rank: usize,
    ranks: usize,
    experts: usize,
}

impl ExpertShard {
    /// Rank `rank` of `ranks` expert-parallel ranks over `experts` experts; `ranks` must divide
    /// `experts` (at least one expert).
    pub fn new(rank: usize, ranks: usize, experts: usize) -> Result<Self> {
        at_least_one_expert(experts)?;
        require(ranks > 0, "expert_ranks", ranks, "must be positive")?;
        if experts % ranks != 0 {
            return Err(KernelError::ExpertRanksDoNotDivide { ranks, experts });
        }
        if rank >= ranks {
            return Err(KernelError::ExpertRankOutOfRange { rank, ranks });
        }
        Ok(ExpertShard {
            rank,
            ranks,
            experts,
        })
    }

    /// The one shard of a single rank holding all of `config`'s experts.
    pub fn whole(config: &MoeConfig) -> Self {
        ExpertShard {
            rank: 0,
            ranks: 1,
            experts: config.experts(),
        }
    }

    /// Every shard of `ranks` ranks over `experts` experts, by rank.
    pub fn all(ranks: usize, experts: usize) -> Result<Vec<Self>> {
        (0..ranks.max(1))
            .map(|rank| ExpertShard::new(rank, ranks, experts))
            .collect()
    }

    /// This shard's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of expert-parallel ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The number of experts over all ranks.
    pub fn experts(&self) -> usize {
        self.experts
    }

    /// How many experts each rank holds, `E / X`.
    pub fn per_rank(&self) -> usize {
        self.experts / self.ranks
    }

    /// The experts this rank holds.
    pub fn held(&self) -> Range<usize> {
        let per_rank = self.per_rank();
        self.rank * per_rank..(self.rank + 1) * per_rank
    }

    /// Whether this rank holds `expert`.
    pub fn holds(&self, expert: usize) -> bool {
        self.held().contains(&expert)
    }

    /// The rank holding `expert` (an index below [`ExpertShard::experts`]).
    pub fn owner(&self, expert: usize) -> usize {
        expert / self.per_rank()
    }
}

/// Fails unless there is at least one expert.
fn at_least_one_expert(experts: usize) -> Result<()> {
    require(
        experts > 0,
        "experts",
        experts,
        "a mixture of experts needs at least one expert",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of a rejected configuration or shard.
    fn refusal<T: std::fmt::Debug>(result: Result<T>) -> String {
        result.expect_err("the setting is invalid").to_string()
    }

    #[test]
    fn rejects_each_invalid_config_or_shard_with_one_line() {
        let cases = [
            (
                refusal(MoeConfig::new(0, 1, 8, 0.01)),
                "invalid experts = 0: a mixture of experts needs at least one expert",
            ),
            (
                refusal(MoeConfig::new(4, 0, 8, 0.01)),
                "invalid top_k = 0: each token must go to at least one expert",
            ),
            (
                refusal(MoeConfig::new(2, 3, 8, 0.01)),
                "top-k 3 is above the 2 experts",
            ),
            (
                refusal(MoeConfig::new(4, 2, 0, 0.01)),
                "invalid hidden = 0: must be positive",
            ),
            (
                refusal(MoeConfig::new(4, 2, 8, -1.0)),
                "invalid aux_coefficient = -1: must be finite and non-negative",
            ),
            (
                refusal(MoeConfig::new(4, 2, 8, f64::NAN)),
                "invalid aux_coefficient = NaN: must be finite and non-negative",
            ),
            (
                refusal(ExpertShard::new(0, 3, 4)),
                "3 expert-parallel ranks do not divide the 4 experts",
            ),
            (
                refusal(ExpertShard::new(2, 2, 4)),
                "expert-parallel rank 2 is not below the 2 ranks",
            ),
            (
                refusal(ExpertShard::new(0, 0, 4)),
                "invalid expert_ranks = 0: must be positive",
            ),
            (
                refusal(ExpertShard::new(0, 1, 0)),
                "invalid experts = 0: a mixture of experts needs at least one expert",
            ),
        ];
        for (actual, expected) in cases {
            assert_eq!(actual, expected);
            assert!(!actual.contains('\n'));
        }
        assert!(ExpertShard::all(3, 4).is_err());
    }

    #[test]
    fn accepts_top_k_up_to_the_experts() {
        let config = MoeConfig::new(4, 4, 16, 0.0).unwrap();
        assert_eq!(
            (config.experts(), config.top_k(), config.hidden()),
            (4, 4, 16)
        );
        assert_eq!(config.aux_coefficient(), 0.0);
    }

    #[test]
    fn shards_split_the_experts_evenly_by_rank() {
        let shards = ExpertShard::all(3, 6).unwrap();
        let held: Vec<_> = shards.iter().map(|s| s.held()).collect();
        assert_eq!(held, [0..2, 2..4, 4..6]);
        assert!(shards[1].holds(3) && !shards[1].holds(4));
        assert_eq!(
            (0..6).map(|e| shards[0].owner(e)).collect::<Vec<_>>(),
            [0, 0, 1, 1, 2, 2]
        );
        let whole = ExpertShard::whole(&MoeConfig::new(5, 2, 8, 0.0).unwrap());
        assert_eq!((whole.held(), whole.ranks()), (0..5, 1));
    }
}
