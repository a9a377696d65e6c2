//! The sequence-chunk rule for list schedulers that track when each input gradient is ready
//! ([`crate::schedules::greedy`]): on a problem with sequence chunks (Seq1F1B), chunk `c - 1`'s
//! I on a stage also waits for chunk `c`'s I on that stage (the gradients of the keys and values
//! chunk `c` read). A scheduler offers each I when its other inputs are known; the gate holds
//! it until the later chunk's I has ended, then hands it back with the later of the two times.
//! Forwards need no gate: a stage's forwards run in microbatch order, so chunk `c - 1`'s F has
//! ended on that rank before chunk `c`'s starts.

use pipeweave_core::{Plan, Work};

/// Per (stage, microbatch): when the I's other inputs are known and when the I ended (NaN:
/// not yet). Empty without sequence chunks, where it passes every offer through.
pub struct ChunkGate {
    chunks: u32,
    microbatches: usize,
    /// When the I's own inputs (its F, the next stage's I) are known, if it is held.
    held: Vec<f64>,
    /// When the I ended.
    ended: Vec<f64>,
}

impl ChunkGate {
    /// The gate of `plan`'s problem.
    pub fn new(plan: &Plan) -> ChunkGate {
        let problem = plan.problem();
        let chunks = problem.seq_chunks();
        let microbatches = problem.microbatches() as usize;
        let pairs = if chunks > 1 {
            problem.stages() as usize * microbatches
        } else {
            0
        };
        ChunkGate {
            chunks,
            microbatches,
            held: vec![f64::NAN; pairs],
            ended: vec![f64::NAN; pairs],
        }
    }

    fn index(&self, work: Work) -> usize {
        work.stage.index() * self.microbatches + work.microbatch.index()
    }

    /// The I of `work`, whose other inputs are known at `at`: the time it is ready, or None
    /// while it waits for its later chunk's I (then [`ChunkGate::ended`] releases it).
    pub fn offer(&mut self, work: Work, at: f64) -> Option<f64> {
        if self.chunks <= 1 || work.microbatch.get() % self.chunks == self.chunks - 1 {
            return Some(at);
        }
        let later = self.index(work) + 1;
        match self.ended[later] {
            end if end.is_nan() => {
                let own = self.index(work);
                self.held[own] = at;
                None
            }
            end => Some(at.max(end)),
        }
    }

    /// Records that the I of `work` ended at `end`: the earlier chunk's I on the same stage with
    /// the time it is ready, where it was held for this one.
    pub fn ended(&mut self, work: Work, end: f64) -> Option<(Work, f64)> {
        if self.chunks <= 1 {
            return None;
        }
        let own = self.index(work);
        self.ended[own] = end;
        if work.microbatch.get() % self.chunks == 0 {
            return None;
        }
        let held = std::mem::replace(&mut self.held[own - 1], f64::NAN);
        (!held.is_nan()).then(|| {
            let earlier = Work::new(work.stage.get(), work.microbatch.get() - 1);
            (earlier, held.max(end))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pipeweave_core::{CostModel, MemoryModel, Problem, ProblemSpec};

    fn plan(chunks: u32) -> Plan {
        let problem: Problem = ProblemSpec::builder()
            .ranks(2)
            .microbatches(4)
            .seq_chunks(chunks)
            .build()
            .validate()
            .unwrap();
        let costs = CostModel::uniform(2, Default::default(), 0.0).unwrap();
        let memory = MemoryModel::uniform(2, Default::default());
        Plan::unscheduled(problem, costs, memory).unwrap()
    }

    #[test]
    fn an_earlier_chunk_waits_for_the_later_ones_input_gradient() {
        let mut gate = ChunkGate::new(&plan(2));
        let (c0, c1) = (Work::new(1, 0), Work::new(1, 1));
        assert_eq!(
            gate.offer(c1, 2.0),
            Some(2.0),
            "the last chunk waits for nothing"
        );
        assert_eq!(gate.offer(c0, 1.0), None, "chunk 1's I has not ended");
        assert_eq!(gate.ended(c1, 3.0), Some((c0, 3.0)));
        // Offered after the later chunk ended: ready at the later of the two times.
        let (d0, d1) = (Work::new(1, 2), Work::new(1, 3));
        assert_eq!(gate.ended(d1, 5.0), None);
        assert_eq!(gate.offer(d0, 4.0), Some(5.0));
        assert_eq!(gate.offer(d0, 6.0), Some(6.0));
    }

    #[test]
    fn without_chunks_every_offer_passes() {
        let mut gate = ChunkGate::new(&plan(1));
        assert_eq!(gate.offer(Work::new(0, 0), 1.5), Some(1.5));
        assert_eq!(gate.ended(Work::new(0, 1), 2.0), None);
    }
}
