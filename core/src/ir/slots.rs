//! The one dense numbering of ops and of (stage, microbatch) pairs, used by every table indexed by
//! op (the verifier's, the replay engine's, the projection's, the checker's).
//!
//! Stage-major: a rank walks its own stages' microbatches in order, so its ops sit close together
//! in every such table.

use crate::ir::ids::{MicrobatchId, StageId};
use crate::ir::op::Op;
use crate::ir::problem::Problem;

/// The numbering of a problem's ops: `((stage · M) + microbatch) · 3 + kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSlots {
    stages: usize,
    microbatches: usize,
}

impl OpSlots {
    /// The numbering of `problem`'s ops.
    pub fn of(problem: &Problem) -> OpSlots {
        OpSlots {
            stages: problem.stages() as usize,
            microbatches: problem.microbatches() as usize,
        }
    }

    /// Number of (stage, microbatch) pairs, whether on a route or not.
    pub fn pairs(self) -> usize {
        self.stages * self.microbatches
    }

    /// Size of a table indexed by op.
    pub fn len(self) -> usize {
        self.pairs() * 3
    }

    /// Whether the problem has no op at all (never for a validated problem).
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Dense index of a (stage, microbatch) pair, or None when out of range.
    pub fn pair(self, stage: StageId, microbatch: MicrobatchId) -> Option<usize> {
        (stage.index() < self.stages && microbatch.index() < self.microbatches)
            .then(|| stage.index() * self.microbatches + microbatch.index())
    }

    /// Dense index of an op, or None when its stage or microbatch is out of range.
    pub fn op(self, op: Op) -> Option<usize> {
        self.pair(op.stage, op.microbatch)
            .map(|pair| pair * 3 + op.kind.index())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::op::OpKind;
    use crate::ir::problem::ProblemSpec;

    #[test]
    fn slots_are_dense_and_stage_major() {
        let problem = ProblemSpec::builder()
            .ranks(2)
            .microbatches(3)
            .build()
            .validate()
            .unwrap();
        let slots = OpSlots::of(&problem);
        assert_eq!(slots.len(), 18);
        let op = |kind, s, m| Op::new(kind, StageId::new(s), MicrobatchId::new(m));
        assert_eq!(slots.op(op(OpKind::Forward, 0, 0)), Some(0));
        assert_eq!(slots.op(op(OpKind::WeightGrad, 0, 2)), Some(8));
        assert_eq!(slots.op(op(OpKind::Forward, 1, 0)), Some(9));
        assert_eq!(slots.op(op(OpKind::Forward, 2, 0)), None);
        assert_eq!(slots.op(op(OpKind::Forward, 0, 3)), None);
    }
}
