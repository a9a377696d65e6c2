//! [`Gelu`]: GPT-2's `gelu_new` activation, `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`,
//! elementwise. It has no parameters, so its weight backward returns no tensors.

use candle_core::Tensor;

use super::protocol::{held_tensors, Layer, NamedParameters};
use crate::check;
use crate::error::Result;
use crate::primitives::Primitives;

const LAYER: &str = "Gelu";

/// The `gelu_new` activation (tanh approximation of GELU).
#[derive(Debug, Clone, Copy, Default)]
pub struct Gelu;

/// What [`Gelu::forward`] keeps: its input.
#[derive(Debug)]
pub struct GeluSaved {
    input: Tensor,
}

impl Layer for Gelu {
    type Saved = GeluSaved;
    type PendingWeightGrad = ();
    type InputGrad = Tensor;

    fn forward(&self, ops: &dyn Primitives, input: &Tensor) -> Result<(Tensor, GeluSaved)> {
        check::named(LAYER, "input", input).supported_float()?;
        let output = ops.gelu_new(input)?;
        Ok((
            output,
            GeluSaved {
                input: input.clone(),
            },
        ))
    }

    fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: GeluSaved,
        grad_output: &Tensor,
    ) -> Result<(Tensor, ())> {
        check::grad_matches(LAYER, grad_output, saved.input.dims(), saved.input.dtype())?;
        Ok((ops.gelu_new_backward(&saved.input, grad_output)?, ()))
    }

    fn backward_weight(&self, _ops: &dyn Primitives, _pending: ()) -> Result<Vec<Tensor>> {
        Ok(Vec::new())
    }
}

impl NamedParameters for Gelu {
    fn push_parameters(&self, _prefix: &str, _out: &mut Vec<(String, Tensor)>) {}
}

held_tensors!(mut GeluSaved { input });

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle;
    use crate::testing::{check_layer_against_oracle, random, DTYPES};

    #[test]
    fn matches_candle_autograd() {
        for dtype in DTYPES {
            let input = random(3, &[2, 3, 8], 2.0, dtype);
            check_layer_against_oracle("Gelu", &Gelu, &input, &[], |x, _| oracle::gelu_new(x));
        }
    }
}
