//! The schedule passes, one per file; each file's doc names its source schedule, preconditions,
//! what it may change, and shows a before/after grid.

pub mod f1b;
pub mod gpipe;
pub mod vpp;

pub use f1b::OneForwardOneBackward;
pub use gpipe::GPipe;
pub use vpp::{Interleave, Layout};
