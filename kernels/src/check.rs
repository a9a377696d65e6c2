//! Shape and dtype checks shared by the layers: each returns a typed [`KernelError`] naming the
//! layer and the tensor instead of letting a mismatch reach the backend.
//!
//! A check runs on a [`Named`] tensor, which carries the names its errors report:
//! `check::named(LAYER, "bias", &bias).shaped_like(&[n], dtype)?`.

use candle_core::{DType, Tensor};

use crate::error::{KernelError, Result};

/// A tensor to check, with the names its errors report: its layer's and its own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Named<'a> {
    layer: &'static str,
    name: &'static str,
    tensor: &'a Tensor,
}

/// `tensor`, called `name` in `layer`, for the checks of [`Named`].
pub(crate) fn named<'a>(layer: &'static str, name: &'static str, tensor: &'a Tensor) -> Named<'a> {
    Named {
        layer,
        name,
        tensor,
    }
}

/// Fails unless `actual`, the dtype of `layer`'s tensor `name`, is `expected`, the dtype it must
/// follow (`whose`: e.g. `the router's`): for a tensor checked against another layer's.
pub(crate) fn dtype_follows(
    layer: &'static str,
    name: &'static str,
    actual: DType,
    (expected, whose): (DType, &str),
) -> Result<()> {
    if actual == expected {
        return Ok(());
    }
    Err(KernelError::DType {
        layer,
        tensor: name,
        actual,
        expected: format!("{expected:?} ({whose})"),
    })
}

impl Named<'_> {
    /// Fails unless the tensor has exactly the shape `expected`.
    pub(crate) fn shape_is(self, expected: &[usize]) -> Result<()> {
        if self.tensor.dims() == expected {
            return Ok(());
        }
        Err(self.shape_error(format!("{expected:?}")))
    }

    /// Fails unless the tensor has rank `rank` (any sizes; `expected` describes the shape).
    pub(crate) fn rank_is(self, rank: usize, expected: &str) -> Result<()> {
        if self.tensor.rank() == rank {
            return Ok(());
        }
        Err(self.shape_error(expected.to_string()))
    }

    /// Fails unless the tensor has rank at least 1 and last dimension `features`.
    pub(crate) fn last_dim_is(self, features: usize) -> Result<()> {
        if self.tensor.dims().last() == Some(&features) {
            return Ok(());
        }
        Err(self.shape_error(format!("[.., {features}]")))
    }

    /// Fails unless the tensor has no zero-sized dimension.
    pub(crate) fn non_empty(self) -> Result<()> {
        if self.tensor.elem_count() > 0 {
            return Ok(());
        }
        Err(self.shape_error("no zero-sized dimension".into()))
    }

    /// Fails unless the tensor has dtype `dtype`.
    pub(crate) fn dtype_is(self, dtype: DType) -> Result<()> {
        if self.tensor.dtype() == dtype {
            return Ok(());
        }
        Err(self.dtype_error(format!("{dtype:?}")))
    }

    /// Fails unless the tensor holds F32 or F64, the dtypes the layers support.
    pub(crate) fn supported_float(self) -> Result<()> {
        if matches!(self.tensor.dtype(), DType::F32 | DType::F64) {
            return Ok(());
        }
        Err(self.dtype_error("F32 or F64".into()))
    }

    /// Fails unless the tensor has exactly the shape `dims` and the dtype `dtype` (of the tensor
    /// it must match).
    pub(crate) fn shaped_like(self, dims: &[usize], dtype: DType) -> Result<()> {
        self.shape_is(dims)?;
        self.dtype_is(dtype)
    }

    /// Fails unless the tensor has the last dimension `width` and the dtype `dtype`.
    pub(crate) fn width_and_dtype(self, width: usize, dtype: DType) -> Result<()> {
        self.last_dim_is(width)?;
        self.dtype_is(dtype)
    }

    /// Fails unless the tensor holds rows of `width` elements of `dtype`: `[.., width]`,
    /// non-empty.
    pub(crate) fn rows_of(self, width: usize, dtype: DType) -> Result<()> {
        self.dtype_is(dtype)?;
        self.last_dim_is(width)?;
        self.non_empty()
    }

    /// Fails unless the parameter has rank `rank` (`expected` describes its shape) and no
    /// zero-sized dimension.
    pub(crate) fn parameter(self, rank: usize, expected: &str) -> Result<()> {
        self.rank_is(rank, expected)?;
        self.non_empty()
    }

    /// As [`Named::parameter`], and F32 or F64: a layer's first parameter, whose dtype the
    /// others follow.
    pub(crate) fn first_parameter(self, rank: usize, expected: &str) -> Result<()> {
        self.supported_float()?;
        self.parameter(rank, expected)
    }

    fn shape_error(self, expected: String) -> KernelError {
        KernelError::Shape {
            layer: self.layer,
            tensor: self.name,
            actual: self.tensor.dims().to_vec(),
            expected,
        }
    }

    fn dtype_error(self, expected: String) -> KernelError {
        KernelError::DType {
            layer: self.layer,
            tensor: self.name,
            actual: self.tensor.dtype(),
            expected,
        }
    }
}

/// Fails unless `grad` has the shape of the forward output `output_dims` and the layer's dtype.
pub(crate) fn grad_matches(
    layer: &'static str,
    grad: &Tensor,
    output_dims: &[usize],
    dtype: DType,
) -> Result<()> {
    named(layer, "grad_output", grad).shaped_like(output_dims, dtype)
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
