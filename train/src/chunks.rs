//! Sequence chunks in the trainer (a plan of `seq_split`, Seq1F1B): which sample group and
//! which part of its sequence a unit of the plan is, and what each stage keeps of a group's
//! earlier chunks while its chunks flow through ([`SequenceState`]).
//!
//! A plan with `k` chunks per group numbers chunk `c` of group `g` `g·k + c`. The step's batch
//! holds the groups; a chunk's tokens are the group's sequence between the problem's chunk
//! boundaries, rounded to whole tokens of that sequence's length (variable-length microbatches
//! split at their own length). The key of a chunk's loss and gradients is `key(g)·k + c`, so
//! that the sums run in one order whatever the schedule.

use crate::error::TrainError;
use candle_core::Tensor;
use pipeweave_backends::StageError;
use pipeweave_core::{Problem, StageId, Work};
use pipeweave_kernels::{ChunkAt, SequenceState};
use std::collections::HashMap;

/// A plan's sequence chunks and the stages' memory of each group's earlier chunks.
#[derive(Debug, Default)]
pub struct SequenceChunks {
    chunks: u32,
    bounds: Vec<f64>,
    states: HashMap<(StageId, u32), SequenceState>,
}

impl SequenceChunks {
    /// The chunks of `problem` (one per group where its sequences are whole).
    pub fn of(problem: &Problem) -> SequenceChunks {
        SequenceChunks {
            chunks: problem.seq_chunks(),
            bounds: problem.seq_bounds(),
            states: HashMap::new(),
        }
    }

    /// Whether the sequences are split.
    pub fn split(&self) -> bool {
        self.chunks > 1
    }

    /// The sample group of `work`'s unit (its index among this replica's microbatches).
    pub fn group(&self, work: Work) -> u32 {
        work.microbatch.get() / self.chunks.max(1)
    }

    /// The key of `work`'s loss and gradients, given its group's key.
    pub fn key(&self, work: Work, group_key: u32) -> u32 {
        let k = self.chunks.max(1);
        group_key * k + work.microbatch.get() % k
    }

    /// Where `work`'s chunk sits in its group's sequence of `tokens` tokens, and its length;
    /// None where the sequences are whole.
    pub fn at(&self, work: Work, tokens: usize) -> Result<Option<(ChunkAt, usize)>, StageError> {
        if !self.split() {
            return Ok(None);
        }
        let bounds = pipeweave_core::SequenceCut::on_tokens(
            &self.bounds,
            u32::try_from(tokens).unwrap_or(u32::MAX),
        )
        .map_err(|e| {
            StageError::bad_input(format!(
                "microbatch {} of {tokens} tokens cannot be split: {e}",
                self.group(work)
            ))
        })?;
        let index = (work.microbatch.get() % self.chunks) as usize;
        let (start, end) = (bounds[index] as usize, bounds[index + 1] as usize);
        Ok(Some((ChunkAt { index, start }, end - start)))
    }

    /// The positions `at.start .. at.start + len` of a `[B, T, ..]` tensor of the group.
    pub fn narrow(tensor: &Tensor, at: ChunkAt, len: usize) -> Result<Tensor, StageError> {
        tensor
            .narrow(1, at.start, len)
            .and_then(|t| t.contiguous())
            .map_err(|e| StageError::bug(format!("cutting chunk {} of a sequence: {e}", at.index)))
    }

    /// What `stage` keeps of `work`'s group's earlier chunks (made for a stage of `layers`
    /// layers at the group's first chunk).
    pub fn state(&mut self, work: Work, layers: usize) -> &mut SequenceState {
        let group = self.group(work);
        self.states
            .entry((work.stage, group))
            .or_insert_with(|| SequenceState::new(layers))
    }

    /// Forgets `work`'s group on its stage (after its first chunk's backward, or its last
    /// chunk's forward without a backward): an error where a chunk's memory is left over.
    pub fn finish(&mut self, work: Work, forward_only: bool) -> Result<(), StageError> {
        let group = self.group(work);
        if let Some(state) = self.states.remove(&(work.stage, group)) {
            if !forward_only && !state.is_empty() {
                return Err(StageError::bug(format!(
                    "stage {} microbatch {group}: a chunk's keys and values outlived its backward",
                    work.stage
                )));
            }
        }
        Ok(())
    }

    /// Whether `work` is its group's last chunk.
    pub fn is_last(&self, work: Work) -> bool {
        let k = self.chunks.max(1);
        work.microbatch.get() % k == k - 1
    }
}

/// Refuses a plan whose sequences the trainer cannot split at `seq_len` tokens.
pub fn check_plan(problem: &Problem, seq_len: usize) -> Result<(), TrainError> {
    if problem.is_seq_split() {
        let tokens = u32::try_from(seq_len).unwrap_or(u32::MAX);
        problem.seq_token_bounds(tokens).map_err(|e| {
            TrainError::invalid("--seq-len", seq_len, format!("the schedule's {e}"))
        })?;
    }
    Ok(())
}
