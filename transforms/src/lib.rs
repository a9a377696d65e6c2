//! `pipeweave-transforms`: schedule passes over the global plan and the driver that runs them.
//!
//! - [`transform`]: the `Transform` trait and the client's pass order;
//! - [`driver`]: runs a pass list, verifying after every pass and blaming a broken pass by name;
//! - [`passes`]: one file per pass (`gpipe`, `f1b`, `vpp`, `dual`, `zero_bubble`);
//! - [`schedules`]: order generators the passes share (DualPipe phases, Zero Bubble's lagged Ws,
//!   the list scheduler of `auto`);
//! - [`expr`] and [`compile`]: the expression language `vpp(f1b(gpipe), chunks=2)`;
//! - [`order`]: helpers for building per-rank orders.
//!
//! Architecture invariant: a pass is a pure `Plan -> Plan` function; every pass output is verified
//! by the driver before anything else sees it.
#![warn(missing_docs)]

pub mod compile;
pub mod driver;
pub mod error;
pub mod expr;
pub mod order;
pub mod passes;
pub mod schedules;
pub mod transform;

pub use compile::{compile, compile_expression, KNOWN_PASSES};
pub use driver::PassList;
pub use error::TransformError;
pub use transform::{Position, Transform};
