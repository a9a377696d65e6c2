//! `pipeweave-core`: the global plan IR of pipeweave and what checks and measures it.
//!
//! The folders are the layers; each depends only on the ones above it in this list:
//! - [`error`]: [`CoreError`], what can be wrong with input (depends on nothing);
//! - [`ir`]: typed ids, ops and tasks, the problem, cost and memory models, typed plan facts,
//!   the dependency rule, the op numbering and the [`Plan`];
//! - [`analysis`]: the replay engine, the memory replay, the verifier (its report is
//!   [`Violations`]) and the simulator;
//! - [`spmd`]: per-rank programs, the messages between ranks, the projection and the
//!   communication checker (its report is [`CommError`]);
//! - [`formats`]: PyTorch schedule CSV (import and export), Chrome trace, SVG timeline, text grid.
//!
//! Input errors ([`CoreError`]) and findings about a well-formed plan (the verifier's
//! [`Violations`], the replay engine's [`ReplayError`], the checker's [`CommError`]) are separate
//! types: after a pass, a finding is a bug in that pass; a `CoreError` is the user's to fix.
//!
//! This crate depends on no tensor library and knows no particular schedule: schedules are passes in
//! `pipeweave-transforms`.
#![warn(missing_docs)]

pub mod analysis;
pub mod error;
pub mod formats;
pub mod ir;
pub mod spmd;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tolerance;

pub use analysis::all_to_all::{a2a_figures, A2aFigures};
pub use analysis::bound::{least_span, lower_bound};
pub use analysis::link::{link_order, offload_producers};
pub use analysis::peak::{held_during, held_per_task, max_peak, moved_by, peak_per_rank, RankPeak};
pub use analysis::replay::{replay_within, Blocked, Replay, ReplayError, TimedTask};
pub use analysis::sharing::{simulate_on_cores, simulate_shared, Sharing};
pub use analysis::simulate::{sequential_pairs_makespan, simulate, simulate_with, Simulation};
pub use analysis::slack::slack;
pub use analysis::verify::{verify, verify_schedule, Violation, Violations};
pub use error::{CoreError, FailureKind};
pub use formats::grid::render_grid;
pub use formats::number::{parse_number, parse_whole, show_number, NumberError};
pub use formats::profile::{
    parse_bytes, LayerProfile, Profile, ProfiledModel, SendProfile, PROFILE_FORMAT,
    PROFILE_FORMAT_V1,
};
pub use ir::all_to_all::{AllToAll, AllToAllPhase, TaskAllToAlls};
pub use ir::blocks::{cut_violation, even_blocks, even_cut, spread_shares, PinnedEnds};
pub use ir::cost::{CostModel, StageCosts, StageCostsSpec};
pub use ir::facts::{
    Backwards, ChunkPlacement, DualKind, Facts, Layout, LayoutKind, Pacing, Residency,
};
pub use ir::ids::{MicrobatchId, RankId, StageId};
pub use ir::layers::{
    CutCosts, LayerCosts, LayerCostsSpec, LayerLayout, LayerPlacement, LayerTable, PhaseTimes,
    StageFigures,
};
pub use ir::memory::{MemoryModel, StageMemory, StageMemorySpec};
pub use ir::op::{Op, OpKind, Task, TaskKind, Work};
pub use ir::plan::{Dropped, Plan};
pub use ir::problem::{checked_size, Problem, ProblemSpec, RouteSpec, MAX_MICROBATCHES, MAX_RANKS};
pub use ir::sequence::{SequenceCut, SplitBy, MAX_SEQ_CHUNKS};
pub use ir::slots::OpSlots;
pub use spmd::check::{check_programs, CheckReport, CommError};
pub use spmd::checked::{CheckedPrograms, ProgramsRefused};
pub use spmd::program::{
    CommGroup, CommOp, Direction, Instr, Message, ProgramSet, RankProgram, Semantics, ShapeSlot,
};
pub use spmd::project::{project, ProjectionOptions, RecvPolicy};
pub use tolerance::TOLERANCE;
