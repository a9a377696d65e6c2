//! Receive placement: which ranks send to a rank ([`senders`]), and its receives found from the
//! sending side and keyed on the time line ([`Receives`]), early where the message is produced
//! or just in time before its consumer ([`Starts`], [`place_just_in_time`]).

use super::all_to_all::{head, outputs_end, Experts};
use super::events::{
    direction_bit, message_key, time_bits, Event, EventClass, EventKey, Keyed, Moment,
};
use crate::analysis::replay::TimedTask;
use crate::ir::deps::Links;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, OpKind, Work};
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::messages::remote_outputs;
use crate::spmd::program::{CommOp, Direction, Message};
use std::collections::HashSet;

/// Per rank, the ranks that send it something: the owners of the stages next to its own on a
/// route, in rank order.
pub(super) fn senders(problem: &Problem) -> Vec<Vec<RankId>> {
    let mut senders = vec![Vec::new(); problem.ranks() as usize];
    for route in problem.routes() {
        for pair in route.stages().windows(2) {
            let (Some(a), Some(b)) = (problem.rank_of(pair[0]), problem.rank_of(pair[1])) else {
                continue;
            };
            if a != b {
                senders[b.index()].push(a);
                senders[a.index()].push(b);
            }
        }
    }
    for list in &mut senders {
        list.sort_unstable();
        list.dedup();
    }
    senders
}

/// What finds a rank's receives: they are found from the sending side, walking each sender's
/// timeline in order, where every output for the rank is a receive, early at the moment it is
/// produced (after the sender's tail all-to-all, where it has one) or just in time (see
/// [`place_just_in_time`]). So a rank's list is a run of keys in order per sender, which a
/// run-adaptive sort merges. An early receive of a gradient whose backward waits for a head
/// all-to-all is followed by that all-to-all's issue.
pub(super) struct Receives<'a> {
    links: &'a Links,
    timeline: &'a [Vec<TimedTask>],
    senders: &'a [Vec<RankId>],
    /// The tasks' starts, for just-in-time receives.
    starts: Option<&'a Starts>,
    /// The plan's all-to-alls, if any.
    experts: Option<&'a Experts<'a>>,
    /// The just-in-time receives being placed.
    late: Vec<LateReceive>,
}

impl<'a> Receives<'a> {
    /// A finder of receives on `timeline`, with `senders` per rank ([`senders`]); just in time
    /// where `starts` are given; after the tails of `experts`' all-to-alls.
    pub(super) fn new(
        links: &'a Links,
        timeline: &'a [Vec<TimedTask>],
        senders: &'a [Vec<RankId>],
        starts: Option<&'a Starts>,
        experts: Option<&'a Experts<'a>>,
    ) -> Receives<'a> {
        Receives {
            links,
            timeline,
            senders,
            starts,
            experts,
            late: Vec::new(),
        }
    }

    /// The timed tasks of `rank`.
    pub(super) fn tasks(&self, rank: RankId) -> &'a [TimedTask] {
        &self.timeline[rank.index()]
    }

    /// The receives of `rank`, keyed on the time line and sorted, into `events`; an early one
    /// of a gradient for a backward among `heads` followed by the issue of its head all-to-all.
    pub(super) fn collect(&mut self, rank: RankId, heads: &HashSet<Work>, events: &mut Vec<Keyed>) {
        events.clear();
        self.late.clear();
        for &from in &self.senders[rank.index()] {
            for t in &self.timeline[from.index()] {
                for output in remote_outputs(self.links, from, &t.task) {
                    if output.to != rank {
                        continue;
                    }
                    let message = output.message;
                    match self.starts {
                        None => {
                            let ready = outputs_end(self.experts, t);
                            let produced = (time_bits(ready), 2 * t.sequence as u64 + 1);
                            let key = EventKey::new(
                                produced,
                                EventClass::Communication,
                                direction_bit(&message),
                            );
                            events.push((key, Event::Comm(CommOp::Recv { from, message })));
                            let consumer = message.consumer();
                            if message.direction == Direction::Gradient && heads.contains(&consumer)
                            {
                                let key = EventKey::new(produced, EventClass::Communication, 2);
                                events.push((key, Event::Issue(head(consumer))));
                            }
                        }
                        Some(starts) => {
                            let consumer = starts.of_consumer(&message);
                            self.late.push((from, t.sequence, consumer, message));
                        }
                    }
                }
            }
        }
        place_just_in_time(&mut self.late, events);
        events.sort_by_key(|e| e.0);
    }
}

/// Where every op's task starts on the time line: what a just-in-time receive is placed before.
pub(super) struct Starts {
    slots: OpSlots,
    /// Per op, the moment its task starts.
    start: Vec<Moment>,
}

impl Starts {
    /// Indexes the start of every op's task on `timeline`.
    pub(super) fn index(links: &Links, timeline: &[Vec<TimedTask>]) -> Starts {
        let slots = links.slots();
        let mut start = vec![(0, 0); slots.len()];
        for t in timeline.iter().flatten() {
            let (ops, count) = t.task.op_array();
            for &op in &ops[..count] {
                let slot = slots.op(op).expect("replayed ops are in range");
                start[slot] = (time_bits(t.start), 2 * t.sequence as u64);
            }
        }
        Starts { slots, start }
    }

    /// The start of the task that consumes `message`: the forward of the receiving stage for an
    /// activation, its input-gradient backward for a gradient.
    fn of_consumer(&self, message: &Message) -> Moment {
        let kind = match message.direction {
            Direction::Activation => OpKind::Forward,
            Direction::Gradient => OpKind::InputGrad,
        };
        let op = Op::new(kind, message.to_stage, message.microbatch);
        let slot = self.slots.op(op).expect("replayed ops are in range");
        self.start[slot]
    }
}

/// A receive placed just in time: (peer, producing sequence, consumer's moment, message).
type LateReceive = (RankId, usize, Moment, Message);

/// Places just-in-time receives right before their consumers, except that the receives from one
/// peer keep the order of that peer's sends (the k-th send matches the k-th receive): a receive
/// moves earlier when a later message of the same peer is needed sooner.
fn place_just_in_time(late: &mut [LateReceive], events: &mut Vec<Keyed>) {
    // The peer sends in the order (producing sequence, message key).
    late.sort_by_key(|&(peer, produced, _, m)| (peer, produced, message_key(&m)));
    let mut bound: Moment = (u64::MAX, u64::MAX);
    let mut current_peer = None;
    for &(peer, produced, consumer, message) in late.iter().rev() {
        if current_peer != Some(peer) {
            current_peer = Some(peer);
            bound = (u64::MAX, u64::MAX);
        }
        bound = bound.min(consumer);
        // The peer's send order: by producing task, then activation before gradient.
        let tiebreak = ((produced as u64) << 1) | direction_bit(&message);
        events.push((
            EventKey::new(bound, EventClass::JustInTimeReceive, tiebreak),
            Event::Comm(CommOp::Recv {
                from: peer,
                message,
            }),
        ));
    }
}
