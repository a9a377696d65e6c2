//! The one home of "which dependencies cross ranks, and what travels": the inputs a task needs from
//! other ranks and the outputs it owes them. The projection places the sends and receives these
//! name; the checker demands them of any program.

use crate::ir::deps::Links;
use crate::ir::ids::{MicrobatchId, RankId, StageId};
use crate::ir::op::{Op, OpKind, Task};
use crate::spmd::program::{Direction, Message};

/// An input of a task that another rank produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteInput {
    /// The rank that produces it.
    pub from: RankId,
    /// The op that produces it.
    pub producer: Op,
    /// The op of the task that consumes it.
    pub consumer: Op,
    /// What travels.
    pub message: Message,
}

/// An output of a task that another rank consumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteOutput {
    /// The rank that consumes it.
    pub to: RankId,
    /// The op of the task that produces it.
    pub producer: Op,
    /// What travels.
    pub message: Message,
}

/// The inputs `task`, run on `rank`, needs from other ranks (dependencies inside the task or on
/// the same rank travel nowhere; a stage out of range is the verifier's to report). `links` are
/// the problem's dependency tables.
#[inline]
pub fn remote_inputs<'a>(
    links: &'a Links,
    rank: RankId,
    task: &Task,
) -> impl Iterator<Item = RemoteInput> + 'a {
    let (ops, count) = task.op_array();
    (0..count).flat_map(move |k| {
        let consumer = ops[k];
        links.predecessors(consumer).filter_map(move |producer| {
            if ops[..count].contains(&producer) {
                return None;
            }
            let from = links.owner(producer.stage)?;
            (from != rank).then(|| RemoteInput {
                from,
                producer,
                consumer,
                message: Message::carrying(producer, consumer),
            })
        })
    })
}

/// The outputs of `task`, run on `rank`, that other ranks consume: a forward's activation when the
/// next stage of the route is elsewhere, an input-gradient backward's gradient when the previous
/// one is.
#[inline]
pub fn remote_outputs<'a>(
    links: &'a Links,
    rank: RankId,
    task: &Task,
) -> impl Iterator<Item = RemoteOutput> + 'a {
    let (ops, count) = task.op_array();
    (0..count).filter_map(move |k| remote_output(links, rank, ops[k]))
}

/// The output of `producer`, run on `rank`, that another rank consumes, if any: see
/// [`remote_outputs`].
#[inline]
pub fn remote_output(links: &Links, rank: RankId, producer: Op) -> Option<RemoteOutput> {
    let direction = match producer.kind {
        OpKind::Forward => Direction::Activation,
        OpKind::InputGrad => Direction::Gradient,
        OpKind::WeightGrad => return None,
    };
    let message = edge_message(links, producer.stage, producer.microbatch, direction)?;
    let to = links.owner(message.to_stage).filter(|&to| to != rank)?;
    Some(RemoteOutput {
        to,
        producer,
        message,
    })
}

/// The message `stage` sends for `microbatch` in `direction` across an edge of the microbatch's
/// route: its activation to the next stage, its gradient to the previous one (none at that end
/// of the route).
#[inline]
pub fn edge_message(
    links: &Links,
    stage: StageId,
    microbatch: MicrobatchId,
    direction: Direction,
) -> Option<Message> {
    match direction {
        Direction::Activation => links
            .next(stage, microbatch)
            .map(|next| Message::activation(stage, next, microbatch)),
        Direction::Gradient => links
            .prev(stage, microbatch)
            .map(|prev| Message::gradient(stage, prev, microbatch)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::problem::ProblemSpec;

    #[test]
    fn inputs_and_outputs_cross_rank_boundaries_only() {
        // Two ranks, stages 0 and 2 on rank 0, stage 1 on rank 1.
        let problem = ProblemSpec::builder()
            .ranks(2)
            .microbatches(1)
            .stage_to_rank(vec![0, 1, 0])
            .build()
            .validate()
            .unwrap();
        let links = Links::of(&problem);
        let task: Task = "1F0".parse().unwrap();
        let inputs: Vec<RemoteInput> = remote_inputs(&links, RankId::new(1), &task).collect();
        assert_eq!(inputs.len(), 1);
        assert_eq!(inputs[0].message.to_string(), "act(stage 0 -> 1, mb 0)");
        let outputs: Vec<RemoteOutput> = remote_outputs(&links, RankId::new(1), &task).collect();
        assert_eq!(outputs[0].to, RankId::new(0));
        let backward: Task = "1B0".parse().unwrap();
        let needs: Vec<String> = remote_inputs(&links, RankId::new(1), &backward)
            .map(|i| i.message.to_string())
            .collect();
        assert_eq!(needs, ["grad(stage 2 -> 1, mb 0)"]);
        assert_eq!(outputs[0].message.producer().to_string(), "1F0");
        // The last stage's forward feeds the loss, not another rank.
        assert!(
            remote_outputs(&links, RankId::new(0), &"2F0".parse().unwrap())
                .next()
                .is_none()
        );
    }
}
