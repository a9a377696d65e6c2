//! Shape and dtype checks shared by the layers: each returns a typed [`KernelError`] naming the
//! layer and the tensor instead of letting a mismatch reach the backend.

use candle_core::{DType, Tensor};

use crate::error::{KernelError, Result};

/// Fails unless `tensor` has exactly the shape `expected`.
pub(crate) fn shape_is(
    layer: &'static str,
    name: &'static str,
    tensor: &Tensor,
    expected: &[usize],
) -> Result<()> {
    if tensor.dims() == expected {
        return Ok(());
    }
    Err(shape_error(layer, name, tensor, format!("{expected:?}")))
}

/// Fails unless `tensor` has rank `rank` (any sizes).
pub(crate) fn rank_is(
    layer: &'static str,
    name: &'static str,
    tensor: &Tensor,
    rank: usize,
    expected: &str,
) -> Result<()> {
    if tensor.rank() == rank {
        return Ok(());
    }
    Err(shape_error(layer, name, tensor, expected.to_string()))
}

/// Fails unless `tensor` has rank at least 1 and last dimension `features`.
pub(crate) fn last_dim_is(
    layer: &'static str,
    name: &'static str,
    tensor: &Tensor,
    features: usize,
) -> Result<()> {
    if tensor.dims().last() == Some(&features) {
        return Ok(());
    }
    Err(shape_error(
        layer,
        name,
        tensor,
        format!("[.., {features}]"),
    ))
}

/// Fails unless `tensor` has no zero-sized dimension.
pub(crate) fn non_empty(layer: &'static str, name: &'static str, tensor: &Tensor) -> Result<()> {
    if tensor.elem_count() > 0 {
        return Ok(());
    }
    Err(shape_error(
        layer,
        name,
        tensor,
        "no zero-sized dimension".into(),
    ))
}

/// Fails unless `tensor` has dtype `dtype`.
pub(crate) fn dtype_is(
    layer: &'static str,
    name: &'static str,
    tensor: &Tensor,
    dtype: DType,
) -> Result<()> {
    if tensor.dtype() == dtype {
        return Ok(());
    }
    Err(KernelError::DType {
        layer,
        tensor: name,
        actual: tensor.dtype(),
        expected: format!("{dtype:?}"),
    })
}

/// Fails unless `tensor` holds F32 or F64, the dtypes the layers support.
pub(crate) fn supported_float(
    layer: &'static str,
    name: &'static str,
    tensor: &Tensor,
) -> Result<()> {
    if matches!(tensor.dtype(), DType::F32 | DType::F64) {
        return Ok(());
    }
    Err(KernelError::DType {
        layer,
        tensor: name,
        actual: tensor.dtype(),
        expected: "F32 or F64".into(),
    })
}

/// Fails unless `grad` has the shape of the forward output `output_dims` and the layer's dtype.
pub(crate) fn grad_matches(
    layer: &'static str,
    grad: &Tensor,
    output_dims: &[usize],
    dtype: DType,
) -> Result<()> {
    shape_is(layer, "grad_output", grad, output_dims)?;
    dtype_is(layer, "grad_output", grad, dtype)
}

fn shape_error(
    layer: &'static str,
    name: &'static str,
    tensor: &Tensor,
    expected: String,
) -> KernelError {
    KernelError::Shape {
        layer,
        tensor: name,
        actual: tensor.dims().to_vec(),
        expected,
    }
}

/// Fails with [`KernelError::TokenOutOfRange`] at the first id `>= vocab_size`.
pub(crate) fn ids_below(
    layer: &'static str,
    name: &'static str,
    values: &[u32],
    vocab_size: usize,
) -> Result<()> {
    match values.iter().position(|&id| id as usize >= vocab_size) {
        None => Ok(()),
        Some(position) => Err(KernelError::TokenOutOfRange {
            layer,
            tensor: name,
            position,
            id: values[position],
            vocab_size,
        }),
    }
}
