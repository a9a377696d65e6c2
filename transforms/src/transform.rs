//! The `Transform` trait: a pass is a value with a name, a place in the client's order,
//! preconditions and a rewrite `Plan -> Plan`.

use crate::error::TransformError;
use pipeweave_core::Plan;

/// Where a pass stands in the client's composition `zero_bubble(dual(vpp(f1b(gpipe))))`.
/// A pass may only follow passes of a strictly earlier position.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Position {
    /// The baseline that fills an unscheduled plan (`gpipe`).
    Baseline,
    /// 1F1B reordering.
    OneForwardOneBackward,
    /// Splitting ranks' shares into interleaved chunks (`vpp`).
    Interleave,
    /// Bidirectional pipelines (`dual`).
    Dual,
    /// Weight-gradient scheduling (`zero_bubble`).
    ZeroBubble,
}

/// A schedule pass.
pub trait Transform: Send + Sync {
    /// The pass's name, as written in expressions and blamed in errors.
    fn name(&self) -> &'static str;

    /// Its place in the client's order.
    fn position(&self) -> Position;

    /// Checks the preconditions the pass states in its module doc.
    fn check(&self, plan: &Plan) -> Result<(), TransformError>;

    /// Rewrites the plan. Called only after [`Transform::check`] succeeded.
    fn apply(&self, plan: Plan) -> Result<Plan, TransformError>;

    /// A one-line description with the pass's arguments, e.g. `vpp(chunks=2, group=4)`.
    fn describe(&self) -> String {
        self.name().to_string()
    }
}
