//! The seeded loader of global batches (see [`super`]'s order): the batch's sizes
//! ([`BatchShape`]), where the loader stands ([`DataPosition`]), a step's [`GlobalBatch`] and the
//! [`Loader`] with its per-epoch Fisher-Yates shuffle.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use pipeweave_kernels::init::SplitMix64;
use serde::{Deserialize, Serialize};

use super::window_count;
use super::windows::window_len;
use crate::batch::PAD_ID;
use crate::documents::{pieces, Piece};
use crate::error::{Result, TrainError};

/// The sizes of a global batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchShape {
    /// Tokens per sequence, `T`.
    pub seq_len: usize,
    /// Sequences per microbatch, `B`.
    pub microbatch_size: usize,
    /// Microbatches per step over all data-parallel replicas, `D * M`.
    pub global_microbatches: usize,
}

impl BatchShape {
    /// A shape whose sizes are all positive.
    pub fn new(seq_len: usize, microbatch_size: usize, global_microbatches: usize) -> Result<Self> {
        let positive = |field: &'static str, value: usize| match value {
            0 => Err(TrainError::invalid(field, 0, "must be positive")),
            _ => Ok(()),
        };
        positive("seq_len", seq_len)?;
        positive("microbatch_size", microbatch_size)?;
        positive("global_microbatches", global_microbatches)?;
        let shape = BatchShape {
            seq_len,
            microbatch_size,
            global_microbatches,
        };
        shape.sequences_per_step()?;
        Ok(shape)
    }

    /// Sequences in a global batch, `D * M * B`.
    pub fn sequences_per_step(&self) -> Result<usize> {
        self.global_microbatches
            .checked_mul(self.microbatch_size)
            .ok_or_else(|| {
                TrainError::invalid("microbatch_size", self.microbatch_size, "overflows a step")
            })
    }

    /// Tokens (targets) in a microbatch, `B * T`.
    pub fn microbatch_tokens(&self) -> usize {
        self.microbatch_size.saturating_mul(self.seq_len)
    }
}

/// Where the loader stands: the epoch, and how many of its windows have been taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DataPosition {
    /// The epoch (0 first).
    pub epoch: u64,
    /// Windows of the epoch already taken.
    pub cursor: u64,
}

/// One step's data: per microbatch, `B * T` input ids and `B * T` target ids, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalBatch {
    /// Input ids per microbatch, in microbatch order.
    pub inputs: Vec<Vec<u32>>,
    /// Target ids per microbatch (the next byte of each input).
    pub targets: Vec<Vec<u32>>,
    /// Sequences per microbatch, `B`.
    pub microbatch_size: usize,
    /// Tokens per sequence, `T`: every microbatch's, or with variable lengths the most a
    /// microbatch may have (each has `ids / microbatch_size`).
    pub seq_len: usize,
}

impl GlobalBatch {
    /// Tokens per sequence of each microbatch (its ids over `microbatch_size`).
    pub fn microbatch_lengths(&self) -> Vec<usize> {
        self.inputs
            .iter()
            .map(|ids| ids.len() / self.microbatch_size.max(1))
            .collect()
    }

    /// The part of data-parallel replica `d` when each replica takes `m` microbatches:
    /// microbatches `d*m .. (d+1)*m`.
    pub fn replica(&self, d: usize, m: usize) -> Result<GlobalBatch> {
        let range = d
            .checked_mul(m)
            .and_then(|start| Some(start..start.checked_add(m)?))
            .filter(|r| m > 0 && r.end <= self.inputs.len())
            .ok_or_else(|| {
                let reason = format!("with {m} microbatches each, beyond the global batch");
                TrainError::invalid("replica", d, reason)
            })?;
        Ok(GlobalBatch {
            inputs: self.inputs[range.clone()].to_vec(),
            targets: self.targets[range].to_vec(),
            ..*self
        })
    }
}

/// Draws global batches of windows from training bytes, in a seeded order.
#[derive(Debug, Clone)]
pub struct Loader {
    bytes: Arc<[u8]>,
    shape: BatchShape,
    seed: u64,
    windows: usize,
    /// Variable-length sequences cut at document boundaries; `None`: windows of `seq_len + 1`
    /// bytes at stride `seq_len` across the whole text.
    pieces: Option<Vec<Piece>>,
    order: Option<(u64, Vec<usize>)>,
}

impl Loader {
    /// A loader of `shape` batches over `bytes` (the training part), ordered by `seed`; fails
    /// unless the bytes hold at least one window.
    pub fn new(bytes: impl Into<Arc<[u8]>>, shape: BatchShape, seed: u64) -> Result<Loader> {
        let bytes = bytes.into();
        let window = window_len(shape.seq_len)?;
        shape.sequences_per_step()?;
        let windows = window_count(bytes.len(), shape.seq_len);
        if windows == 0 {
            return Err(TrainError::DataTooShort {
                origin: PathBuf::from("training data"),
                bytes: bytes.len(),
                needed: window,
                why: format!("one sequence of seq_len + 1 = {window} bytes"),
            });
        }
        Ok(Loader {
            bytes,
            shape,
            seed,
            windows,
            pieces: None,
            order: None,
        })
    }

    /// A loader of variable-length microbatches over `bytes`: the `documents` (byte ranges;
    /// clipped to `bytes`) cut into sequences of at most `shape.seq_len` tokens that never cross
    /// a document boundary, shuffled by `seed`, `shape.microbatch_size` to a microbatch, each
    /// microbatch as long as its longest sequence (shorter ones padded: inputs with byte 0,
    /// targets with [`crate::PAD_ID`]).
    pub fn variable(
        bytes: impl Into<Arc<[u8]>>,
        documents: &[Range<usize>],
        shape: BatchShape,
        seed: u64,
    ) -> Result<Loader> {
        let bytes = bytes.into();
        window_len(shape.seq_len)?;
        shape.sequences_per_step()?;
        let pieces = pieces(documents, bytes.len(), shape.seq_len);
        if pieces.is_empty() {
            return Err(TrainError::DataTooShort {
                origin: PathBuf::from("training data"),
                bytes: bytes.len(),
                needed: 2,
                why: "a document of at least 2 bytes (one input and its target)".to_string(),
            });
        }
        Ok(Loader {
            bytes,
            shape,
            seed,
            windows: pieces.len(),
            pieces: Some(pieces),
            order: None,
        })
    }

    /// The batch shape.
    pub fn shape(&self) -> BatchShape {
        self.shape
    }

    /// The number of windows in an epoch.
    pub fn windows_per_epoch(&self) -> usize {
        self.windows
    }

    /// The position after `steps` steps from the start.
    pub fn position_after(&self, steps: u64) -> DataPosition {
        let per_step = self.shape.sequences_per_step().unwrap_or(usize::MAX) as u128;
        let taken = per_step * u128::from(steps);
        let windows = self.windows as u128;
        DataPosition {
            epoch: u64::try_from(taken / windows).unwrap_or(u64::MAX),
            cursor: (taken % windows) as u64,
        }
    }

    /// The batch of the step after `steps` completed steps (the first step is
    /// `batch_for_step(0)`).
    pub fn batch_for_step(&mut self, steps: u64) -> Result<GlobalBatch> {
        let position = self.position_after(steps);
        Ok(self.batch_at(position)?.0)
    }

    /// The batch drawn at `position`, and the position after it.
    pub fn batch_at(&mut self, position: DataPosition) -> Result<(GlobalBatch, DataPosition)> {
        let cursor = usize::try_from(position.cursor).unwrap_or(usize::MAX);
        if cursor >= self.windows {
            let reason = format!("an epoch has only {} windows", self.windows);
            return Err(TrainError::invalid("data cursor", cursor, reason));
        }
        let (mut epoch, mut cursor) = (position.epoch, cursor);
        let (sequences, seq_len) = (self.shape.sequences_per_step()?, self.shape.seq_len);
        let mut picked = Vec::with_capacity(sequences);
        while picked.len() < sequences {
            let order = self.order_of(epoch);
            let epoch_len = order.len();
            let take = (sequences - picked.len()).min(epoch_len - cursor);
            let chosen: Vec<usize> = order[cursor..cursor + take].to_vec();
            picked.extend(chosen.into_iter().map(|w| match &self.pieces {
                Some(pieces) => pieces[w],
                None => Piece {
                    start: w * seq_len,
                    len: seq_len + 1,
                },
            }));
            cursor += take;
            if cursor == epoch_len {
                (epoch, cursor) = (epoch.saturating_add(1), 0);
            }
        }
        let next = DataPosition {
            epoch,
            cursor: cursor as u64,
        };
        Ok((self.assemble(&picked), next))
    }

    /// The shuffled window indices of `epoch` (cached for the latest epoch asked).
    fn order_of(&mut self, epoch: u64) -> &[usize] {
        if self.order.as_ref().map(|(e, _)| *e) != Some(epoch) {
            let order = shuffled(self.windows, epoch_seed(self.seed, epoch));
            self.order = Some((epoch, order));
        }
        self.order
            .as_ref()
            .map(|(_, o)| o.as_slice())
            .unwrap_or(&[])
    }

    /// Groups the sequences `picked` into microbatches, each as long as its longest sequence
    /// (all `seq_len` long without variable lengths: no padding there).
    fn assemble(&self, picked: &[Piece]) -> GlobalBatch {
        let chunks = picked.chunks(self.shape.microbatch_size);
        let (inputs, targets) = chunks
            .map(|chunk| {
                let t = chunk.iter().map(Piece::tokens).max().unwrap_or(0);
                let mut input = Vec::with_capacity(chunk.len() * t);
                let mut target = Vec::with_capacity(chunk.len() * t);
                for piece in chunk {
                    let bytes = &self.bytes[piece.start..piece.start + piece.len];
                    let n = piece.tokens();
                    input.extend(bytes[..n].iter().map(|&b| u32::from(b)));
                    input.extend(std::iter::repeat_n(0, t - n));
                    target.extend(bytes[1..].iter().map(|&b| u32::from(b)));
                    target.extend(std::iter::repeat_n(PAD_ID, t - n));
                }
                (input, target)
            })
            .unzip();
        GlobalBatch {
            inputs,
            targets,
            microbatch_size: self.shape.microbatch_size,
            seq_len: self.shape.seq_len,
        }
    }
}

/// The seed of an epoch's shuffle, mixed from the run's seed and the epoch.
fn epoch_seed(seed: u64, epoch: u64) -> u64 {
    const DATA_DOMAIN: u64 = 0x6461_7461_6f72_6465; // "dataorde"
    let mut mixer = SplitMix64::new(seed ^ DATA_DOMAIN);
    let key = mixer.next_u64();
    SplitMix64::new(key ^ epoch.wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
}

/// `0..n` in a Fisher-Yates shuffle driven by SplitMix64 from `seed` (the same on every
/// machine: integer arithmetic only).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        // A draw from 0..=i by multiply-high (bias below (i + 1) / 2^64).
        let j = ((u128::from(rng.next_u64()) * (i as u128 + 1)) >> 64) as usize;
        order.swap(i, j);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(t: usize, b: usize, g: usize) -> BatchShape {
        BatchShape::new(t, b, g).unwrap()
    }

    #[test]
    fn batches_have_the_shape_and_next_byte_targets() {
        let text: Vec<u8> = (0..=200u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(4, 2, 3), 7).unwrap();
        let batch = loader.batch_for_step(0).unwrap();
        assert_eq!(batch.inputs.len(), 3);
        for (input, target) in batch.inputs.iter().zip(&batch.targets) {
            assert_eq!((input.len(), target.len()), (8, 8));
            for row in 0..2 {
                let (i, t) = (&input[row * 4..row * 4 + 4], &target[row * 4..row * 4 + 4]);
                assert_eq!(i[0] % 4, 0, "windows start at multiples of seq_len");
                assert!(i.iter().zip(t).all(|(a, b)| a + 1 == *b));
            }
        }
    }

    #[test]
    fn an_epoch_takes_every_window_once_then_reshuffles() {
        let text: Vec<u8> = (0..=24u8).collect(); // 6 windows of 5 bytes at stride 4
        let mut loader = Loader::new(text.as_slice(), shape(4, 1, 3), 1).unwrap();
        assert_eq!(loader.windows_per_epoch(), 6);
        let first = |b: &GlobalBatch| b.inputs.iter().map(|i| i[0]).collect::<Vec<_>>();
        let mut epoch0: Vec<u32> = [0, 1]
            .iter()
            .flat_map(|&k| first(&loader.batch_for_step(k).unwrap()))
            .collect();
        let epoch1: Vec<u32> = [2, 3]
            .iter()
            .flat_map(|&k| first(&loader.batch_for_step(k).unwrap()))
            .collect();
        assert_ne!(epoch0, epoch1, "each epoch has its own order");
        epoch0.sort();
        assert_eq!(epoch0, vec![0, 4, 8, 12, 16, 20]);
    }

    #[test]
    fn a_resumed_loader_draws_the_same_batches() {
        let text: Vec<u8> = (0..=250u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(5, 3, 4), 42).unwrap(); // 50 windows
        let mut position = DataPosition::default();
        let mut sequential = Vec::new();
        for _ in 0..10 {
            let (batch, next) = loader.batch_at(position).unwrap();
            sequential.push(batch);
            position = next;
        }
        assert_eq!(position, loader.position_after(10));
        assert_eq!(
            position,
            DataPosition {
                epoch: 2,
                cursor: 20
            }
        );
        let json = serde_json::to_string(&loader.position_after(7)).unwrap();
        let resumed: DataPosition = serde_json::from_str(&json).unwrap();
        let mut fresh = Loader::new(text.as_slice(), shape(5, 3, 4), 42).unwrap();
        assert_eq!(fresh.batch_at(resumed).unwrap().0, sequential[7]);
        for (k, batch) in sequential.iter().enumerate().rev() {
            assert_eq!(&fresh.batch_for_step(k as u64).unwrap(), batch);
        }
        let mut other_seed = Loader::new(text.as_slice(), shape(5, 3, 4), 43).unwrap();
        assert_ne!(other_seed.batch_for_step(0).unwrap(), sequential[0]);
    }

    #[test]
    fn a_step_larger_than_an_epoch_runs_through_several() {
        let text: Vec<u8> = (0..=8u8).collect(); // 2 windows at stride 4
        let mut loader = Loader::new(text.as_slice(), shape(4, 5, 1), 3).unwrap();
        let (batch, next) = loader.batch_at(DataPosition::default()).unwrap();
        assert_eq!(batch.inputs[0].len(), 20);
        assert_eq!(
            next,
            DataPosition {
                epoch: 2,
                cursor: 1
            }
        );
        assert_eq!(next, loader.position_after(1));
    }

    #[test]
    fn replica_d_takes_microbatches_d_m_to_d_plus_one_m() {
        let text: Vec<u8> = (0..=100u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(4, 1, 6), 0).unwrap();
        let batch = loader.batch_for_step(0).unwrap();
        let replica = batch.replica(1, 3).unwrap();
        assert_eq!(replica.inputs, &batch.inputs[3..6]);
        assert_eq!(replica.targets, &batch.targets[3..6]);
        assert!(batch.replica(2, 3).is_err());
        assert!(batch.replica(0, 0).is_err());
    }

    #[test]
    fn bad_positions_and_shapes_are_refused() {
        let text: Vec<u8> = (0..=20u8).collect();
        let mut loader = Loader::new(text.as_slice(), shape(4, 1, 1), 0).unwrap();
        let bad = DataPosition {
            epoch: 0,
            cursor: 5,
        };
        assert!(loader.batch_at(bad).is_err());
        assert!(BatchShape::new(4, 0, 1).is_err());
        assert!(Loader::new(&b"abcd"[..], shape(4, 1, 1), 0).is_err());
    }
}
