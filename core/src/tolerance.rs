//! The one tolerance of pipeweave's floating-point comparisons of times and memory.
//!
//! Durations and activation figures are sums of user-given `f64`s, so two ways of adding the same
//! figures can differ in their last bits. Every comparison that decides something (does a forward
//! fit the memory limit, did a schedule get faster, did a task start on time) allows this much.

/// Differences of times or memory below this are floating-point noise.
pub const TOLERANCE: f64 = 1e-9;
