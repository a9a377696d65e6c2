//! The events of a rank program before they are grouped into instructions, and their places on
//! the one global time line ([`EventKey`]): what orders every rank's program.

use crate::ir::all_to_all::AllToAll;
use crate::ir::ids::StageId;
use crate::ir::op::{Task, Work};
use crate::spmd::program::{CommOp, Direction, Message, ParamAction};

/// An event of a rank's program before grouping.
#[derive(Clone, Copy, Debug)]
pub(super) enum Event {
    Compute(Task),
    Loss(Work),
    Comm(CommOp),
    FreeOutput(Work),
    GradSync(StageId),
    Params(ParamAction, StageId),
    /// Keep only the stage input of this forward (its pair is recomputed).
    Drop(Work),
    /// An offload or a reload, issued after the compute before it.
    Transfer(Task),
    /// Start an all-to-all of the rank's experts.
    Issue(AllToAll),
    /// Wait for an all-to-all issued earlier.
    Wait(AllToAll),
}

/// What an event is, in the order events at the same moment come: unshards and reshards before
/// a compute, a just-in-time receive before the compute it feeds, a backward's head all-to-all
/// (issued there if its gradient came just in time, and waited for), a gradient-sync marker
/// right before its compute, the compute, its in-span all-to-alls, the loss after its forward
/// (then the head of that microbatch's backward issued), a forward's combine waited for where
/// its output is ready, sends (and early receives, each gradient's head issued after them) at a
/// task's end, frees after their sends (a recomputed forward's drop after them), then the
/// gradient reductions (and the last reshards) and the transfers issued after the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum EventClass {
    Residency,
    JustInTimeReceive,
    HeadAllToAll,
    GradSync,
    Compute,
    SpanAllToAll,
    Loss,
    TailWait,
    Communication,
    FreeOutput,
    Reduction,
}

/// A point on the one global time line: (simulated time, position in the topological order,
/// class, tie-break). A compute sits at its start (`2 q` for its task's completion sequence `q`),
/// its sends at its end (`2 q + 1`), a receive where its message is produced (early) or just
/// before its consumer (just in time).
///
/// Packed into one integer that compares as the tuple does: the bits of the non-negative time
/// (which sort like the times) in the high 64 bits, then 32 bits of topological position, 4 of
/// class and 28 of tie-break. The size limits keep every field in its bits: a plan has fewer
/// than `3 · 2^24` tasks, so `2 q + 1` and a just-in-time tie-break `2 q + 1` stay below `2^28`,
/// and a stage below `2^16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct EventKey(u128);

impl EventKey {
    pub(super) fn new((time, topo): Moment, class: EventClass, tiebreak: u64) -> EventKey {
        debug_assert!(topo < 1 << 32 && tiebreak < 1 << 28, "see the size limits");
        EventKey(
            (u128::from(time) << 64)
                | (u128::from(topo) << 32)
                | ((class as u128) << 28)
                | u128::from(tiebreak),
        )
    }
}

/// A moment of a task on the time line: (time bits, topological position).
pub(super) type Moment = (u64, u64);

/// An event at its place on the time line.
pub(super) type Keyed = (EventKey, Event);

pub(super) fn time_bits(t: f64) -> u64 {
    t.max(0.0).to_bits()
}

/// The tie-break between the messages of one task: activation before gradient.
pub(super) fn direction_bit(m: &Message) -> u64 {
    u64::from(m.direction == Direction::Gradient)
}

/// The order in which a peer sends its messages: by producing task, then direction, then stage
/// and microbatch.
pub(super) fn message_key(m: &Message) -> u64 {
    (direction_bit(m) << 62) | (u64::from(m.from_stage.get()) << 32) | u64::from(m.microbatch.get())
}
