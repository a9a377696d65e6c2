//! `pipeweave-transforms`: schedule passes over the global plan and the driver that runs them.
//!
//! - [`pass`]: the `Pass` trait (name, contract, rewrite) and the contracts;
//! - [`driver`]: runs a pass list, checking each contract, verifying after every pass and blaming
//!   a broken pass by name;
//! - [`passes`]: the built-ins, one file per pass, each type named as its file and its expression
//!   name (`Gpipe`, `F1b`, `Vpp`, `Dual`, `ZeroBubble`; `recompute` and `offload` are
//!   [`passes::Relief`] with the [`passes::Recompute`] or [`passes::Offload`] strategy);
//! - [`schedules`]: order generators the passes share (DualPipe phases, Zero Bubble's lagged Ws,
//!   ZB-V, the list scheduler of `auto`, its local search and score, the relief loop of
//!   `recompute` and `offload`);
//! - [`expr`], [`registry`] and [`builtins`]: the expression language
//!   `vpp(f1b(gpipe), chunks=2)`, the registry of pass names (open to users' passes) and the
//!   built-ins' entries in it;
//! - [`order`]: helpers for building per-rank orders.
//!
//! Architecture invariant: a pass is a pure `Plan -> Plan` function; every pass output is checked
//! against its contract and verified by the driver before anything else sees it.
#![warn(missing_docs)]

pub mod builtins;
pub mod driver;
pub mod error;
pub mod expr;
pub mod order;
pub mod pass;
pub mod passes;
pub mod registry;
pub mod schedules;

pub use builtins::compile_expression;
pub use driver::PassList;
pub use error::TransformError;
pub use pass::{Changes, Contract, Pass, Requires};
pub use registry::{Arguments, Arity, Factory, Registry};

/// Fixtures of the unit tests: core's shared fixtures ([`pipeweave_core::testing`], through the
/// dev-dependency's feature `testing`) and the plans the built-in passes make of them.
#[cfg(test)]
pub(crate) mod testing {
    use crate::builtins::compile_expression;
    use crate::error::TransformError;
    use pipeweave_core::{Plan, StageCosts};

    pub use pipeweave_core::testing::{tasks, unscheduled};

    /// The plan `expression` (built-in passes) builds from [`unscheduled`].
    pub fn built(
        expression: &str,
        ranks: u32,
        microbatches: u32,
        costs: StageCosts,
    ) -> Result<Plan, TransformError> {
        compile_expression(expression)?.run(unscheduled(ranks, microbatches, costs))
    }
}
