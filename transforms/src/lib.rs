//! `pipeweave-transforms`: schedule passes over the global plan and the driver that runs them.
//!
//! - [`pass`]: the `Pass` trait (name, contract, rewrite) and the contracts;
//! - [`driver`]: runs a pass list, checking each contract, verifying after every pass and blaming
//!   a broken pass by name;
//! - [`passes`]: the built-ins, one file per pass (`gpipe`, `f1b`, `vpp`, `dual`, `zero_bubble`);
//! - [`schedules`]: order generators the passes share (DualPipe phases, Zero Bubble's lagged Ws,
//!   ZB-V, the list scheduler of `auto`, its local search and score);
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
