//! The built-in passes, one per file (the schedules, and `recompute` and `offload`, which decide
//! where activations live); each file's doc names its source schedule, its
//! contract (the facts it requires, what it may change), its preconditions, and shows a
//! before/after grid. [`crate::builtins`] registers them under their names.

pub mod dual;
pub mod f1b;
pub mod gpipe;
pub mod offload;
pub mod recompute;
pub mod vpp;
pub mod zero_bubble;

pub use dual::Dual;
pub use f1b::OneForwardOneBackward;
pub use gpipe::GPipe;
pub use offload::Offload;
pub use recompute::Recompute;
pub use vpp::Interleave;
pub use zero_bubble::{Policy, ZeroBubble};
