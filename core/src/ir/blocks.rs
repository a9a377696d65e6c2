//! How a model's layers are cut into pipeline stages: the even cut, the rules a given cut
//! (`--layers-per-stage a,b,...`) must keep and how one count per rank is spread over the
//! positions the rank holds. A model may pin layers to its ends (the first stage holds those
//! pinned first, the last those pinned last, [`PinnedEnds`]); the counts are of the others, its
//! free layers (a transformer's blocks). The one home of these, for the trainer's `ModelCut`, a
//! profile's costs of a cut and `tune`'s candidate cuts.

/// What a model pins to its first and its last stage, named as a message names them (`the
/// embedding`); `None` where nothing is pinned there, so that stage needs a free layer of its
/// own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PinnedEnds {
    /// What the first stage holds besides its free layers.
    pub first: Option<String>,
    /// What the last stage holds besides its free layers.
    pub last: Option<String>,
}

impl PinnedEnds {
    /// Layers pinned to the ends, by their names in messages.
    pub fn new(first: Option<&str>, last: Option<&str>) -> Self {
        PinnedEnds {
            first: first.map(str::to_string),
            last: last.map(str::to_string),
        }
    }

    /// Nothing pinned: every stage needs a free layer.
    pub fn none() -> Self {
        PinnedEnds::default()
    }

    /// Whether stage `k` of `stages` holds a pinned layer.
    pub fn holds(&self, k: usize, stages: usize) -> bool {
        (k == 0 && self.first.is_some()) || (k + 1 == stages && self.last.is_some())
    }

    /// The fewest free layers stage `k` of `stages` needs: none where it holds a pinned layer,
    /// else one.
    pub fn least(&self, k: usize, stages: usize) -> usize {
        usize::from(!self.holds(k, stages))
    }
}

/// `blocks` blocks over `stages` stages as evenly as they go: stage `k` holds blocks
/// `⌊kL/S⌋ .. ⌊(k+1)L/S⌋` (the later stages take the extra blocks, so the first, which also
/// holds what is pinned first, is never the larger).
pub fn even_blocks(blocks: usize, stages: usize) -> Vec<usize> {
    (0..stages)
        .map(|k| (k + 1) * blocks / stages - k * blocks / stages)
        .collect()
}

/// `free` free layers over `stages` stages as evenly as they go ([`even_blocks`]), mirrored
/// where only the last stage holds pinned layers, so the extra layers go to the stages away from
/// what is pinned.
pub fn even_cut(free: usize, stages: usize, pinned: &PinnedEnds) -> Vec<usize> {
    let mut counts = even_blocks(free, stages);
    if pinned.first.is_none() && pinned.last.is_some() {
        counts.reverse();
    }
    counts
}

/// Why `counts` (free layers per stage, in order) is not a cut of a model of `free` free layers
/// with `pinned` ends: they must sum to the free layers, and a stage that holds no pinned layer
/// needs a free one. `None` when it is one. The number of counts is the caller's to check.
pub fn cut_violation(counts: &[usize], free: usize, pinned: &PinnedEnds) -> Option<String> {
    let shown = counts
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let sum: usize = counts.iter().sum();
    let noun = if pinned.first.is_some() || pinned.last.is_some() {
        "blocks"
    } else {
        "layers"
    };
    if sum != free {
        return Some(format!(
            "--layers-per-stage {shown} sums to {sum}; the model has {free} {noun}"
        ));
    }
    let stages = counts.len();
    let why = match (&pinned.first, &pinned.last) {
        (Some(first), Some(last)) => format!(
            "only the first holds {first} and only the last {last}; a stage between them needs \
             a block"
        ),
        (Some(first), None) => {
            format!("only the first holds {first}; every other stage needs a block")
        }
        (None, Some(last)) => {
            format!("only the last holds {last}; every other stage needs a block")
        }
        (None, None) => "nothing is pinned to a stage; every stage needs a layer".to_string(),
    };
    (0..stages)
        .find(|&k| counts[k] < pinned.least(k, stages))
        .map(|k| format!("--layers-per-stage {shown} leaves stage {k} empty ({why})"))
}

/// Blocks per position from one count per rank (a rank's *share*, as `--layers-per-stage`
/// counts on plans whose ranks hold several positions): `owners[k]` is the rank holding
/// position `k`; rank `r`'s `shares[r]` blocks are spread over its positions in order as evenly
/// as they go, the earlier positions taking the extra blocks. Positions of ranks beyond `shares`
/// get none.
pub fn spread_shares(owners: &[usize], shares: &[usize]) -> Vec<usize> {
    let mut counts = vec![0; owners.len()];
    for (rank, &share) in shares.iter().enumerate() {
        let held: Vec<usize> = (0..owners.len()).filter(|&k| owners[k] == rank).collect();
        for (i, &k) in held.iter().enumerate() {
            counts[k] = share / held.len() + usize::from(i < share % held.len());
        }
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_cuts_give_the_extra_blocks_to_later_stages() {
        assert_eq!(even_blocks(5, 3), [1, 2, 2]);
        assert_eq!(even_blocks(1, 4), [0, 0, 0, 1]);
        assert_eq!(even_blocks(8, 4), [2, 2, 2, 2]);
    }

    fn both() -> PinnedEnds {
        PinnedEnds::new(Some("the input layer"), Some("the output layer"))
    }

    #[test]
    fn a_cut_must_sum_and_keep_the_middle_stages() {
        let both = both();
        let err = cut_violation(&[3, 0, 3], 6, &both).unwrap();
        assert!(err.contains("leaves stage 1 empty"), "{err}");
        assert!(
            err.contains("only the first holds the input layer and only the last the output layer"),
            "{err}"
        );
        assert!(cut_violation(&[1, 2, 2], 6, &both)
            .unwrap()
            .contains("sums to 5; the model has 6 blocks"));
        assert_eq!(cut_violation(&[0, 6, 0], 6, &both), None);
    }

    #[test]
    fn a_stage_without_a_pinned_layer_needs_a_free_one() {
        let none = PinnedEnds::none();
        assert_eq!(cut_violation(&[1, 4, 1], 6, &none), None);
        let err = cut_violation(&[0, 6], 6, &none).unwrap();
        assert!(err.contains("leaves stage 0 empty"), "{err}");
        assert!(err.contains("every stage needs a layer"), "{err}");
        let err = cut_violation(&[2, 2], 6, &none).unwrap();
        assert!(err.contains("sums to 4; the model has 6 layers"), "{err}");
        // Pinned first only: the first stage may be empty, the last may not.
        let first = PinnedEnds::new(Some("`stem`"), None);
        assert_eq!(cut_violation(&[0, 6], 6, &first), None);
        let err = cut_violation(&[6, 0], 6, &first).unwrap();
        assert!(err.contains("leaves stage 1 empty"), "{err}");
        assert!(err.contains("only the first holds `stem`"), "{err}");
        // One stage holds everything: it is the first and the last.
        assert_eq!(cut_violation(&[0], 0, &both()), None);
        assert!(cut_violation(&[0], 0, &none).is_some());
    }

    #[test]
    fn the_even_cut_gives_the_extra_layers_away_from_what_is_pinned() {
        let last = PinnedEnds::new(None, Some("`loss`"));
        assert_eq!(even_cut(5, 3, &last), [2, 2, 1]);
        assert_eq!(even_cut(2, 3, &last), [1, 1, 0]);
        assert_eq!(even_cut(5, 3, &both()), [1, 2, 2]);
        assert_eq!(even_cut(5, 3, &PinnedEnds::none()), [1, 2, 2]);
    }

    #[test]
    fn shares_spread_over_a_ranks_positions_earlier_first() {
        // A V layout on two ranks: rank 0 holds positions 0 and 3, rank 1 positions 1 and 2.
        assert_eq!(spread_shares(&[0, 1, 1, 0], &[3, 2]), [2, 1, 1, 1]);
        assert_eq!(spread_shares(&[0, 1, 1, 0], &[0, 5]), [0, 3, 2, 0]);
        // Interleaved: rank 0 holds 0 and 2.
        assert_eq!(spread_shares(&[0, 1, 0, 1], &[2, 3]), [1, 2, 1, 1]);
    }
}
