//! [`Linear`]: an affine map in GPT-2's `Conv1D` layout, `y = x · W + b` with `W: [in, out]`
//! and `b: [out]`, over any number of leading dimensions.
//!
//! Input backward: `dx = dy · Wᵀ`. Weight backward: `dW = xᵀ · dy`, `db = Σ dy`, summed over all
//! rows (leading dimensions flattened).

use candle_core::Tensor;

use super::protocol::{held_tensors, parameters, with_last_dim, Layer};
use crate::check;
use crate::error::Result;
use crate::init::ParameterFactory;
use crate::primitives::Primitives;

const LAYER: &str = "Linear";

/// `y = x · W + b`, with `W: [in, out]` (GPT-2 `Conv1D` layout) and `b: [out]`.
#[derive(Debug, Clone)]
pub struct Linear {
    weight: Tensor,
    bias: Tensor,
}

/// What [`Linear::forward`] keeps: the input as rows `[N, in]`.
#[derive(Debug)]
pub struct LinearSaved {
    input_rows: Tensor,
    input_dims: Vec<usize>,
}

/// What [`Linear::backward_weight`] needs: input rows `[N, in]` and output gradient rows
/// `[N, out]`.
#[derive(Debug)]
pub struct LinearPendingWeightGrad {
    input_rows: Tensor,
    grad_rows: Tensor,
}

impl Linear {
    /// A linear layer from `weight: [in, out]` and `bias: [out]` (F32 or F64, same dtype).
    pub fn new(weight: Tensor, bias: Tensor) -> Result<Self> {
        check::named(LAYER, "weight", &weight).first_parameter(2, "[in, out]")?;
        let out_features = weight.dims()[1];
        check::named(LAYER, "bias", &bias).shaped_like(&[out_features], weight.dtype())?;
        Ok(Linear { weight, bias })
    }

    /// Number of input features.
    pub fn in_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// Number of output features.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// The weight `[in, out]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// The bias `[out]`.
    pub fn bias(&self) -> &Tensor {
        &self.bias
    }

    /// Checks an input `[.., in]` and returns its number of rows.
    fn check_input(&self, input: &Tensor) -> Result<usize> {
        check::named(LAYER, "input", input).rows_of(self.in_features(), self.dtype())?;
        Ok(input.elem_count() / self.in_features())
    }
}

impl Layer for Linear {
    type Saved = LinearSaved;
    type PendingWeightGrad = LinearPendingWeightGrad;
    type InputGrad = Tensor;

    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, LinearSaved)> {
        let rows = self.check_input(input)?;
        let input_rows = ops.reshape(input, &[rows, self.in_features()])?;
        let output_rows = ops.matmul_add_row(&input_rows, &self.weight, &self.bias)?;
        let output_dims = with_last_dim(input.dims(), self.out_features());
        let output = ops.reshape(&output_rows, &output_dims)?;
        let saved = LinearSaved {
            input_rows,
            input_dims: input.dims().to_vec(),
        };
        Ok((output, saved))
    }

    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: LinearSaved,
        grad_output: &Tensor,
    ) -> Result<(Tensor, LinearPendingWeightGrad)> {
        let rows = saved.input_rows.dims()[0];
        let output_dims = with_last_dim(&saved.input_dims, self.out_features());
        check::grad_matches(LAYER, grad_output, &output_dims, self.dtype())?;
        let grad_rows = ops.reshape(grad_output, &[rows, self.out_features()])?;
        let grad_input_rows = ops.matmul_transpose_b(&grad_rows, &self.weight)?;
        let grad_input = ops.reshape(&grad_input_rows, &saved.input_dims)?;
        let pending = LinearPendingWeightGrad {
            input_rows: saved.input_rows,
            grad_rows,
        };
        Ok((grad_input, pending))
    }

    fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: LinearPendingWeightGrad,
    ) -> Result<Vec<Tensor>> {
        let grad_weight = ops.matmul_transpose_a(&pending.input_rows, &pending.grad_rows)?;
        let grad_bias = ops.sum_leading(&pending.grad_rows)?;
        Ok(vec![grad_weight, grad_bias])
    }
}

parameters!(Linear { "weight" => weight, "bias" => bias });
held_tensors!(mut LinearSaved { input_rows });
held_tensors!(mut LinearPendingWeightGrad {
    input_rows,
    grad_rows
});

/// The factory's GPT-2 initialisation of a [`Linear`].
impl ParameterFactory<'_> {
    /// A `Conv1D` linear `[inputs, outputs]` named `prefix`, weight `N(0, std²)`, bias 0.
    pub(crate) fn linear(
        &self,
        prefix: &str,
        inputs: usize,
        outputs: usize,
        std: f64,
    ) -> Result<Linear> {
        let weight = self.normal(&format!("{prefix}.weight"), &[inputs, outputs], std)?;
        Linear::new(weight, self.constant(&[outputs], 0.0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::KernelError;
    use crate::oracle;
    use crate::testing::{
        assert_matches, check_layer_against_oracle, ops, random, shape_error, DTYPES,
    };
    use candle_core::DType;

    fn params(dtype: DType) -> Vec<Tensor> {
        vec![random(1, &[5, 7], 0.5, dtype), random(2, &[7], 0.5, dtype)]
    }

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let p = params(dtype);
            let layer = Linear::new(p[0].clone(), p[1].clone()).unwrap();
            let input = random(3, &[2, 3, 5], 1.0, dtype);
            check_layer_against_oracle("Linear", &layer, &input, &p, |x, p| {
                oracle::linear(x, &p[0], &p[1])
            });
        }
    }

    #[test]
    fn rejects_bad_shapes_and_dtypes() {
        let p = params(DType::F64);
        let layer = Linear::new(p[0].clone(), p[1].clone()).unwrap();
        let wrong_width = random(3, &[2, 4], 1.0, DType::F64);
        let err = layer.forward(&ops(), &wrong_width).unwrap_err();
        assert_eq!(shape_error(&err), ("Linear", "input"));
        let wrong_dtype = random(3, &[2, 5], 1.0, DType::F32);
        let err = layer.forward(&ops(), &wrong_dtype).unwrap_err();
        assert_matches!(err, KernelError::DType { .. });
        let err = Linear::new(p[0].clone(), random(2, &[5], 1.0, DType::F64)).unwrap_err();
        assert_eq!(shape_error(&err), ("Linear", "bias"));

        let (_, saved) = layer
            .forward(&ops(), &random(3, &[2, 5], 1.0, DType::F64))
            .unwrap();
        let wrong_grad = random(4, &[2, 6], 1.0, DType::F64);
        let err = layer
            .backward_input(&ops(), saved, &wrong_grad)
            .unwrap_err();
        assert_eq!(shape_error(&err), ("Linear", "grad_output"));
    }
}
