//! The estimate of a whole stage: its layers' ([`crate::layers::LayerKind::flops`]) summed.

use super::passes::PassFlops;
use crate::config::GptConfig;
use crate::stage::StageLayout;

/// A whole stage: its layers' estimates summed in order, each as its kind gives it (the
/// embedding is a gather and a scatter-add: no products).
pub fn stage_flops(
    config: &GptConfig,
    layout: &StageLayout,
    batch: usize,
    seq_len: usize,
) -> PassFlops {
    layout
        .layers()
        .iter()
        .map(|id| id.kind().flops(config, batch, seq_len))
        .fold(PassFlops::default(), PassFlops::plus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_gpt2_small_is_its_blocks_and_its_head() {
        let config = GptConfig::new(12, 768, 12, 1024).unwrap();
        let (n, d) = (2048u64, 768u64);
        let stage = stage_flops(&config, &StageLayout::whole_model(&config), 2, 1024);
        assert_eq!(stage.backward_weight, 12 * 24 * n * d * d + 2 * n * 256 * d);
    }
}
