//! Checks 3 to 5 of the checker, completion: the [`CommReplay`] of a program set's sends,
//! receives and waits under blocking, batched or rendezvous semantics, and, when it cannot
//! finish, the cycle of waiting ranks.

use super::error::{CommError, Waiting};
use super::pairs::{message_index, pair_of, Index, PairCounts};
use crate::ir::ids::RankId;
use crate::ir::slots::OpSlots;
use crate::spmd::program::{CommOp, Instr, Message, ProgramSet, RankProgram, Semantics};
use std::collections::{HashMap, HashSet, VecDeque};

/// What operation a [`Slot`] of the replay is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotKind {
    /// A send: the rank waits for its receive under blocking semantics only.
    Send,
    /// A receive: the rank waits for its send.
    Recv,
    /// A `WaitSend`: the rank waits for its send's receive.
    WaitSend,
}

/// One send, receive or wait of the communication replay: its flag and its partner's in the
/// table of posted operations, its peer and what kind of operation it is. What completion reads
/// on every step, in 16 bytes; the instruction it belongs to is found again when an operation
/// is named ([`slot_ops`]).
#[derive(Clone, Copy, Debug)]
struct Slot {
    /// Its place in the posted table (for a wait, its send's).
    flag: u32,
    /// Its partner's place (for a wait, its send's receive's): always in the table, which
    /// reserves a place for every ordinal either side of a pair has, so an operation with more
    /// of its kind than the other side has waits on a place no program posts.
    partner: u32,
    /// The rank on the other side (for a wait, its send's receiver).
    peer: RankId,
    kind: SlotKind,
    /// Whether it opens a unit of batched semantics: the first operation of a group, or a wait.
    opens: bool,
}

// The replay walks every slot on each run: a larger slot measurably slows the checker.
const _: () = assert!(std::mem::size_of::<Slot>() == 16);

impl Slot {
    /// Whether the rank must wait for this operation's partner before going on: a wait always;
    /// a send only under blocking semantics; a receive always.
    fn blocks(&self, semantics: Semantics) -> bool {
        self.kind != SlotKind::Send || semantics == Semantics::Blocking
    }
}

/// The communication of a program set reduced to what completion depends on: per rank, its
/// sends, receives and waits in program order, each numbered within its ordered pair of ranks.
/// The posted table holds, pair after pair, the pair's receives then its sends (each side with
/// as many places as the larger side has operations), so the k-th send of a pair has the flag
/// its k-th receive waits on, and the messages' indices laid out in the same order are what
/// check 2 compares. Built once, run under each semantics: one operation per unit under blocking
/// and rendezvous semantics, one group per unit under batched.
pub(super) struct CommReplay<'a> {
    pub(super) set: &'a ProgramSet,
    /// Per rank, its slots in program order.
    slots: Vec<Vec<Slot>>,
    /// Per pair and direction (receives, sends), where its flags start, and how many operations
    /// it has.
    pub(super) pairs: Vec<[(usize, usize); 2]>,
    /// Size of the posted table.
    flags: usize,
    /// The index ([`message_index`]) of every send's and receive's message, at its flag (None
    /// for a message out of range): one message each once check 1 has found every message on a
    /// route edge. Empty when the replay was built without numbering the messages.
    pub(super) messages: Vec<Option<Index>>,
}

impl<'a> CommReplay<'a> {
    /// Numbers every send and receive within its ordered pair of ranks (`counts` per pair, from
    /// [`super::pairs::pair_counts`]), with its message's index when `slots` number the
    /// messages. Peers out of range are left out (check 2 reports them); a wait joins the latest
    /// earlier send of its message.
    pub(super) fn new(
        set: &'a ProgramSet,
        counts: &PairCounts,
        slots: Option<OpSlots>,
    ) -> CommReplay<'a> {
        let ranks = set.programs.len();
        let mut total = 0;
        let pairs: Vec<[(usize, usize); 2]> = counts
            .iter()
            .map(|count| {
                let width = count[0].max(count[1]);
                [0, 1].map(|d| {
                    total += width;
                    (total - width, count[d])
                })
            })
            .collect();
        let mut messages = vec![None; if slots.is_some() { total } else { 0 }];
        let mut next: Vec<[usize; 2]> = pairs.iter().map(|p| [p[0].0, p[1].0]).collect();
        let mut all: Vec<Vec<Slot>> = Vec::with_capacity(ranks);
        for p in &set.programs {
            let mut rank_slots = Vec::with_capacity(p.instrs.len());
            let mut sends = WaitedSends::default();
            for (i, instr) in p.instrs.iter().enumerate() {
                if let Instr::WaitSend { to, message } = *instr {
                    if let Some(k) = sends.latest(p, i, ranks, to, message) {
                        let send: Slot = rank_slots[k];
                        rank_slots.push(Slot {
                            kind: SlotKind::WaitSend,
                            opens: true,
                            ..send
                        });
                    }
                    continue;
                }
                let Instr::Comm(g) = instr else { continue };
                let mut opens = true;
                for op in &g.ops {
                    let Some((pair, is_send)) = pair_of(p.rank, op, ranks) else {
                        continue;
                    };
                    let (mine, theirs) = (usize::from(is_send), usize::from(!is_send));
                    let flag = next[pair][mine];
                    next[pair][mine] += 1;
                    let ordinal = flag - pairs[pair][mine].0;
                    if let Some(slots) = slots {
                        messages[flag] = message_index(slots, &op.message()).map(Index::new);
                    }
                    if is_send {
                        sends.record(op, rank_slots.len());
                    }
                    rank_slots.push(Slot {
                        flag: flag as u32,
                        partner: (pairs[pair][theirs].0 + ordinal) as u32,
                        peer: op.peer(),
                        kind: if is_send {
                            SlotKind::Send
                        } else {
                            SlotKind::Recv
                        },
                        opens,
                    });
                    opens = false;
                }
            }
            all.push(rank_slots);
        }
        CommReplay {
            set,
            slots: all,
            pairs,
            flags: total,
            messages,
        }
    }

    /// Checks 3 to 5 under `semantics`: every rank runs to its end, or the cycle of waiting
    /// ranks.
    pub(super) fn run(&self, semantics: Semantics) -> Result<(), CommError> {
        let mut run = CommRun {
            replay: self,
            semantics,
            posted: vec![false; self.flags],
            position: vec![0; self.slots.len()],
        };
        run.advance();
        if run.finished() {
            return Ok(());
        }
        Err(CommError::Deadlock {
            semantics,
            cycle: run.wait_cycle(),
        })
    }
}

/// Every slot of `program`'s (in a set of `ranks` programs), by the rules [`CommReplay::new`]
/// makes them, with its instruction and its operation: one per operation of a group with a peer
/// in range, one per wait on an earlier such send (the send it waits on). Read only to name an
/// operation, so found again then rather than kept.
fn slot_ops(program: &RankProgram, ranks: usize) -> Vec<(usize, CommOp)> {
    let mut slots = Vec::new();
    let mut sent = HashSet::new();
    for (i, instr) in program.instrs.iter().enumerate() {
        match *instr {
            Instr::Comm(ref g) => {
                for op in g.ops.iter().filter(|op| op.peer().index() < ranks) {
                    if let CommOp::Send { to, message } = *op {
                        sent.insert((to, message));
                    }
                    slots.push((i, *op));
                }
            }
            Instr::WaitSend { to, message } if sent.contains(&(to, message)) => {
                slots.push((i, CommOp::Send { to, message }));
            }
            _ => {}
        }
    }
    slots
}

/// The sends of one program a `WaitSend` may wait on, each message at its latest send's slot:
/// kept from the program's first wait on (the projected programs have none, and pay nothing).
#[derive(Default)]
struct WaitedSends {
    latest: Option<HashMap<(RankId, Message), usize>>,
}

impl WaitedSends {
    /// Remembers that slot `k` sends `op`, once waits have been seen.
    fn record(&mut self, op: &CommOp, k: usize) {
        if let (Some(latest), CommOp::Send { to, message }) = (&mut self.latest, *op) {
            latest.insert((to, message), k);
        }
    }

    /// The slot of the latest send of `message` to `to` before instruction `i` of program `p`
    /// (in a set of `ranks`). At the first wait, the sends so far are indexed from the program:
    /// no wait comes before it, so its slots so far are its operations with a peer in range.
    fn latest(
        &mut self,
        p: &RankProgram,
        i: usize,
        ranks: usize,
        to: RankId,
        message: Message,
    ) -> Option<usize> {
        let latest = self.latest.get_or_insert_with(|| {
            let ops = p.comm_ops().take_while(|&(j, _)| j < i);
            let in_range = ops.filter(|(_, op)| op.peer().index() < ranks);
            let mut sends = HashMap::new();
            for (k, (_, op)) in in_range.enumerate() {
                if let CommOp::Send { to, message } = *op {
                    sends.insert((to, message), k);
                }
            }
            sends
        });
        latest.get(&(to, message)).copied()
    }
}

/// One run of a [`CommReplay`] under one semantics: which flags are posted and where each rank is.
struct CommRun<'r, 'a> {
    replay: &'r CommReplay<'a>,
    semantics: Semantics,
    posted: Vec<bool>,
    /// Per rank, the slot its next unit starts at.
    position: Vec<usize>,
}

impl CommRun<'_, '_> {
    /// The end of the unit starting at slot `start` of rank `r`.
    fn unit_end(&self, r: usize, start: usize) -> usize {
        let slots = &self.replay.slots[r];
        match self.semantics {
            Semantics::Batched => {
                let rest = slots[start + 1..].iter().position(|s| s.opens);
                rest.map_or(slots.len(), |k| start + 1 + k)
            }
            Semantics::Blocking | Semantics::Rendezvous => start + 1,
        }
    }

    fn partner_posted(&self, s: &Slot) -> bool {
        self.posted[s.partner as usize]
    }

    /// Advances every rank as far as it can: a rank posts its next unit, then completes it once
    /// every blocking operation's partner is posted. Posting wakes the peers.
    fn advance(&mut self) {
        let ranks = self.replay.slots.len();
        let mut posted_until = vec![0usize; ranks];
        let mut queue: VecDeque<usize> = (0..ranks).collect();
        let mut queued = vec![true; ranks];
        while let Some(r) = queue.pop_front() {
            queued[r] = false;
            let slots = &self.replay.slots[r];
            while self.position[r] < slots.len() {
                let start = self.position[r];
                let end = self.unit_end(r, start);
                if posted_until[r] <= start {
                    posted_until[r] = end;
                    for s in &slots[start..end] {
                        self.posted[s.flag as usize] = true;
                        let p = s.peer.index();
                        if p != r && !queued[p] {
                            queued[p] = true;
                            queue.push_back(p);
                        }
                    }
                }
                let unit = &slots[start..end];
                if !unit
                    .iter()
                    .all(|s| !s.blocks(self.semantics) || self.partner_posted(s))
                {
                    break;
                }
                self.position[r] = end;
            }
        }
    }

    fn finished(&self) -> bool {
        (self.replay.slots.iter().zip(&self.position)).all(|(slots, &at)| at == slots.len())
    }

    /// The operation rank `r` is stuck at, with its instruction index.
    fn waiting_op(&self, r: usize) -> Option<(usize, CommOp)> {
        let start = self.position[r];
        let slots = &self.replay.slots[r];
        if start >= slots.len() {
            return None;
        }
        let end = self.unit_end(r, start);
        let k = start
            + slots[start..end]
                .iter()
                .position(|s| s.blocks(self.semantics) && !self.partner_posted(s))?;
        let program = &self.replay.set.programs[r];
        let named = slot_ops(program, self.replay.slots.len()).get(k).copied();
        Some(named.expect("the replay made slot k of this program by the rules of `slot_ops`"))
    }

    /// The cycle: follow "rank waits for an op whose partner its peer has not posted" from the
    /// first unfinished rank until a rank repeats.
    fn wait_cycle(&self) -> Vec<Waiting> {
        let ranks = self.replay.slots.len();
        let Some(start) = (0..ranks).find(|&r| self.position[r] < self.replay.slots[r].len())
        else {
            return Vec::new();
        };
        let mut path: Vec<Waiting> = Vec::new();
        // Per rank, its place on the path once visited.
        let mut seen: Vec<Option<usize>> = vec![None; ranks];
        let mut r = start;
        while let Some((instr, op)) = self.waiting_op(r) {
            if let Some(first) = seen[r] {
                path.drain(..first);
                break;
            }
            seen[r] = Some(path.len());
            path.push(Waiting {
                rank: RankId::new(r as u32),
                instr,
                op,
            });
            r = op.peer().index();
            if r >= ranks {
                break;
            }
        }
        path
    }
}
