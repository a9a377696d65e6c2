//! The schedule passes, one per file; each file's doc names its source schedule, preconditions,
//! what it may change, and shows a before/after grid.

pub mod dual;
pub mod f1b;
pub mod gpipe;
pub mod vpp;
pub mod zero_bubble;

pub use dual::Dual;
pub use f1b::OneForwardOneBackward;
pub use gpipe::GPipe;
pub use vpp::{Interleave, Layout};
pub use zero_bubble::{Policy, ZeroBubble};
