//! Where a stage's saved state lives between its forward and its backward, as a plan's
//! `recompute` and `offload` passes decide per (stage, microbatch) pair:
//!
//! - kept on the device, as [`StageModel::forward`] leaves it;
//! - dropped to its input ([`StageModel::checkpoint`]) and rebuilt before the backward by running
//!   the forward again ([`StageModel::recompute_state`]); the forward is deterministic, so the rebuilt
//!   state is bit for bit the one dropped;
//! - copied to host memory ([`StageSaved::to_host`]: every distinct tensor's elements into a host
//!   buffer, the device tensors released) and copied back ([`HostSaved::to_device`]). Tensors that
//!   several layers share are copied once and shared again after the reload.
//!
//! What the input-gradient backward keeps for the weight gradient moves the same way
//! ([`StagePendingWeightGrad::to_host`], [`HostPending::to_device`]), for an offload between a
//! split backward's I and W.

use crate::sequence::{ChunkAt, SequenceState};
use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};

use super::{SavedKind, StageModel, StagePendingWeightGrad, StageSaved};
use crate::error::{KernelError, Result};
use crate::layers::SavedTensorsMut;

/// One tensor's elements in host memory.
#[derive(Debug)]
enum HostData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    U32(Vec<u32>),
}

/// A tensor copied to host memory: its element type, shape and elements.
#[derive(Debug)]
struct HostTensor {
    dims: Vec<usize>,
    data: HostData,
}

impl HostTensor {
    fn copy_of(tensor: &Tensor) -> Result<HostTensor> {
        let copy = KernelError::backend("copy to host");
        let flat = tensor
            .flatten_all()
            .map_err(KernelError::backend("copy to host"))?;
        let data = match tensor.dtype() {
            DType::F32 => HostData::F32(flat.to_vec1().map_err(copy)?),
            DType::F64 => HostData::F64(flat.to_vec1().map_err(copy)?),
            DType::U32 => HostData::U32(flat.to_vec1().map_err(copy)?),
            other => {
                return Err(KernelError::InvalidArgument {
                    field: "saved state",
                    value: format!("{other:?}"),
                    reason: "offload copies F32, F64 and U32 tensors",
                })
            }
        };
        Ok(HostTensor {
            dims: tensor.dims().to_vec(),
            data,
        })
    }

    fn bytes(&self) -> usize {
        match &self.data {
            HostData::F32(v) => v.len() * 4,
            HostData::F64(v) => v.len() * 8,
            HostData::U32(v) => v.len() * 4,
        }
    }

    fn to_device(&self, device: &Device) -> Result<Tensor> {
        let dims = self.dims.as_slice();
        let tensor = match &self.data {
            HostData::F32(v) => Tensor::from_slice(v, dims, device),
            HostData::F64(v) => Tensor::from_slice(v, dims, device),
            HostData::U32(v) => Tensor::from_slice(v, dims, device),
        };
        tensor.map_err(KernelError::backend("copy to device"))
    }
}

/// A state in host memory: its structure with placeholders where the tensors were, and the
/// tensors' copies.
#[derive(Debug)]
pub struct HostCopy<T> {
    shell: T,
    /// The distinct tensors' copies.
    copies: Vec<HostTensor>,
    /// Per tensor slot of the shell (in [`SavedTensorsMut`] order), the copy it takes.
    slots: Vec<usize>,
    device: Device,
}

/// A forward's saved state in host memory.
pub type HostSaved = HostCopy<StageSaved>;

/// An input-gradient backward's state for the weight gradient in host memory.
pub type HostPending = HostCopy<StagePendingWeightGrad>;

impl<T> HostCopy<T> {
    /// Bytes the copies take in host memory.
    pub fn bytes(&self) -> usize {
        self.copies.iter().map(HostTensor::bytes).sum()
    }
}

impl HostSaved {
    /// Copies the state back to the device it came from.
    pub fn to_device(self) -> Result<StageSaved> {
        back_to_device(self)
    }
}

impl HostPending {
    /// Copies the state back to the device it came from.
    pub fn to_device(self) -> Result<StagePendingWeightGrad> {
        back_to_device(self)
    }
}

/// Copies every distinct tensor of `state` to host memory and releases its device tensors.
fn to_host_copy<T: SavedTensorsMut>(mut state: T) -> Result<HostCopy<T>> {
    let mut copies = Vec::new();
    let mut slots = Vec::new();
    let mut seen: HashMap<candle_core::TensorId, usize> = HashMap::new();
    let mut device = Device::Cpu;
    let placeholder =
        Tensor::zeros(0, DType::F32, &Device::Cpu).map_err(KernelError::backend("copy to host"))?;
    let mut tensors = Vec::new();
    state.tensors_mut(&mut tensors);
    for tensor in tensors {
        device = tensor.device().clone();
        let copy = match seen.get(&tensor.id()) {
            Some(&k) => k,
            None => {
                copies.push(HostTensor::copy_of(tensor)?);
                seen.insert(tensor.id(), copies.len() - 1);
                copies.len() - 1
            }
        };
        slots.push(copy);
        *tensor = placeholder.clone();
    }
    Ok(HostCopy {
        shell: state,
        copies,
        slots,
        device,
    })
}

/// The state of `copy` on its device again, tensors shared as they were.
fn back_to_device<T: SavedTensorsMut>(copy: HostCopy<T>) -> Result<T> {
    let HostCopy {
        mut shell,
        copies,
        slots,
        device,
    } = copy;
    let restored = copies
        .iter()
        .map(|c| c.to_device(&device))
        .collect::<Result<Vec<_>>>()?;
    let mut tensors = Vec::new();
    shell.tensors_mut(&mut tensors);
    for (tensor, &copy) in tensors.into_iter().zip(&slots) {
        *tensor = restored[copy].clone();
    }
    Ok(shell)
}

impl StagePendingWeightGrad {
    /// Copies the state to host memory and releases its device tensors.
    pub fn to_host(self) -> Result<HostPending> {
        to_host_copy(self)
    }
}

impl StageSaved {
    /// Whether the state holds only the stage input (a dropped forward, or recompute mode).
    pub fn is_checkpoint(&self) -> bool {
        matches!(self.kind, SavedKind::InputOnly(_))
    }

    /// Copies the state to host memory and releases its device tensors.
    pub fn to_host(self) -> Result<HostSaved> {
        to_host_copy(self)
    }
}

impl StageModel {
    /// What a forward of `input` keeps when its pair is recomputed: the input alone.
    pub fn checkpoint(&self, input: &Tensor) -> StageSaved {
        StageSaved {
            kind: SavedKind::InputOnly(input.clone()),
        }
    }

    /// The full saved state from a checkpoint, by running the forward again (a full state comes
    /// back as it is).
    pub fn recompute_state(&self, saved: StageSaved) -> Result<StageSaved> {
        self.recompute_state_in(saved, None)
    }

    /// [`StageModel::recompute_state`] of a sequence chunk at `at`, its group's earlier chunks'
    /// keys and values read from `state` (its own kept there since its forward).
    pub fn recompute_chunk_state(
        &self,
        saved: StageSaved,
        at: ChunkAt,
        state: &mut SequenceState,
    ) -> Result<StageSaved> {
        self.recompute_state_in(saved, Some((at, state)))
    }

    fn recompute_state_in(
        &self,
        saved: StageSaved,
        chunk: Option<(ChunkAt, &mut SequenceState)>,
    ) -> Result<StageSaved> {
        match saved.kind {
            SavedKind::InputOnly(input) => {
                let (_, states) = self.run_layers(&input, true, chunk)?;
                Ok(StageSaved {
                    kind: SavedKind::Full(states),
                })
            }
            full @ SavedKind::Full(_) => Ok(StageSaved { kind: full }),
        }
    }
}
