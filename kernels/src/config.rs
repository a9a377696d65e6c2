//! [`GptConfig`]: the hyper-parameters of a GPT-2-architecture model, validated on construction,
//! its blocks' feed-forward halves MLPs or, with [`GptConfig::with_moe`], mixtures of experts;
//! [`MoeConfig`] and [`ExpertShard`] (in `config/moe.rs`): a mixture of experts' shape and the
//! experts of one expert-parallel rank.

mod moe;

pub use moe::{ExpertShard, MoeConfig};

use crate::error::{require, Result};

/// The shape of a GPT-2-architecture model: GPT-2's blocks ([`crate::Block`]), or with a
/// mixture of experts ([`GptConfig::moe`]) blocks whose MLP is that mixture
/// ([`crate::MoeBlock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptConfig {
    vocab_size: usize,
    n_layer: usize,
    d_model: usize,
    n_head: usize,
    max_seq_len: usize,
    moe: Option<MoeConfig>,
}

impl GptConfig {
    /// The default vocabulary: the 256 byte values.
    pub const BYTE_VOCAB_SIZE: usize = 256;

    /// A model with the byte vocabulary, `n_layer` blocks of width `d_model` with `n_head`
    /// heads (which must divide `d_model`), and `max_seq_len` learned positions.
    pub fn new(n_layer: usize, d_model: usize, n_head: usize, max_seq_len: usize) -> Result<Self> {
        positive("n_layer", n_layer)?;
        positive("d_model", d_model)?;
        positive("n_head", n_head)?;
        positive("max_seq_len", max_seq_len)?;
        require(
            d_model % n_head == 0,
            "n_head",
            n_head,
            "must divide d_model",
        )?;
        Ok(GptConfig {
            vocab_size: Self::BYTE_VOCAB_SIZE,
            n_layer,
            d_model,
            n_head,
            max_seq_len,
            moe: None,
        })
    }

    /// The same model with every block's MLP replaced by a mixture of experts of shape `moe`
    /// ([`crate::MoeBlock`] in place of [`crate::Block`]).
    pub fn with_moe(self, moe: MoeConfig) -> Self {
        GptConfig {
            moe: Some(moe),
            ..self
        }
    }

    /// The shape of the blocks' mixture of experts; `None` for GPT-2's MLPs.
    pub fn moe(&self) -> Option<&MoeConfig> {
        self.moe.as_ref()
    }

    /// The same model with another vocabulary size.
    pub fn with_vocab_size(self, vocab_size: usize) -> Result<Self> {
        positive("vocab_size", vocab_size)?;
        let fits = u32::try_from(vocab_size).is_ok();
        require(fits, "vocab_size", vocab_size, "token ids are u32")?;
        Ok(GptConfig { vocab_size, ..self })
    }

    /// The vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The number of transformer blocks of the whole model.
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    /// The model width `d`.
    pub fn d_model(&self) -> usize {
        self.d_model
    }

    /// The number of attention heads `H`.
    pub fn n_head(&self) -> usize {
        self.n_head
    }

    /// The width of a head, `d / H`.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }

    /// The number of learned positions `T_max`.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// The MLP's hidden width, `4d`.
    pub fn mlp_hidden(&self) -> usize {
        4 * self.d_model
    }
}

/// Fails unless `value` is positive.
fn positive(field: &'static str, value: usize) -> Result<()> {
    require(value > 0, field, value, "must be positive")
}
