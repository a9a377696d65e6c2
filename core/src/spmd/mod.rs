//! SPMD: the per-rank programs a plan is projected into, what travels between ranks, the
//! projection itself and the independent checker of any program set (projected or imported).

pub mod check;
pub mod messages;
pub mod program;
pub mod project;
