//! `pipeweave-core`: the global plan IR of pipeweave and what checks and measures it.
//!
//! - [`ids`]: typed ids; [`problem`]: ranks, microbatches, stage placement, routes, tied stages;
//! - [`cost`] and [`memory`]: the cost and activation-memory models;
//! - [`op`]: ops (F, I, W) and the tasks a rank runs, in PyTorch's action notation;
//! - [`plan`]: the global plan (problem, models, per-rank orders, pass history);
//! - [`deps`]: the dependency rule; [`replay`]: the as-early-as-possible execution engine;
//! - [`verify`]: the invariants and their checker; [`simulate`]: makespan, bubble, memory;
//! - [`grid`]: a rank x time text grid;
//! - [`program`] and [`project`]: per-rank SPMD programs and the projection that builds them;
//! - [`check`]: the communication checker (matching sends and receives, freedom from deadlock);
//! - [`formats`]: PyTorch schedule CSV (import and export), Chrome trace, SVG timeline.
//!
//! This crate depends on no tensor library and knows no particular schedule: schedules are passes in
//! `pipeweave-transforms`.
#![warn(missing_docs)]

pub mod check;
pub mod cost;
pub mod deps;
pub mod error;
pub mod formats;
pub mod grid;
pub mod ids;
pub mod memory;
pub mod op;
pub mod plan;
pub mod problem;
pub mod program;
pub mod project;
pub mod replay;
pub mod simulate;
pub mod verify;

pub use check::{check_programs, CheckReport, CommError, Semantics};
pub use cost::{CostModel, StageCosts, StageCostsSpec};
pub use error::CoreError;
pub use grid::render_grid;
pub use ids::{MicrobatchId, RankId, StageId};
pub use memory::{MemoryModel, StageMemory, StageMemorySpec};
pub use op::{Op, OpKind, Task, TaskKind, Work};
pub use plan::Plan;
pub use problem::{Problem, ProblemSpec, RouteSpec};
pub use program::{
    CommGroup, CommOp, Direction, Instr, Message, ProgramSet, RankProgram, ShapeSlot,
};
pub use project::{project, ProjectionOptions, RecvPolicy};
pub use simulate::{simulate, Simulation};
pub use verify::{verify, verify_schedule, Violation, Violations};
