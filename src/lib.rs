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
pub mod compile;
pub mod config;
pub mod error;
pub mod files;
pub mod frontier;
pub mod frontier_limit;
pub mod frontier_point;
pub mod frontier_svg;
pub mod memory_limit;
pub mod paper_table;
pub mod profile_costing;
pub mod reference;
pub mod report;
pub mod report_fields;
mod report_text;
pub mod request;
pub mod residency_search;
pub mod search_space;
pub mod text_table;
pub mod tune;
pub mod variable_length;

pub use compile::{
    build_and_simulate, build_plan, build_plan_observed, build_plan_with, compile, Compiled,
};
pub use config::PipelineConfig;
pub use error::Error;
pub use memory_limit::MemoryLimit;
pub use pipeweave_backends as backends;
pub use pipeweave_core as core_ir;
pub use pipeweave_core::{
    render_grid, simulate, verify, Backwards, CoreError, CostModel, CutCosts, Facts, LayerProfile,
    Layout, LayoutKind, MemoryModel, MicrobatchId, Op, OpKind, Pacing, Plan, Problem, ProblemSpec,
    Profile, RankId, Simulation, StageCosts, StageCostsSpec, StageId, StageMemory, StageMemorySpec,
    Task, Violation, Violations, Work,
};
pub use pipeweave_transforms as transforms;
pub use pipeweave_transforms::{
    compile_expression, Arguments, Arity, Changes, Contract, Pass, PassList, Registry, Requires,
    TransformError,
};
pub use profile_costing::ProfileOptions;
pub use request::{ConfigRequest, ProfileSource};

/// What a pass of one's own needs, in one import: `use pipeweave::prelude::*;`.
///
/// The pass side ([`Pass`], its [`Contract`] of [`Requires`] and [`Changes`], the facts
/// [`Facts`], [`Pacing`], [`LayoutKind`], [`Backwards`], the plan's [`Plan`], [`Task`] and
/// [`Work`], [`TransformError`]) and the use side ([`Registry`] with its [`Arity`] and
/// [`Arguments`], [`PipelineConfig`], [`build_plan_with`], [`simulate`]).
pub mod prelude {
    pub use crate::compile::build_plan_with;
    pub use crate::config::PipelineConfig;
    pub use pipeweave_core::{simulate, Backwards, Facts, LayoutKind, Pacing, Plan, Task, Work};
    pub use pipeweave_transforms::{
        Arguments, Arity, Changes, Contract, Pass, Registry, Requires, TransformError,
    };
}
