//! What a step feeds a rank's stages: each microbatch's input ids and targets from the step's
//! batch (at the replica's offset in the global batch, cut to a sequence chunk's positions where
//! the plan splits sequences) and the loss of the last stage's logits against the targets,
//! normalised by the global batch's token count ([`crate::batch`]).

use super::faults::kernel_failure;
use crate::batch::{StepBatch, PAD_ID};
use crate::chunks::SequenceChunks;
use candle_core::Tensor;
use pipeweave_backends::StageError;
use pipeweave_core::Work;
use pipeweave_kernels::{ChunkAt, CrossEntropy, LossOutput, Primitives};
use std::sync::Arc;

/// A step's batch as one data-parallel replica's rank reads it.
pub(crate) struct StepFeed {
    batch: Arc<StepBatch>,
    cross_entropy: CrossEntropy,
    /// The global index of this replica's microbatch 0 (data parallelism: replica `d` of `D`
    /// runs microbatches `d M .. (d + 1) M` of the global batch).
    offset: u32,
    /// The plan's sequence chunks (a `seq_split` plan) and each stage's memory of its groups'
    /// earlier chunks.
    chunks: SequenceChunks,
}

impl StepFeed {
    /// `batch` read from its microbatch 0, in the plan's `chunks`.
    pub(crate) fn new(batch: Arc<StepBatch>, chunks: SequenceChunks) -> StepFeed {
        StepFeed {
            batch,
            cross_entropy: CrossEntropy::new(Some(PAD_ID)),
            offset: 0,
            chunks,
        }
    }

    /// Reads the global batch's microbatches from `offset` on.
    pub(crate) fn set_offset(&mut self, offset: u32) {
        self.offset = offset;
    }

    /// The plan's sequence chunks.
    pub(crate) fn chunks(&mut self) -> &mut SequenceChunks {
        &mut self.chunks
    }

    /// The global index in the step's batch of `work`'s microbatch (of its sample group where
    /// the sequences are split into chunks).
    fn global(&self, work: Work) -> u32 {
        self.offset + self.chunks.group(work)
    }

    /// The data microbatch `work`'s slot holds (with sequence chunks, its group's and its
    /// chunk): the key of deterministic sums.
    pub(crate) fn data_id(&self, work: Work) -> u32 {
        let global = self.global(work);
        let group = self.batch.data_id(global as usize).unwrap_or(global);
        self.chunks.key(work, group)
    }

    /// Where `work`'s chunk sits in its group's sequence and its length (None: whole
    /// sequences), from the group's input.
    pub(crate) fn chunk_at(&self, work: Work) -> Result<Option<(ChunkAt, usize)>, StageError> {
        if !self.chunks.split() {
            return Ok(None);
        }
        let input = self.entry(work, "input", StepBatch::input)?;
        let tokens = input.dims().get(1).copied().unwrap_or(0);
        self.chunks.at(work, tokens)
    }

    /// The `what` (`input`, `targets`) of `work`'s microbatch in the step's batch, by `pick`,
    /// cut to `chunk`.
    fn cut(
        &self,
        work: Work,
        what: &str,
        pick: fn(&StepBatch, usize) -> Option<&Tensor>,
        chunk: Option<(ChunkAt, usize)>,
    ) -> Result<Tensor, StageError> {
        let whole = self.entry(work, what, pick)?;
        match chunk {
            Some((at, len)) => SequenceChunks::narrow(whole, at, len),
            None => Ok(whole.clone()),
        }
    }

    fn entry(
        &self,
        work: Work,
        what: &str,
        pick: fn(&StepBatch, usize) -> Option<&Tensor>,
    ) -> Result<&Tensor, StageError> {
        pick(&self.batch, self.global(work) as usize).ok_or_else(|| {
            StageError::bug(format!(
                "the batch has no {what} for microbatch {}",
                work.microbatch
            ))
        })
    }

    /// The input ids of `work`'s microbatch (of its `chunk`).
    pub(crate) fn input(
        &self,
        work: Work,
        chunk: Option<(ChunkAt, usize)>,
    ) -> Result<Tensor, StageError> {
        self.cut(work, "input", StepBatch::input, chunk)
    }

    /// The cross-entropy of `logits` against `work`'s targets, through `ops`, and its gradient.
    pub(crate) fn loss(
        &self,
        ops: &dyn Primitives,
        work: Work,
        logits: &Tensor,
    ) -> Result<LossOutput, StageError> {
        let targets = self.cut(work, "targets", StepBatch::target, self.chunk_at(work)?)?;
        self.cross_entropy
            .loss_and_grad(ops, logits, &targets, self.batch.normalizer())
            .map_err(kernel_failure(work, "loss"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_kernels::CpuPrimitives;

    fn feed(offset: u32) -> StepFeed {
        let inputs: Vec<Vec<u32>> = (0..4).map(|m| vec![m, m + 1]).collect();
        let targets: Vec<Vec<u32>> = (0..4).map(|m| vec![m + 1, PAD_ID]).collect();
        let batch = StepBatch::new(&inputs, &targets, 1, 2, Some(PAD_ID))
            .unwrap()
            .with_data_ids(vec![2, 0, 3, 1])
            .unwrap();
        let mut feed = StepFeed::new(Arc::new(batch), SequenceChunks::default());
        feed.set_offset(offset);
        feed
    }

    #[test]
    fn a_replica_reads_from_its_offset_and_keys_by_data_id() {
        let feed = feed(2);
        let work = Work::new(0, 1);
        assert_eq!(feed.data_id(work), 1);
        assert!(feed.chunk_at(work).unwrap().is_none());
        let input = feed.input(work, None).unwrap();
        assert_eq!(input.to_vec2::<u32>().unwrap(), [[3, 4]]);
        assert!(feed.input(Work::new(0, 2), None).is_err());
    }

    #[test]
    fn the_loss_sums_the_microbatch_and_its_gradient_divides_by_the_batchs_tokens() {
        let feed = feed(0);
        let (cpu, vocab) = (candle_core::Device::Cpu, 257);
        let logits = Tensor::zeros((1, 2, vocab), candle_core::DType::F64, &cpu).unwrap();
        let out = feed
            .loss(&CpuPrimitives::new(), Work::new(0, 0), &logits)
            .unwrap();
        let loss = out.loss_sum.to_scalar::<f64>().unwrap();
        assert_eq!(out.counted_tokens, 1);
        assert!((loss - (vocab as f64).ln()).abs() < 1e-12, "{loss}");
        // Slot 0's one counted target is 1; the whole batch has 4 tokens.
        let grad = out
            .grad_logits
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let expected = (1.0 / vocab as f64 - 1.0) / 4.0;
        assert!((grad[1] - expected).abs() < 1e-12, "{}", grad[1]);
    }
}
