//! The dependency rule between ops, shared by the verifier and the simulator.
//!
//! - F of a microbatch on a stage needs F of that microbatch on the previous stage of its route.
//! - I needs F on the same stage and I on the next stage of the route.
//! - W needs I on the same stage.
//!
//! A full backward (B) is an I and its W; its dependencies are the I's.

use crate::ir::op::{Op, OpKind};
use crate::ir::problem::Problem;
use smallvec::{smallvec, SmallVec};

/// The ops `op` depends on. `op` must be on an existing (stage, microbatch) pair; for any other
/// op the result is empty.
pub fn predecessors(problem: &Problem, op: Op) -> SmallVec<[Op; 2]> {
    let Some(route) = problem.route_of(op.microbatch) else {
        return SmallVec::new();
    };
    match op.kind {
        OpKind::Forward => match route.prev(op.stage) {
            Some(prev) => smallvec![Op::new(OpKind::Forward, prev, op.microbatch)],
            None => SmallVec::new(),
        },
        OpKind::InputGrad => {
            let mut deps: SmallVec<[Op; 2]> =
                smallvec![Op::new(OpKind::Forward, op.stage, op.microbatch)];
            if let Some(next) = route.next(op.stage) {
                deps.push(Op::new(OpKind::InputGrad, next, op.microbatch));
            }
            deps
        }
        OpKind::WeightGrad => smallvec![Op::new(OpKind::InputGrad, op.stage, op.microbatch)],
    }
}
