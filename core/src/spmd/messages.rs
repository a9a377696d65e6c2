//! The one home of "which dependencies cross ranks, and what travels": the inputs a task needs from
//! other ranks and the outputs it owes them. The projection places the sends and receives these
//! name; the checker demands them of any program.

use crate::ir::deps::predecessors;
use crate::ir::ids::RankId;
use crate::ir::op::{Op, OpKind, Task};
use crate::ir::problem::Problem;
use crate::spmd::program::Message;
use smallvec::SmallVec;

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
/// the same rank travel nowhere; a stage out of range is the verifier's to report).
pub fn remote_inputs(problem: &Problem, rank: RankId, task: &Task) -> SmallVec<[RemoteInput; 4]> {
    let ops = task.ops();
    let mut out = SmallVec::new();
    for &consumer in &ops {
        for producer in predecessors(problem, consumer) {
            if ops.contains(&producer) {
                continue;
            }
            let Some(from) = problem.rank_of(producer.stage) else {
                continue;
            };
            if from != rank {
                out.push(RemoteInput {
                    from,
                    producer,
                    consumer,
                    message: Message::carrying(producer, consumer),
                });
            }
        }
    }
    out
}

/// The outputs of `task`, run on `rank`, that other ranks consume: a forward's activation when the
/// next stage of the route is elsewhere, an input-gradient backward's gradient when the previous
/// one is.
pub fn remote_outputs(problem: &Problem, rank: RankId, task: &Task) -> SmallVec<[RemoteOutput; 2]> {
    let mut out = SmallVec::new();
    for producer in task.ops() {
        let Some(route) = problem.route_of(producer.microbatch) else {
            continue;
        };
        let message = match producer.kind {
            OpKind::Forward => route
                .next(producer.stage)
                .map(|next| Message::activation(producer.stage, next, producer.microbatch)),
            OpKind::InputGrad => route
                .prev(producer.stage)
                .map(|prev| Message::gradient(producer.stage, prev, producer.microbatch)),
            OpKind::WeightGrad => None,
        };
        let Some(message) = message else { continue };
        match problem.rank_of(message.to_stage) {
            Some(to) if to != rank => out.push(RemoteOutput {
                to,
                producer,
                message,
            }),
            _ => {}
        }
    }
    out
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
        let task: Task = "1F0".parse().unwrap();
        let inputs = remote_inputs(&problem, RankId::new(1), &task);
        assert_eq!(inputs.len(), 1);
        assert_eq!(inputs[0].message.to_string(), "act(stage 0 -> 1, mb 0)");
        let outputs = remote_outputs(&problem, RankId::new(1), &task);
        assert_eq!(outputs[0].to, RankId::new(0));
        let backward: Task = "1B0".parse().unwrap();
        let needs: Vec<String> = remote_inputs(&problem, RankId::new(1), &backward)
            .iter()
            .map(|i| i.message.to_string())
            .collect();
        assert_eq!(needs, ["grad(stage 2 -> 1, mb 0)"]);
        assert_eq!(outputs[0].message.producer().to_string(), "1F0");
        // The last stage's forward feeds the loss, not another rank.
        assert!(remote_outputs(&problem, RankId::new(0), &"2F0".parse().unwrap()).is_empty());
    }
}
