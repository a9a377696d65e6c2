//! [`Embedding`]: GPT-2's input embedding with learned positions, `wte[ids] + wpe[0..T]` for
//! token ids `[B, T]` (U32), with `wte: [V, d]` and `wpe: [T_max, d]`.
//!
//! The input (token ids) has no gradient, so the input backward only hands the output gradient
//! on; the weight backward scatter-adds its rows into `wte` (by token id) and `wpe` (by
//! position), in row-major order of the batch. Parameters, in order: `wte.weight`, `wpe.weight`.

use candle_core::{DType, Tensor};

use super::model::{KindDescription, ModelLayer, Placement};
use super::protocol::{held_tensors, parameters, Layer, NamedParameters};
use crate::check;
use crate::config::GptConfig;
use crate::error::{KernelError, Result};
use crate::init::{ParameterFactory, INIT_STD};
use crate::primitives::Primitives;
use crate::sequence::{ChunkAt, ChunkMemory};

const LAYER: &str = "Embedding";

/// Token plus learned position embedding.
#[derive(Debug, Clone)]
pub struct Embedding {
    wte: Tensor,
    wpe: Tensor,
}

/// What [`Embedding::forward`] keeps: the flat token and position ids `[B·T]`.
#[derive(Debug)]
pub struct EmbeddingSaved {
    token_ids: Tensor,
    position_ids: Tensor,
    output_dims: Vec<usize>,
}

/// What [`Embedding::backward_weight`] needs: the ids and the output gradient rows `[B·T, d]`.
#[derive(Debug)]
pub struct EmbeddingPendingWeightGrad {
    token_ids: Tensor,
    position_ids: Tensor,
    grad_rows: Tensor,
}

impl Embedding {
    /// An embedding from `wte: [V, d]` and `wpe: [T_max, d]` (F32 or F64, same dtype).
    pub fn new(wte: Tensor, wpe: Tensor) -> Result<Self> {
        check::named(LAYER, "wte.weight", &wte).first_parameter(2, "[V, d]")?;
        let checked = check::named(LAYER, "wpe.weight", &wpe);
        checked.parameter(2, "[T_max, d]")?;
        checked.width_and_dtype(wte.dims()[1], wte.dtype())?;
        Ok(Embedding { wte, wpe })
    }

    /// The vocabulary size `V`.
    pub fn vocab_size(&self) -> usize {
        self.wte.dims()[0]
    }

    /// The number of learned positions `T_max`.
    pub fn max_seq_len(&self) -> usize {
        self.wpe.dims()[0]
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.wte.dims()[1]
    }

    /// Checks the token ids `[B, T]` (shape, length from position `start`, range) and returns
    /// `(B, T)`.
    fn check_ids(
        &self,
        ops: &dyn Primitives,
        ids: &Tensor,
        start: usize,
    ) -> Result<(usize, usize)> {
        let checked = check::named(LAYER, "token_ids", ids);
        checked.dtype_is(DType::U32)?;
        checked.rank_is(2, "[B, T]")?;
        checked.non_empty()?;
        let (batch, seq_len) = (ids.dims()[0], ids.dims()[1]);
        if start + seq_len > self.max_seq_len() {
            return Err(KernelError::SequenceTooLong {
                layer: LAYER,
                seq_len: start + seq_len,
                max_seq_len: self.max_seq_len(),
            });
        }
        let values = ops.u32_values(ids)?;
        check::ids_below(LAYER, "token_ids", &values, self.vocab_size())?;
        Ok((batch, seq_len))
    }
}

/// The position of every token of a `[batch, seq_len]` batch whose first token sits at
/// `start` (0 but for a sequence chunk), row-major: `start..start + seq_len` repeated.
fn position_ids(batch: usize, seq_len: usize, start: usize) -> Vec<u32> {
    let (from, to) = (start as u32, (start + seq_len) as u32);
    (0..batch).flat_map(|_| from..to).collect()
}

impl Embedding {
    /// The embedding of token ids `[B, T]` at positions `start..start + T`.
    fn embed(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        start: usize,
    ) -> Result<(Tensor, EmbeddingSaved)> {
        let (batch, seq_len) = self.check_ids(ops, input, start)?;
        let rows = batch * seq_len;
        let token_ids = ops.reshape(input, &[rows])?;
        let position_ids = ops.u32_tensor(&position_ids(batch, seq_len, start), &[rows])?;
        let tokens = ops.gather_rows(&self.wte, &token_ids)?;
        let positions = ops.gather_rows(&self.wpe, &position_ids)?;
        let output_dims = vec![batch, seq_len, self.width()];
        let output = ops.reshape(&ops.add(&tokens, &positions)?, &output_dims)?;
        let saved = EmbeddingSaved {
            token_ids,
            position_ids,
            output_dims,
        };
        Ok((output, saved))
    }
}

impl Layer for Embedding {
    type Saved = EmbeddingSaved;
    type PendingWeightGrad = EmbeddingPendingWeightGrad;
    type InputGrad = ();

    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, EmbeddingSaved)> {
        self.embed(ops, input, 0)
    }

    /// A sequence chunk's tokens at their positions.
    fn forward_chunk(
        &self,
        ops: &dyn Primitives,
        input: &Tensor,
        at: ChunkAt,
        _memory: &mut ChunkMemory,
    ) -> Result<(Tensor, EmbeddingSaved)> {
        self.embed(ops, input, at.start)
    }

    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: EmbeddingSaved,
        grad_output: &Tensor,
    ) -> Result<((), EmbeddingPendingWeightGrad)> {
        check::grad_matches(LAYER, grad_output, &saved.output_dims, self.dtype())?;
        let rows = saved.output_dims[0] * saved.output_dims[1];
        let grad_rows = ops.reshape(grad_output, &[rows, self.width()])?;
        let pending = EmbeddingPendingWeightGrad {
            token_ids: saved.token_ids,
            position_ids: saved.position_ids,
            grad_rows,
        };
        Ok(((), pending))
    }

    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: EmbeddingPendingWeightGrad,
    ) -> Result<Vec<Tensor>> {
        let grad_wte =
            ops.scatter_add_rows(&pending.grad_rows, &pending.token_ids, self.vocab_size())?;
        let grad_wpe = ops.scatter_add_rows(
            &pending.grad_rows,
            &pending.position_ids,
            self.max_seq_len(),
        )?;
        Ok(vec![grad_wte, grad_wpe])
    }
}

/// The model's first layer: it takes the token ids.
impl ModelLayer for Embedding {
    const KIND: KindDescription =
        KindDescription::placed("embedding", Placement::First).taking_token_ids();

    /// `wte` and `wpe` drawn `N(0, 0.02²)`.
    fn build(factory: &ParameterFactory<'_>, config: &GptConfig, _index: usize) -> Result<Self> {
        let (vocab, positions, d) = (config.vocab_size(), config.max_seq_len(), config.d_model());
        Embedding::new(
            factory.normal("transformer.wte.weight", &[vocab, d], INIT_STD)?,
            factory.normal("transformer.wpe.weight", &[positions, d], INIT_STD)?,
        )
    }

    fn location(_index: usize) -> String {
        "transformer.wte/wpe".to_string()
    }

    /// `transformer.wte.weight`, `transformer.wpe.weight`.
    fn push_model_parameters(&self, _index: usize, out: &mut Vec<(String, Tensor)>) {
        self.push_parameters("transformer", out);
    }
}

parameters!(Embedding { "wte.weight" => wte, "wpe.weight" => wpe });
held_tensors!(mut EmbeddingSaved { token_ids, position_ids });
held_tensors!(mut EmbeddingPendingWeightGrad {
    token_ids,
    position_ids,
    grad_rows
});

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{
        assert_matches, check_layer_against_oracle_seeded, dtype_error, ops, random, random_ids,
        shape_error, DTYPES,
    };

    fn build(dtype: DType) -> (Embedding, Vec<Tensor>) {
        let p = vec![
            random(1, &[10, 6], 1.0, dtype),
            random(2, &[7, 6], 1.0, dtype),
        ];
        (Embedding::new(p[0].clone(), p[1].clone()).unwrap(), p)
    }

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let (layer, p) = build(dtype);
            // Repeated ids exercise the scatter-add.
            let ids = random_ids(3, &[3, 5], 4);
            check_layer_against_oracle_seeded("Embedding", &layer, &ids, &p, 4, |ids, p| {
                oracle::embedding(ids, &p[0], &p[1])
            });
        }
    }

    #[test]
    fn rejects_out_of_range_ids_long_sequences_and_bad_shapes() {
        let (layer, _) = build(DType::F64);
        let bad_id = Tensor::new(&[[1u32, 10, 2]], &candle_core::Device::Cpu).unwrap();
        let err = layer.forward(&ops(), &bad_id).unwrap_err();
        assert_matches!(
            err,
            KernelError::TokenOutOfRange {
                id: 10,
                position: 1,
                vocab_size: 10,
                ..
            }
        );
        let too_long = random_ids(3, &[1, 8], 10);
        let err = layer.forward(&ops(), &too_long).unwrap_err();
        assert_matches!(
            err,
            KernelError::SequenceTooLong {
                seq_len: 8,
                max_seq_len: 7,
                ..
            }
        );
        let flat = random_ids(3, &[6], 10);
        let err = layer.forward(&ops(), &flat).unwrap_err();
        assert_eq!(shape_error(&err), ("Embedding", "token_ids"));
        let float_ids = random(3, &[1, 3], 1.0, DType::F64);
        let err = layer.forward(&ops(), &float_ids).unwrap_err();
        assert_eq!(dtype_error(&err), ("Embedding", "token_ids"));
    }
}
