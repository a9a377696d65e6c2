//! Cutting a microbatch's sequence into chunks (Seq1F1B): where the chunks end, and what each
//! costs and holds.
//!
//! Causal attention makes a later chunk dearer: chunk `c`, tokens `x_c .. x_{c+1}` of the
//! sequence (as fractions of its length), attends to every token before it, so it costs the
//! prefix up to its end less the prefix before it: `S(x_{c+1}) - S(x_c)`, with `S` the per-token
//! model of the layers ([`crate::ir::layers::LayerTable::length_scale`]: linear part plus
//! attention's quadratic part; `S(x) = x` where nothing is known). Two cuts:
//!
//! - [`SplitBy::Tokens`]: equal tokens per chunk (the last chunks cost more);
//! - [`SplitBy::Cost`]: equal cost per chunk, Seq1F1B's computation-wise partition (the first
//!   chunks hold more tokens).
//!
//! Where the sequence's length is known, boundaries fall on whole tokens and a chunk holds at
//! least one. A chunk's activations are its tokens' share of the microbatch's.

use crate::error::CoreError;

/// The largest number of chunks a sequence may be cut into.
pub const MAX_SEQ_CHUNKS: u32 = 1024;

/// How a sequence is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SplitBy {
    /// Equal tokens per chunk.
    Tokens,
    /// Equal cost per chunk (by the per-token model).
    Cost,
}

impl SplitBy {
    /// The name in expressions and reports: `tokens` or `cost`.
    pub fn name(self) -> &'static str {
        match self {
            SplitBy::Tokens => "tokens",
            SplitBy::Cost => "cost",
        }
    }
}

/// A sequence cut into chunks: `chunks + 1` increasing boundaries from 0 to 1 (fractions of the
/// sequence), on whole tokens where the length is known.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceCut {
    bounds: Vec<f64>,
    tokens: Option<u32>,
}

impl SequenceCut {
    /// Cuts a sequence of `tokens` tokens (None: of unknown length) into `chunks` chunks by
    /// `by`, pricing prefixes with `scale` (the cost of the first `x` of the sequence relative
    /// to all of it: increasing, `scale(1) = 1`).
    pub fn new(
        chunks: u32,
        by: SplitBy,
        tokens: Option<u32>,
        scale: impl Fn(f64) -> f64,
    ) -> Result<SequenceCut, CoreError> {
        if chunks == 0 || chunks > MAX_SEQ_CHUNKS {
            return Err(CoreError::SequenceSplit(format!(
                "chunks = {chunks} must be between 1 and {MAX_SEQ_CHUNKS}"
            )));
        }
        if let Some(n) = tokens {
            if chunks > n {
                return Err(CoreError::SequenceSplit(format!(
                    "chunks = {chunks} is more than the sequence's {n} tokens; a chunk holds at \
                     least one token"
                )));
            }
        }
        let k = f64::from(chunks);
        let mut bounds: Vec<f64> = (0..=chunks)
            .map(|c| match by {
                SplitBy::Tokens => f64::from(c) / k,
                SplitBy::Cost => inverse(&scale, f64::from(c) / k),
            })
            .collect();
        if let Some(n) = tokens {
            let whole = Self::on_tokens(&bounds, n)?;
            bounds = whole.iter().map(|&t| f64::from(t) / f64::from(n)).collect();
        }
        bounds[0] = 0.0;
        bounds[chunks as usize] = 1.0;
        Ok(SequenceCut { bounds, tokens })
    }

    /// Boundaries given as fractions (`bounds`, from 0 to 1) on a sequence of `tokens` tokens:
    /// rounded to whole tokens, increasing, at least one token per chunk. An error where the
    /// sequence has fewer tokens than chunks.
    pub fn on_tokens(bounds: &[f64], tokens: u32) -> Result<Vec<u32>, CoreError> {
        let chunks = bounds.len().saturating_sub(1);
        if chunks as u64 > u64::from(tokens) {
            return Err(CoreError::SequenceSplit(format!(
                "chunks = {chunks} is more than the sequence's {tokens} tokens; a chunk holds at \
                 least one token"
            )));
        }
        let n = f64::from(tokens);
        let mut out = Vec::with_capacity(bounds.len());
        let mut last = 0.0f64;
        for (c, b) in bounds.iter().enumerate() {
            let left = (chunks - c) as f64;
            let at = (b * n).round().max(if c == 0 { 0.0 } else { last + 1.0 });
            let at = if c == chunks { n } else { at.min(n - left) };
            let at = if c == 0 { 0.0 } else { at };
            out.push(at as u32);
            last = at;
        }
        Ok(out)
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u32 {
        (self.bounds.len() - 1) as u32
    }

    /// The boundaries as fractions of the sequence (`chunks + 1`, from 0 to 1).
    pub fn bounds(&self) -> &[f64] {
        &self.bounds
    }

    /// The boundaries in tokens, where the sequence's length is known.
    pub fn token_bounds(&self) -> Option<Vec<u32>> {
        let n = f64::from(self.tokens?);
        Some(self.bounds.iter().map(|b| (b * n).round() as u32).collect())
    }

    /// Each chunk's share of the sequence's tokens (the share of its activations).
    pub fn token_shares(&self) -> Vec<f64> {
        self.bounds.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// Each chunk's share of the microbatch's cost under `scale` (see the module doc).
    pub fn cost_shares(&self, scale: impl Fn(f64) -> f64) -> Vec<f64> {
        self.bounds
            .windows(2)
            .map(|w| (scale(w[1]) - scale(w[0])).max(f64::MIN_POSITIVE))
            .collect()
    }
}

/// The `x` in [0, 1] where the increasing `scale` reaches `target` (bisection).
fn inverse(scale: impl Fn(f64) -> f64, target: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if scale(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Half linear, half quadratic: `S(x) = x/2 + x²/2`.
    fn attention(x: f64) -> f64 {
        0.5 * x + 0.5 * x * x
    }

    #[test]
    fn a_token_split_makes_later_chunks_dearer() {
        let cut = SequenceCut::new(2, SplitBy::Tokens, Some(256), attention).unwrap();
        assert_eq!(cut.token_bounds(), Some(vec![0, 128, 256]));
        assert_eq!(cut.token_shares(), vec![0.5, 0.5]);
        let shares = cut.cost_shares(attention);
        assert!((shares[0] - 0.375).abs() < 1e-12 && (shares[1] - 0.625).abs() < 1e-12);
    }

    #[test]
    fn a_cost_split_balances_cost_with_more_tokens_first() {
        let cut = SequenceCut::new(4, SplitBy::Cost, None, attention).unwrap();
        for share in cut.cost_shares(attention) {
            assert!((share - 0.25).abs() < 1e-9, "{share}");
        }
        let tokens = cut.token_shares();
        assert!(tokens.windows(2).all(|w| w[0] > w[1]), "{tokens:?}");
        // On whole tokens: increasing, at least one each, summing to the sequence.
        let whole = SequenceCut::new(3, SplitBy::Cost, Some(5), attention).unwrap();
        let bounds = whole.token_bounds().unwrap();
        assert_eq!((bounds[0], bounds[3]), (0, 5));
        assert!(bounds.windows(2).all(|w| w[1] > w[0]), "{bounds:?}");
    }

    #[test]
    fn more_chunks_than_tokens_is_refused() {
        let err = SequenceCut::new(9, SplitBy::Tokens, Some(8), |x| x).unwrap_err();
        assert!(
            err.to_string()
                .contains("more than the sequence's 8 tokens"),
            "{err}"
        );
        let err = SequenceCut::new(0, SplitBy::Tokens, None, |x| x).unwrap_err();
        assert!(err.to_string().contains("between 1 and"), "{err}");
    }
}
