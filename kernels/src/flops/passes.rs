//! The estimates per layer kind: [`PassFlops`] and the products of a block and of the head.
//! Depends on the model's shape only.

use crate::config::GptConfig;

/// Estimated FLOPs of the forward, input-gradient and weight-gradient passes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassFlops {
    /// The forward pass (F).
    pub forward: u64,
    /// The input-gradient backward (I).
    pub backward_input: u64,
    /// The weight-gradient backward (W).
    pub backward_weight: u64,
}

impl PassFlops {
    /// The sum of two estimates, pass by pass.
    pub fn plus(self, other: PassFlops) -> PassFlops {
        PassFlops {
            forward: self.forward.saturating_add(other.forward),
            backward_input: self.backward_input.saturating_add(other.backward_input),
            backward_weight: self.backward_weight.saturating_add(other.backward_weight),
        }
    }
}

/// `2·m·n·k`, saturating.
fn matmul(m: usize, n: usize, k: usize) -> u64 {
    [m, n, k]
        .into_iter()
        .fold(2u64, |acc, dim| acc.saturating_mul(dim as u64))
}

/// One transformer block on `batch` sequences of `seq_len` tokens.
pub fn block_flops(config: &GptConfig, batch: usize, seq_len: usize) -> PassFlops {
    let (rows, d) = (batch * seq_len, config.d_model());
    // c_attn (d -> 3d), attn.c_proj (d -> d), c_fc (d -> 4d), mlp.c_proj (4d -> d).
    let linears = matmul(rows, d, 12 * d);
    // q·kᵀ and probs·v over all heads: 2 products of [T, T] x [T, D] per head, H·D = d.
    let core = matmul(batch * seq_len, seq_len, d).saturating_mul(2);
    PassFlops {
        forward: linears.saturating_add(core),
        // The input backward of the core takes 4 products (d_probs, d_v, d_q, d_k).
        backward_input: linears.saturating_add(core.saturating_mul(2)),
        backward_weight: linears,
    }
}

/// The final layer norm and vocabulary projection.
pub fn head_flops(config: &GptConfig, batch: usize, seq_len: usize) -> PassFlops {
    let projection = matmul(batch * seq_len, config.vocab_size(), config.d_model());
    PassFlops {
        forward: projection,
        backward_input: projection,
        backward_weight: projection,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_small_block_matches_the_usual_formula() {
        // 24·N·d² + 4·B·T²·d for the forward of a block.
        let config = GptConfig::new(12, 768, 12, 1024).unwrap();
        let flops = block_flops(&config, 2, 1024);
        let (n, d, t) = (2048u64, 768u64, 1024u64);
        assert_eq!(flops.forward, 24 * n * d * d + 4 * 2 * t * t * d);
        assert_eq!(flops.backward_weight, 24 * n * d * d);
    }
}
