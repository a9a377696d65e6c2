//! The plan IR: typed ids, ops and tasks, the problem, the cost and memory models, typed facts,
//! the dependency rule, the op numbering and the plan itself. Nothing here analyses a plan; the
//! analyses ([`crate::analysis`]) and the SPMD projection ([`crate::spmd`]) build on it.

pub mod cost;
pub mod deps;
pub mod facts;
pub mod ids;
pub mod memory;
pub mod op;
pub mod plan;
pub mod problem;
pub mod slots;
