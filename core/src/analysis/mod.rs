//! Analyses of a plan: a lower bound on every schedule's makespan, the replay engine that runs it as early as dependencies allow, the
//! per-rank memory replay, the all-to-all figures of a mixture of experts, the verifier of every invariant, the simulator of the figures people
//! compare (also for ranks time-sharing fewer cores), each task's slack in a simulation, and a
//! replay (and slack) kept up to date while a pass edits the orders rank by rank. They read the
//! IR ([`crate::ir`]) and never change it.

pub mod all_to_all;
pub mod bound;
pub mod link;
pub mod peak;
pub mod replay;
pub mod retime;
pub mod sharing;
pub mod simulate;
pub mod slack;
pub mod verify;
