//! One point of the memory/time frontier (`tune --frontier`): the fastest schedule found from
//! a memory limit up to the next point's. Its own module so that the search's stages (the
//! residency search reads the kept frontier's points) and the frontier share it without a circle.

use serde::Serialize;

/// One point of the frontier.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FrontierPoint {
    /// The smallest limit at which this point is the fastest (its own peak).
    pub memory_limit: f64,
    /// The expression (give it to `plan` with the same options).
    pub expression: String,
    /// Its makespan.
    pub makespan: f64,
    /// Its peak activations (units of a rank's share).
    pub peak_activations: f64,
    /// The family it belongs to, as the report names it ([`crate::search_space::Family::label`]):
    /// the expression itself for fixed schedules, `auto's ladder on INNER` for the ladder, `recompute`,
    /// `offload` or `chunk offload`.
    pub family: String,
}
