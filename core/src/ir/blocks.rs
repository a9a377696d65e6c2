//! How a model's transformer blocks are cut into pipeline stages: the even cut, the rules a
//! given cut (`--layers-per-stage a,b,...`) must keep and how one count per rank is spread over
//! the positions the rank holds. The one home of these, for the trainer's `ModelCut`, a
//! profile's costs of a cut and `tune`'s candidate cuts.

/// `blocks` blocks over `stages` stages as evenly as they go: stage `k` holds blocks
/// `⌊kL/S⌋ .. ⌊(k+1)L/S⌋` (the later stages take the extra blocks, so the first, which also
/// holds the embedding, is never the larger).
pub fn even_blocks(blocks: usize, stages: usize) -> Vec<usize> {
    (0..stages)
        .map(|k| (k + 1) * blocks / stages - k * blocks / stages)
        .collect()
}

/// Why `counts` (blocks per stage, in order) is not a cut of `blocks` blocks: they must sum to
/// the blocks, and a stage between the first (the embedding's) and the last (the head's) needs a
/// block. `None` when it is one. The number of counts is the caller's to check.
pub fn cut_violation(counts: &[usize], blocks: usize) -> Option<String> {
    let shown = counts
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let sum: usize = counts.iter().sum();
    if sum != blocks {
        return Some(format!(
            "--layers-per-stage {shown} sums to {sum}; the model has {blocks} blocks"
        ));
    }
    let stages = counts.len();
    (1..stages.saturating_sub(1))
        .find(|&k| counts[k] == 0)
        .map(|k| {
            format!(
                "--layers-per-stage {shown} leaves stage {k} empty (only the first holds the \
                 embedding and only the last the head; a stage between them needs a block)"
            )
        })
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

    #[test]
    fn a_cut_must_sum_and_keep_the_middle_stages() {
        assert!(cut_violation(&[3, 0, 3], 6)
            .unwrap()
            .contains("leaves stage 1 empty"));
        assert!(cut_violation(&[1, 2, 2], 6)
            .unwrap()
            .contains("sums to 5; the model has 6 blocks"));
        assert_eq!(cut_violation(&[0, 6, 0], 6), None);
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
