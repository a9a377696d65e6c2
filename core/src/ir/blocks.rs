//! How a model's transformer blocks are cut into pipeline stages: the even cut and the rules a
//! given cut (`--layers-per-stage a,b,...`) must keep. The one home of both, for the trainer's
//! `ModelCut`, a profile's costs of a cut and `tune`'s candidate cuts.

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
}
