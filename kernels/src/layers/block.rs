//! [`Block`]: GPT-2's pre-norm transformer block, `h = x + attn(ln_1(x))`, then
//! `y = h + mlp(ln_2(h))`.
//!
//! Parameters, in order (Hugging Face's `GPT2Block` order): `ln_1.weight`, `ln_1.bias`,
//! `attn.c_attn.weight`, `attn.c_attn.bias`, `attn.c_proj.weight`, `attn.c_proj.bias`,
//! `ln_2.weight`, `ln_2.bias`, `mlp.c_fc.weight`, `mlp.c_fc.bias`, `mlp.c_proj.weight`,
//! `mlp.c_proj.bias`.

use candle_core::{DType, Tensor};

use super::attention::{AttentionPendingWeightGrad, AttentionSaved};
use super::layer_norm::{LayerNormPendingWeightGrad, LayerNormSaved};
use super::mlp::{MlpPendingWeightGrad, MlpSaved};
use super::{prefixed, Attention, Layer, LayerNorm, Mlp, ParameterSlots};
use crate::check;
use crate::error::Result;
use crate::primitives::Primitives;

const LAYER: &str = "Block";

/// A pre-norm transformer block.
#[derive(Debug, Clone)]
pub struct Block {
    ln_1: LayerNorm,
    attn: Attention,
    ln_2: LayerNorm,
    mlp: Mlp,
}

/// What [`Block::forward`] keeps.
#[derive(Debug)]
pub struct BlockSaved {
    ln_1: LayerNormSaved,
    attn: AttentionSaved,
    ln_2: LayerNormSaved,
    mlp: MlpSaved,
    output_dims: Vec<usize>,
}

/// What [`Block::backward_weight`] needs.
#[derive(Debug)]
pub struct BlockPendingWeightGrad {
    ln_1: LayerNormPendingWeightGrad,
    attn: AttentionPendingWeightGrad,
    ln_2: LayerNormPendingWeightGrad,
    mlp: MlpPendingWeightGrad,
}

impl Block {
    /// A block from its four sub-layers, which must agree on the width and dtype.
    pub fn new(ln_1: LayerNorm, attn: Attention, ln_2: LayerNorm, mlp: Mlp) -> Result<Self> {
        let width = attn.width();
        let dtype = attn.dtype();
        for (name, features, layer_dtype) in [
            ("ln_1.weight", ln_1.features(), ln_1.dtype()),
            ("ln_2.weight", ln_2.features(), ln_2.dtype()),
            ("mlp.c_fc.weight", mlp.width(), mlp.dtype()),
        ] {
            check_width(name, features, width)?;
            check_dtype(name, layer_dtype, dtype)?;
        }
        Ok(Block {
            ln_1,
            attn,
            ln_2,
            mlp,
        })
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.attn.width()
    }

    /// The element type of the parameters.
    pub fn dtype(&self) -> DType {
        self.attn.dtype()
    }
}

fn check_width(name: &'static str, features: usize, width: usize) -> Result<()> {
    if features == width {
        return Ok(());
    }
    Err(crate::KernelError::Shape {
        layer: LAYER,
        tensor: name,
        actual: vec![features],
        expected: format!("width {width} (the attention's)"),
    })
}

fn check_dtype(name: &'static str, actual: DType, expected: DType) -> Result<()> {
    if actual == expected {
        return Ok(());
    }
    Err(crate::KernelError::DType {
        layer: LAYER,
        tensor: name,
        actual,
        expected: format!("{expected:?} (the attention's)"),
    })
}

impl Layer for Block {
    type Saved = BlockSaved;
    type PendingWeightGrad = BlockPendingWeightGrad;
    type InputGrad = Tensor;

    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, BlockSaved)> {
        check::rank_is(LAYER, "input", input, 3, "[B, T, d]")?;
        let (normed_1, ln_1) = self.ln_1.forward(ops, input)?;
        let (attended, attn) = self.attn.forward(ops, &normed_1)?;
        let hidden = ops.add(input, &attended)?;
        let (normed_2, ln_2) = self.ln_2.forward(ops, &hidden)?;
        let (transformed, mlp) = self.mlp.forward(ops, &normed_2)?;
        let output = ops.add(&hidden, &transformed)?;
        let saved = BlockSaved {
            ln_1,
            attn,
            ln_2,
            mlp,
            output_dims: input.dims().to_vec(),
        };
        Ok((output, saved))
    }

    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: BlockSaved,
        grad_output: &Tensor,
    ) -> Result<(Tensor, BlockPendingWeightGrad)> {
        check::grad_matches(LAYER, grad_output, &saved.output_dims, self.dtype())?;
        let (grad_normed_2, mlp) = self.mlp.backward_input(ops, saved.mlp, grad_output)?;
        let (grad_from_mlp, ln_2) = self.ln_2.backward_input(ops, saved.ln_2, &grad_normed_2)?;
        let grad_hidden = ops.add(grad_output, &grad_from_mlp)?;
        let (grad_normed_1, attn) = self.attn.backward_input(ops, saved.attn, &grad_hidden)?;
        let (grad_from_attn, ln_1) = self.ln_1.backward_input(ops, saved.ln_1, &grad_normed_1)?;
        let grad_input = ops.add(&grad_hidden, &grad_from_attn)?;
        let pending = BlockPendingWeightGrad {
            ln_1,
            attn,
            ln_2,
            mlp,
        };
        Ok((grad_input, pending))
    }

    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: BlockPendingWeightGrad,
    ) -> Result<Vec<Tensor>> {
        let mut grads = self.ln_1.backward_weight(ops, pending.ln_1)?;
        grads.extend(self.attn.backward_weight(ops, pending.attn)?);
        grads.extend(self.ln_2.backward_weight(ops, pending.ln_2)?);
        grads.extend(self.mlp.backward_weight(ops, pending.mlp)?);
        Ok(grads)
    }

    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut params = prefixed("ln_1", self.ln_1.parameters());
        params.extend(prefixed("attn", self.attn.parameters()));
        params.extend(prefixed("ln_2", self.ln_2.parameters()));
        params.extend(prefixed("mlp", self.mlp.parameters()));
        params
    }
}

impl ParameterSlots for Block {
    fn parameter_slots(&mut self) -> Vec<&mut Tensor> {
        let mut slots = self.ln_1.parameter_slots();
        slots.extend(self.attn.parameter_slots());
        slots.extend(self.ln_2.parameter_slots());
        slots.extend(self.mlp.parameter_slots());
        slots
    }
}

impl crate::layers::SavedTensorsMut for BlockSaved {
    fn tensors_mut<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        self.ln_1.tensors_mut(out);
        self.attn.tensors_mut(out);
        self.ln_2.tensors_mut(out);
        self.mlp.tensors_mut(out);
    }
}

impl crate::layers::HeldTensors for BlockSaved {
    fn tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        self.ln_1.tensors(out);
        self.attn.tensors(out);
        self.ln_2.tensors(out);
        self.mlp.tensors(out);
    }
}

impl crate::layers::HeldTensors for BlockPendingWeightGrad {
    fn tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        self.ln_1.tensors(out);
        self.attn.tensors(out);
        self.ln_2.tensors(out);
        self.mlp.tensors(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::Linear;
    use crate::oracle;
    use crate::testing::{check_layer_against_oracle, random, DTYPES};

    /// Random block parameters (in Hugging Face order) of width `d`.
    pub(crate) fn params(d: usize, dtype: DType) -> Vec<Tensor> {
        let shapes: [&[usize]; 12] = [
            &[d],
            &[d],
            &[d, 3 * d],
            &[3 * d],
            &[d, d],
            &[d],
            &[d],
            &[d],
            &[d, 4 * d],
            &[4 * d],
            &[4 * d, d],
            &[d],
        ];
        let mut p: Vec<Tensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| random(10 + i as u64, shape, 0.4, dtype))
            .collect();
        for ln_weight in [0, 6] {
            p[ln_weight] = p[ln_weight].affine(1.0, 1.0).unwrap();
        }
        p
    }

    fn build(p: &[Tensor], n_head: usize) -> Block {
        let linear = |i: usize| Linear::new(p[i].clone(), p[i + 1].clone()).unwrap();
        Block::new(
            LayerNorm::new(p[0].clone(), p[1].clone()).unwrap(),
            Attention::new(linear(2), linear(4), n_head).unwrap(),
            LayerNorm::new(p[6].clone(), p[7].clone()).unwrap(),
            Mlp::new(linear(8), linear(10)).unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let (d, n_head) = (8, 2);
            let p = params(d, dtype);
            let input = random(5, &[2, 5, d], 1.0, dtype);
            check_layer_against_oracle("Block", &build(&p, n_head), &input, &p, |x, p| {
                oracle::block(x, p, n_head)
            });
        }
    }

    #[test]
    fn parameter_names_follow_hugging_face() {
        let names: Vec<String> = build(&params(4, DType::F64), 2)
            .parameters()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(
            names,
            [
                "ln_1.weight",
                "ln_1.bias",
                "attn.c_attn.weight",
                "attn.c_attn.bias",
                "attn.c_proj.weight",
                "attn.c_proj.bias",
                "ln_2.weight",
                "ln_2.bias",
                "mlp.c_fc.weight",
                "mlp.c_fc.bias",
                "mlp.c_proj.weight",
                "mlp.c_proj.bias",
            ]
        );
    }
}
