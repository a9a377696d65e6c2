//! SPMD: the per-rank programs a plan is projected into, what travels between ranks, the
//! projection itself, PyTorch's parameter actions (where they go, the order they keep), the order
//! of the residency and all-to-all instructions, and the independent checker of any program set
//! (projected or imported).

pub mod all_to_all;
pub mod check;
pub mod checked;
pub mod messages;
pub mod params;
pub mod program;
pub mod project;
pub mod residency;
