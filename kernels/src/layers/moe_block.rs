//! [`MoeBlock`]: a pre-norm transformer block with a mixture of experts in place of the MLP,
//! `h = x + attn(ln_1(x))`, then `y = h + moe(ln_2(h))` ([`Moe`]). Its backward differentiates
//! the loss plus the mixture's load-balancing loss ([`MoeBlockSaved::aux_loss`]). It is the
//! [`PreNormBlock`] of a [`Moe`], as [`super::Block`] is of an MLP: the passes, parameters and
//! construction are theirs; this file says what is the mixture's own.
//!
//! A model layer in place of the [`super::Block`]s where the model's configuration has a mixture
//! ([`GptConfig::moe`]): `n_layer` of them, under the blocks' names (`transformer.h.{i}`),
//! initialised from the seed as a block is (the experts as its MLP). On an expert-parallel rank
//! ([`MoeBlock::on_shard`], what `ModelLayer::with_experts` does for a stage) it holds and runs
//! its shard's experts only, exchanging their rows with the other ranks of its group.
//!
//! Parameters, in order: `ln_1.weight`, `ln_1.bias`, `attn.c_attn.weight`, `attn.c_attn.bias`,
//! `attn.c_proj.weight`, `attn.c_proj.bias`, `ln_2.weight`, `ln_2.bias`, then the mixture's
//! under `moe.` (`moe.router.weight`, `moe.router.bias`, `moe.experts.{e}.c_fc.weight`, ...).

use super::block::{location, FeedForward, PreNormBlock, PreNormPending, PreNormSaved};
use super::linear::Linear;
use super::model::{KindDescription, ModelLayer, Placement};
use super::moe::{ExpertPlacement, Moe};
use super::moe::{MoePendingWeightGrad, MoeSaved};
use crate::config::GptConfig;
use crate::error::{KernelError, Result};
use crate::flops::passes::{block_flops, PassFlops};
use crate::init::ParameterFactory;

/// A pre-norm transformer block whose feed-forward half is a mixture of experts.
pub type MoeBlock = PreNormBlock<Moe>;
/// What a [`MoeBlock`]'s forward keeps.
pub type MoeBlockSaved = PreNormSaved<MoeSaved>;
/// What a [`MoeBlock`]'s weight backward needs.
pub type MoeBlockPendingWeightGrad = PreNormPending<MoePendingWeightGrad>;

impl FeedForward for Moe {
    const BLOCK: &'static str = "MoeBlock";
    const NAME: &'static str = "moe";

    fn input(&self) -> (&'static str, &Linear) {
        ("moe.router.weight", self.router())
    }
}

impl MoeBlockSaved {
    /// The mixture's state (its routing).
    pub fn moe(&self) -> &MoeSaved {
        self.feed_forward()
    }

    /// The mixture's load-balancing loss for the forward's tokens, scaled by its coefficient:
    /// what the backward adds to the loss.
    pub fn aux_loss(&self) -> f64 {
        self.moe().aux_loss()
    }
}

impl MoeBlock {
    /// The mixture of experts.
    pub fn moe(&self) -> &Moe {
        self.feed_forward()
    }

    /// The block as the expert-parallel rank of `placement` runs it ([`Moe::on_shard`]).
    pub fn on_shard(&self, placement: &ExpertPlacement) -> Result<Self> {
        Ok(self.with_feed_forward(self.moe().on_shard(placement)?))
    }
}

/// The model's free layers where its blocks have a mixture of experts ([`GptConfig::moe`]):
/// `n_layer` of them (none otherwise), under the blocks' names.
impl ModelLayer for MoeBlock {
    const KIND: KindDescription = KindDescription::placed("moe_block", Placement::Any);

    fn count(config: &GptConfig) -> usize {
        match config.moe() {
            Some(_) => config.n_layer(),
            None => 0,
        }
    }

    /// As a [`super::Block`] ([`PreNormBlock::build_with`]): each expert as its MLP, the router
    /// `N(0, 0.02²)`.
    fn build(factory: &ParameterFactory<'_>, config: &GptConfig, index: usize) -> Result<Self> {
        let Some(moe) = config.moe() else {
            return Err(KernelError::InvalidArgument {
                field: "moe",
                value: "none".into(),
                reason: "a mixture-of-experts block needs the model's mixture",
            });
        };
        let d = config.d_model();
        MoeBlock::build_with(factory, config, index, |prefix, residual_std| {
            factory.moe(prefix, d, moe, residual_std)
        })
    }

    /// `transformer.h.{index}`, as a block's.
    fn location(index: usize) -> String {
        location(index)
    }

    /// A block's, its MLP's products replaced by the router's and each token's `k` experts'.
    fn flops(config: &GptConfig, batch: usize, seq_len: usize) -> PassFlops {
        let dense = block_flops(config, batch, seq_len);
        let Some(moe) = config.moe() else {
            return dense;
        };
        // `2·Π factors`, saturating: a product's FLOPs.
        let product =
            |factors: &[usize]| (factors.iter()).fold(2u64, |acc, &n| acc.saturating_mul(n as u64));
        let (rows, d) = (batch * seq_len, config.d_model());
        let mlp = product(&[rows, d, 2 * config.mlp_hidden()]);
        let experts = product(&[rows * moe.top_k(), d, 2 * moe.hidden()]);
        let router = product(&[rows, d, moe.experts()]);
        let swap = |pass: u64| {
            (pass.saturating_sub(mlp))
                .saturating_add(experts)
                .saturating_add(router)
        };
        PassFlops {
            forward: swap(dense.forward),
            backward_input: swap(dense.backward_input),
            backward_weight: swap(dense.backward_weight),
        }
    }

    fn with_experts(self, placement: &ExpertPlacement) -> Result<Self> {
        self.on_shard(placement)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Tensor};

    use super::*;
    use crate::config::MoeConfig;
    use crate::layers::block::tests::{attention_params, pre_norm};
    use crate::layers::moe::oracle::{check_with_aux, moe as moe_oracle};
    use crate::layers::{Layer, Mlp, NamedParameters};
    use crate::oracle;
    use crate::testing::{assert_bit_identical, ops, random, DTYPES};

    /// Random parameters of a block of width `d` with `config`'s mixture, in the block's order.
    fn params(d: usize, config: &MoeConfig, dtype: DType) -> Vec<Tensor> {
        let mut p = attention_params(d, dtype);
        let (e, h) = (config.experts(), config.hidden());
        p.push(random(30, &[d, e], 1.0, dtype));
        p.push(random(31, &[e], 0.5, dtype));
        for expert in 0..e as u64 {
            let shapes: [&[usize]; 4] = [&[d, h], &[h], &[h, d], &[d]];
            for (i, shape) in shapes.iter().enumerate() {
                p.push(random(40 + 4 * expert + i as u64, shape, 0.4, dtype));
            }
        }
        p
    }

    /// The mixture of `config` whose router and experts are those of `p` (from index 8).
    fn mixture(p: &[Tensor], config: &MoeConfig) -> Moe {
        let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
        let experts = (0..config.experts())
            .map(|e| Mlp::new(linear(10 + 4 * e), linear(12 + 4 * e)).unwrap())
            .collect();
        Moe::new(*config, linear(8), experts).unwrap()
    }

    fn build(p: &[Tensor], n_head: usize, config: &MoeConfig) -> MoeBlock {
        pre_norm(p, n_head, mixture(p, config)).unwrap()
    }

    /// The block written with candle ops: `(output, aux)`.
    fn block_oracle(
        x: &Tensor,
        p: &[Tensor],
        n_head: usize,
        config: &MoeConfig,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let normed = oracle::layer_norm(x, &p[0], &p[1])?;
        let h = (x + oracle::attention(&normed, &p[2..6], n_head)?)?;
        let (branch, aux) = moe_oracle(&oracle::layer_norm(&h, &p[6], &p[7])?, &p[8..], config)?;
        Ok(((&h + branch)?, aux))
    }

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let (d, n_head) = (8, 2);
            let config = MoeConfig::new(4, 2, 16, 0.05).unwrap();
            let p = params(d, &config, dtype);
            let input = random(5, &[2, 5, d], 1.0, dtype);
            let layer = build(&p, n_head, &config);
            check_with_aux(
                "MoeBlock",
                &layer,
                &input,
                &p,
                MoeBlockSaved::aux_loss,
                |x, p| block_oracle(x, p, n_head, &config),
            );
        }
    }

    #[test]
    fn runs_are_deterministic() {
        let config = MoeConfig::new(4, 2, 16, 0.05).unwrap();
        let layer = build(&params(8, &config, DType::F32), 2, &config);
        let input = random(6, &[2, 5, 8], 1.0, DType::F32);
        let run = || {
            let (output, saved) = layer.forward(&ops(), &input).unwrap();
            let (grad_input, pending) = layer.backward_input(&ops(), saved, &output).unwrap();
            let grads = layer.backward_weight(&ops(), pending).unwrap();
            (output, grad_input, grads)
        };
        let (first, second) = (run(), run());
        assert_bit_identical("MoeBlock output", &second.0, &first.0);
        assert_bit_identical("MoeBlock d(input)", &second.1, &first.1);
        for (a, b) in second.2.iter().zip(&first.2) {
            assert_bit_identical("MoeBlock weight gradient", a, b);
        }
    }

    #[test]
    fn parameter_names_put_the_mixture_under_moe() {
        let config = MoeConfig::new(2, 1, 16, 0.05).unwrap();
        let names: Vec<String> = build(&params(8, &config, DType::F64), 2, &config)
            .parameters()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names.len(), 8 + 2 + 2 * 4);
        assert_eq!(
            names[6..12],
            [
                "ln_2.weight",
                "ln_2.bias",
                "moe.router.weight",
                "moe.router.bias",
                "moe.experts.0.c_fc.weight",
                "moe.experts.0.c_fc.bias",
            ]
        );
        assert_eq!(names[17], "moe.experts.1.c_proj.bias");
    }

    #[test]
    fn a_models_moe_blocks_are_drawn_from_the_seed_under_the_blocks_names() {
        use crate::stage::{StageLayout, StageModel};
        let moe = MoeConfig::new(4, 2, 32, 0.01).unwrap();
        let config = GptConfig::new(2, 8, 2, 16).unwrap().with_moe(moe);
        let whole = StageLayout::whole_model(&config);
        let model = StageModel::new(config, whole.clone(), 3, DType::F32).unwrap();
        let params = model.parameters();
        let names: Vec<&str> = params.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names.len(), 2 + 2 * (8 + 2 + 4 * 4) + 3);
        assert!(names.contains(&"transformer.h.1.moe.experts.3.c_proj.bias"));
        assert!(!names.iter().any(|name| name.contains(".mlp.")));
        let shapes = StageModel::parameter_shapes(&config, &whole).unwrap();
        let dims: Vec<(String, Vec<usize>)> = (params.iter())
            .map(|(name, t)| (name.clone(), t.dims().to_vec()))
            .collect();
        assert_eq!(shapes, dims);
        // The same seed draws the same weights, and an expert's differ from another's.
        let again = StageModel::new(config, whole, 3, DType::F32).unwrap();
        for ((_, a), (_, b)) in params.iter().zip(again.parameters()) {
            assert_bit_identical("weights", a, &b);
        }
        let weight = |name: &str| {
            let found = params.iter().find(|(n, _)| n == name).unwrap();
            crate::testing::values(&found.1)
        };
        let (first, second) = (
            weight("transformer.h.0.moe.experts.0.c_fc.weight"),
            weight("transformer.h.0.moe.experts.1.c_fc.weight"),
        );
        assert_ne!(first, second);
        let std = (first.iter().map(|v| v * v).sum::<f64>() / first.len() as f64).sqrt();
        assert!((std - 0.02).abs() < 0.005, "{std}");
    }

    #[test]
    fn rejects_a_mixture_of_another_width() {
        let config = MoeConfig::new(2, 1, 16, 0.05).unwrap();
        let p = params(8, &config, DType::F64);
        let narrow = params(4, &config, DType::F64);
        let err = pre_norm(&p, 2, mixture(&narrow, &config)).unwrap_err();
        assert!(err.to_string().contains("moe.router.weight"), "{err}");
    }
}
