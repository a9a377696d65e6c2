//! The numbering both passes of the checker share: ordered pairs of ranks (`from · ranks + to`),
//! their send and receive counts, and the dense index of a message.

use super::error::CommError;
use crate::ir::ids::RankId;
use crate::ir::slots::OpSlots;
use crate::spmd::program::{CommOp, Direction, Message, ProgramSet};
use std::num::NonZeroU32;

/// A dense index (a rank, a message's [`message_index`]) in a form whose `Option` takes four
/// bytes, as a `u32` does: the checker's per-message and per-op tables are large, and larger
/// entries measurably slow it. Stored one up, in a [`NonZeroU32`]; every index the checker
/// stores is far below `u32::MAX` (ranks below [`crate::ir::problem::MAX_RANKS`], messages below
/// the problem's size limits), and the one value that could not be stored one up saturates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Index(NonZeroU32);

impl Index {
    /// The index `index`.
    pub(super) fn new(index: usize) -> Index {
        let index = u32::try_from(index).unwrap_or(u32::MAX);
        Index(NonZeroU32::MIN.saturating_add(index))
    }

    /// The index of `rank`.
    pub(super) fn rank(rank: RankId) -> Index {
        Index(NonZeroU32::MIN.saturating_add(rank.get()))
    }
}

const _: () = assert!(std::mem::size_of::<Option<Index>>() == 4);

/// Per ordered pair of ranks (`from · ranks + to`), its receives and its sends.
pub(super) type PairCounts = Vec<[usize; 2]>;

/// Dense index of a message: (receiving stage, microbatch) names its pair, the direction the
/// rest (the route gives the sending stage). None when out of range.
pub(super) fn message_index(slots: OpSlots, m: &Message) -> Option<usize> {
    let direction = usize::from(m.direction == Direction::Gradient);
    slots
        .pair(m.to_stage, m.microbatch)
        .map(|pair| pair * 2 + direction)
}

/// The ordered pair of ranks a send or receive of `rank` belongs to (`from · ranks + to`), and
/// whether it is the send; None when the peer is out of range.
pub(super) fn pair_of(rank: RankId, op: &CommOp, ranks: usize) -> Option<(usize, bool)> {
    match *op {
        CommOp::Send { to, .. } if to.index() < ranks => {
            Some((rank.index() * ranks + to.index(), true))
        }
        CommOp::Recv { from, .. } if from.index() < ranks => {
            Some((from.index() * ranks + rank.index(), false))
        }
        _ => None,
    }
}

/// Counts one send or receive of `rank` in `counts`; a peer out of range is left out and is
/// check 2's error.
pub(super) fn count(
    counts: &mut PairCounts,
    ranks: usize,
    rank: RankId,
    op: &CommOp,
) -> Result<(), CommError> {
    let (pair, is_send) = pair_of(rank, op, ranks).ok_or(CommError::PeerOutOfRange {
        rank,
        op: *op,
        peer: op.peer(),
        ranks,
    })?;
    counts[pair][usize::from(is_send)] += 1;
    Ok(())
}

/// Counts every send and receive of `set` per ordered pair of ranks, with check 2's error for
/// the first peer out of range (left out of the counts).
pub(super) fn pair_counts(set: &ProgramSet) -> (PairCounts, Option<CommError>) {
    let ranks = set.programs.len();
    let mut counts = vec![[0; 2]; ranks * ranks];
    let mut stray = None;
    for p in &set.programs {
        for (_, op) in p.comm_ops() {
            if let Err(e) = count(&mut counts, ranks, p.rank, op) {
                stray.get_or_insert(e);
            }
        }
    }
    (counts, stray)
}
