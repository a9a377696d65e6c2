//! `pipeweave`: compose pipeline-parallel training schedules as passes over a global plan.
//!
//! This facade re-exports the public API of the workspace crates and adds the glue a user needs
//! to go from a schedule expression and a few sizes to a verified, simulated plan:
//!
//! ```
//! use pipeweave::{build_plan, PipelineConfig};
//!
//! let config = PipelineConfig::new(4, 8).unwrap();
//! let plan = build_plan("vpp(f1b(gpipe), chunks=2)", &config).unwrap();
//! let sim = pipeweave::simulate(&plan).unwrap();
//! assert_eq!(plan.problem().stages(), 8);
//! assert!(sim.bubble_rate() < 0.3);
//! ```
#![warn(missing_docs)]

pub mod cli;
pub mod config;
pub mod error;
pub mod frontier;
pub mod paper_table;
pub mod reference;
pub mod report;
pub mod tune;

pub use config::{
    build_and_simulate, build_plan, build_plan_observed, build_plan_with, PipelineConfig,
};
pub use error::Error;
pub use pipeweave_backends as backends;
pub use pipeweave_core as core_ir;
pub use pipeweave_core::{
    render_grid, simulate, verify, Backwards, CoreError, CostModel, Facts, Layout, LayoutKind,
    MemoryModel, MicrobatchId, Op, OpKind, Pacing, Plan, Problem, ProblemSpec, RankId, Simulation,
    StageCosts, StageCostsSpec, StageId, StageMemory, StageMemorySpec, Task, Violation, Violations,
    Work,
};
pub use pipeweave_transforms as transforms;
pub use pipeweave_transforms::{
    compile_expression, Arguments, Arity, Changes, Contract, Pass, PassList, Registry, Requires,
    Transform, TransformError,
};
