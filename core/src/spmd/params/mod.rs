//! PyTorch's per-stage parameter actions ([`ParamAction`](crate::spmd::program::ParamAction)):
//! where its lowering puts them, and the rules their order in a rank program must follow.
//!
//! **Placement** ([`place`]), by the rules of `torch.distributed.pipelining`'s own lowering
//! (`_add_unshard_reshard` and `_add_reduce_grad` in its `schedules.py`, PyTorch 2.15 defaults),
//! on one rank's compute order:
//! - residency: before each compute, the stages "resident" from there on are the distinct stages
//!   of the next computes, whole computes at a time, until [`MAX_ACTIVE_STAGES`] are found (an
//!   overlapped compute brings both its stages). Stages resident before but not now are
//!   resharded, then resident stages not yet unsharded are unsharded, in order of their next use;
//!   after the last compute every stage still unsharded is resharded. So a rank holding at most
//!   three stages unshards them all up front and reshards each after its last compute;
//! - reductions: right after the compute holding a stage's last weight gradient on the rank (a
//!   W, a B or an overlapped F&B), `REDUCE_GRAD` then at once its `WAIT_REDUCE_GRAD`.
//!
//! Given PyTorch's compute-only form of the same order, its lowering puts these actions at the
//! same places among the computes (the real-PyTorch test compares the two).
//!
//! **Order** ([`check_params`], part of the communication checker), per rank program:
//! - an unshard finds the stage resharded and a reshard finds it unsharded; where any program of
//!   the set unshards, every compute needs its stages unsharded, and every stage is resharded by
//!   the end;
//! - a reduction follows the stage's last weight gradient on the rank: nothing computes on the
//!   stage after it, it happens once per stage, only one is pending at a time (PyTorch's runtime
//!   refuses a second), and each is waited for, by a wait naming its stage;
//! - where any program of the set reduces, every stage with weight gradients is reduced.
//!
//! A set without any of these actions is valid (PyTorch then neither scales nor reduces the
//! gradients): [`ParamUse`] says which kinds a set holds.
//!
//! The rooms: `place.rs` the placement, `order.rs` the order check, `fault.rs` its faults.

mod fault;
mod order;
mod place;
#[cfg(test)]
mod tests;

pub use fault::ParamFault;
pub use order::{check_params, Located, ParamUse};
pub use place::{place, Placed, Slot, MAX_ACTIVE_STAGES};
