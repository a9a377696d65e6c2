//! Sequence chunks (Seq1F1B): a sample group's sequence cut into chunks that run through a stage
//! one after another, each a unit of the pipeline schedule.
//!
//! Chunk `c` covers positions `start .. start + T_c`. Its forward reads the keys and values of
//! every position before it, which the chunks before it computed; its input-gradient backward
//! sends gradients back to those keys and values, which the earlier chunks' backwards (run after
//! it, last chunk first) add to their own. What a stage's layers keep between the chunks of one
//! group is a [`SequenceState`], one [`ChunkMemory`] per layer: an attention layer's is the
//! `qkv` of every chunk that has run its forward and not yet its backward, and the gradients the
//! later chunks sent back to the positions before them; the other layers keep nothing. Token-wise
//! layers run a chunk as any input; the embedding places it at its positions.
//!
//! The sums are made in one order whatever the schedule (the dependency rule fixes it: chunk
//! `c`'s I after chunk `c + 1`'s), so a schedule that splits the same way gives the same bits.
//! Against the whole sequence the products have other shapes and the key and value gradients
//! another summation order: equal up to rounding.

use candle_core::Tensor;

use crate::error::{KernelError, Result};
use crate::primitives::Primitives;

/// Where a chunk sits in its sequence: its index (0 first) and its first position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkAt {
    /// The chunk's index in its sequence.
    pub index: usize,
    /// The position of its first token.
    pub start: usize,
}

impl ChunkAt {
    /// The whole sequence: chunk 0 at position 0.
    pub const WHOLE: ChunkAt = ChunkAt { index: 0, start: 0 };
}

/// A sequence chunk's place and its layer's memory of the earlier chunks, where a layer runs a
/// chunk (None: a whole sequence).
pub(crate) type Chunk<'a> = Option<(ChunkAt, &'a mut ChunkMemory)>;

/// What one layer keeps of a group's earlier chunks (attention's keys and values, and the
/// gradients later chunks sent back to them); empty for the other layers.
#[derive(Debug, Default)]
pub struct ChunkMemory {
    /// Per chunk that ran its forward and not yet its backward, in order: its `qkv`
    /// `[B, T_c, 3d]`.
    keys_values: Vec<Tensor>,
    /// The gradients of the `qkv` of positions `0..len` the later chunks' backwards sent back,
    /// summed in their order (`[B, len, 3d]`; the query columns zero).
    grad_prefix: Option<Tensor>,
}

impl ChunkMemory {
    /// Records chunk `at.index`'s `qkv` after its forward: the next chunk's, or (a recomputed
    /// forward) the same again. An error where the chunks come out of order.
    pub(crate) fn keep(&mut self, at: ChunkAt, qkv: &Tensor) -> Result<()> {
        match self.keys_values.len() {
            n if n == at.index => self.keys_values.push(qkv.clone()),
            n if n == at.index + 1 => self.keys_values[at.index] = qkv.clone(),
            n => return Err(out_of_order("forward", at, n)),
        }
        Ok(())
    }

    /// The `qkv` of positions `0..` the end of chunk `at.index` (every chunk up to it), for its
    /// forward or backward.
    pub(crate) fn prefix(&self, ops: &dyn Primitives, at: ChunkAt) -> Result<Tensor> {
        let parts = self
            .keys_values
            .get(..=at.index)
            .ok_or_else(|| out_of_order("backward", at, self.keys_values.len()))?;
        match parts {
            [only] => Ok(only.clone()),
            _ => ops.concat_positions(parts),
        }
    }

    /// Splits the gradient `grad_prefix_qkv` of positions `0..end` that chunk `at` computed
    /// (`[B, end, 3d]`) into its own part (positions `start..end`, with what the later chunks
    /// sent back to them added) and the part for the earlier chunks, which it adds to what it
    /// keeps; forgets the chunk's `qkv`. An error where the chunk is not the last kept.
    pub(crate) fn take_gradient(
        &mut self,
        ops: &dyn Primitives,
        at: ChunkAt,
        grad_prefix_qkv: &Tensor,
    ) -> Result<Tensor> {
        if self.keys_values.len() != at.index + 1 {
            return Err(out_of_order("backward", at, self.keys_values.len()));
        }
        let end = grad_prefix_qkv.dims().get(1).copied().unwrap_or(0);
        let len = end
            .checked_sub(at.start)
            .filter(|&len| len > 0)
            .ok_or_else(|| out_of_order("backward", at, self.keys_values.len()))?;
        let own = ops.narrow_positions(grad_prefix_qkv, at.start, len)?;
        let own = match &self.grad_prefix {
            Some(sent) => ops.add(&own, &ops.narrow_positions(sent, at.start, len)?)?,
            None => own,
        };
        self.grad_prefix = if at.start == 0 {
            None
        } else {
            let earlier = ops.narrow_positions(grad_prefix_qkv, 0, at.start)?;
            Some(match &self.grad_prefix {
                Some(sent) => ops.add(&ops.narrow_positions(sent, 0, at.start)?, &earlier)?,
                None => earlier,
            })
        };
        self.keys_values.truncate(at.index);
        Ok(own)
    }

    /// Whether nothing is kept (every chunk's backward ran).
    pub fn is_empty(&self) -> bool {
        self.keys_values.is_empty() && self.grad_prefix.is_none()
    }

    /// Bytes of the tensors kept.
    pub fn held_bytes(&self) -> usize {
        let bytes = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        self.keys_values.iter().map(bytes).sum::<usize>()
            + self.grad_prefix.as_ref().map_or(0, bytes)
    }
}

/// What a stage keeps between the chunks of one sample group: one [`ChunkMemory`] per layer.
#[derive(Debug, Default)]
pub struct SequenceState {
    layers: Vec<ChunkMemory>,
}

impl SequenceState {
    /// The memory of a stage of `layers` layers.
    pub fn new(layers: usize) -> SequenceState {
        SequenceState {
            layers: (0..layers).map(|_| ChunkMemory::default()).collect(),
        }
    }

    /// Per layer, in order.
    pub(crate) fn layers_mut(&mut self) -> &mut [ChunkMemory] {
        &mut self.layers
    }

    /// Whether nothing is kept: every chunk that ran its forward ran its backward.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(ChunkMemory::is_empty)
    }

    /// Bytes of the keys, values and gradients kept for the group's chunks.
    pub fn held_bytes(&self) -> usize {
        self.layers.iter().map(ChunkMemory::held_bytes).sum()
    }
}

fn out_of_order(pass: &'static str, at: ChunkAt, kept: usize) -> KernelError {
    KernelError::InvalidArgument {
        field: "chunk",
        value: format!("{pass} of chunk {} with {kept} chunk(s) kept", at.index),
        reason: "sequence chunks run their forwards in order and their backwards in reverse",
    }
}
