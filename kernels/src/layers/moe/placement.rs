//! Where a [`Moe`]'s experts run (expert parallelism): an [`ExpertPlacement`] is one rank's
//! [`ExpertShard`] and the [`ExpertExchange`] it shares with the other ranks of its group, and
//! [`Moe::on_shard`] is the mixture as that rank runs it.
//!
//! The ranks of a group run the same layer on the same tokens: each routes every token (the
//! same routing, bit for bit: the same input and router), dispatches the rows of its own experts
//! only and runs only those experts; the exchange then hands each rank's expert outputs to every
//! other rank (phase [`ExchangePhase::Combine`]), so that every rank combines every expert's
//! outputs, experts ascending, into the same output as one rank holding every expert. The
//! backward mirrors it: every rank takes the output gradient of its own experts from the combine's
//! backward, runs their input backward, and the exchange hands the experts' input gradients to
//! every rank ([`ExchangePhase::DispatchBackward`]) for the dispatch's backward. Each expert sees
//! the same rows in the same order on any number of ranks, and the sums into token rows are made
//! in one order, so a group of any size gives the bits of one rank (`tests.rs`).

use std::fmt;
use std::sync::Arc;

use super::experts::ExpertRows;
use super::Moe;
use crate::config::ExpertShard;
use crate::error::Result;

/// Which of a [`Moe`]'s exchanges a rank takes part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExchangePhase {
    /// The forward: each rank's experts' outputs, for every rank's combine.
    Combine,
    /// The input backward: each rank's experts' input gradients, for every rank's dispatch
    /// backward.
    DispatchBackward,
}

impl ExchangePhase {
    /// The phase's name in messages (`combine`, `dispatch_backward`).
    pub fn name(self) -> &'static str {
        match self {
            ExchangePhase::Combine => "combine",
            ExchangePhase::DispatchBackward => "dispatch_backward",
        }
    }
}

impl fmt::Display for ExchangePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the expert-parallel ranks of a group hand each other their experts' rows: an all-to-all
/// in which each rank sends the rows of its experts to every other rank of the group.
///
/// Every rank of a group calls it for the same layers in the same order within each phase (they
/// run the same program), once per phase of each forward and input backward of a mixture; an
/// implementation may rely on that order to match the calls of a phase. The two phases' orders
/// are independent: a rank running an overlapped forward and backward (DualPipe's pair) calls the
/// combine and the dispatch backward from two threads at once, so an implementation matches
/// calls by phase and number within the phase, takes calls of the two phases concurrently, and
/// never blocks a send on the peer's receive. It should fail rather than wait forever when a
/// rank of the group is gone ([`crate::KernelError::ExpertExchange`]).
pub trait ExpertExchange: Send + Sync + fmt::Debug {
    /// Hands `rows` (this rank's experts' rows: one entry per expert it ran) to every other rank
    /// of the group and returns every rank's rows, this rank's included, in any order.
    fn exchange(&self, phase: ExchangePhase, rows: Vec<ExpertRows>) -> Result<Vec<ExpertRows>>;
}

/// One expert-parallel rank's place: the experts it holds and runs, and its group's exchange.
#[derive(Debug, Clone)]
pub struct ExpertPlacement {
    shard: ExpertShard,
    exchange: Arc<dyn ExpertExchange>,
}

impl ExpertPlacement {
    /// The rank of `shard`, exchanging rows with its group through `exchange`.
    pub fn new(shard: ExpertShard, exchange: Arc<dyn ExpertExchange>) -> Self {
        ExpertPlacement { shard, exchange }
    }

    /// The experts this rank holds.
    pub fn shard(&self) -> ExpertShard {
        self.shard
    }

    /// The group's exchange.
    pub fn exchange(&self) -> &dyn ExpertExchange {
        self.exchange.as_ref()
    }
}

impl Moe {
    /// The mixture as the rank of `placement` runs it: holding only its shard's experts (the
    /// parameters shared with this layer's, not copied), exchanging the experts' rows with its
    /// group in the forward and the input backward. Its parameters and weight gradients are the
    /// router's and its experts'.
    pub fn on_shard(&self, placement: &ExpertPlacement) -> Result<Moe> {
        let shard = placement.shard();
        Ok(Moe {
            bank: self.shard_bank(shard)?,
            placement: Some(placement.clone()),
            ..self.clone()
        })
    }

    /// The experts this layer runs: its placement's, else all.
    pub fn shard(&self) -> ExpertShard {
        match &self.placement {
            Some(placement) => placement.shard(),
            None => ExpertShard::whole(&self.config),
        }
    }

    /// Every expert's rows of `phase` from this rank's `own`: through the placement's exchange,
    /// or `own` where this rank runs every expert.
    pub(super) fn gather(
        &self,
        phase: ExchangePhase,
        own: Vec<ExpertRows>,
    ) -> Result<Vec<ExpertRows>> {
        match &self.placement {
            Some(placement) => placement.exchange().exchange(phase, own),
            None => Ok(own),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::sync::Mutex;

    use candle_core::{DType, Tensor};

    use super::*;
    use crate::config::MoeConfig;
    use crate::layers::moe::tests::{assert_same_run, build, params, run_layer, sharded_case, Run};
    use crate::layers::protocol::Layer;
    use crate::testing::{ops, random, DTYPES};
    use crate::KernelError;

    /// A group's exchange over channels: each rank sends its rows to every other rank and
    /// receives theirs (a peer gone: an error).
    #[derive(Debug)]
    struct Channels {
        to: Vec<Sender<Vec<ExpertRows>>>,
        from: Mutex<Vec<Receiver<Vec<ExpertRows>>>>,
    }

    /// The endpoints of a group of `ranks`, by rank.
    fn group(ranks: usize) -> Vec<Channels> {
        let mut to: Vec<Vec<Sender<Vec<ExpertRows>>>> = (0..ranks).map(|_| Vec::new()).collect();
        let mut from: Vec<Vec<Receiver<Vec<ExpertRows>>>> =
            (0..ranks).map(|_| Vec::new()).collect();
        for (sender, outbox) in to.iter_mut().enumerate() {
            for receiver in (0..ranks).filter(|&r| r != sender) {
                let (tx, rx) = channel();
                outbox.push(tx);
                from[receiver].push(rx);
            }
        }
        to.into_iter()
            .zip(from)
            .map(|(to, from)| Channels {
                to,
                from: Mutex::new(from),
            })
            .collect()
    }

    impl ExpertExchange for Channels {
        fn exchange(&self, phase: ExchangePhase, rows: Vec<ExpertRows>) -> Result<Vec<ExpertRows>> {
            let gone = || KernelError::ExpertExchange {
                phase: phase.name(),
                reason: "a rank of the group is gone".into(),
            };
            for peer in &self.to {
                peer.send(rows.clone()).map_err(|_| gone())?;
            }
            let mut all = rows;
            for peer in self.from.lock().map_err(|_| gone())?.iter() {
                all.extend(peer.recv().map_err(|_| gone())?);
            }
            Ok(all)
        }
    }

    /// Every rank of a group of `ranks` running `layer` on its shard, each on its own thread.
    fn run_group(layer: &Moe, input: &Tensor, grad: &Tensor, ranks: usize) -> Vec<Run> {
        let shards = ExpertShard::all(ranks, layer.config().experts()).unwrap();
        std::thread::scope(|scope| {
            let handles: Vec<_> = shards
                .into_iter()
                .zip(group(ranks))
                .map(|(shard, channels)| {
                    let placement = ExpertPlacement::new(shard, Arc::new(channels));
                    let placed = layer.on_shard(&placement).unwrap();
                    scope.spawn(move || run_layer(&placed, input, grad))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn every_rank_of_a_group_gives_the_whole_layers_bits() {
        for dtype in DTYPES {
            let (layer, input, grad) = sharded_case(dtype);
            let (output, grad_input, grads) = run_layer(&layer, &input, &grad);
            for ranks in [1, 2, 4] {
                for (rank, placed) in run_group(&layer, &input, &grad, ranks).iter().enumerate() {
                    // The router's two gradients, then the rank's experts' four each.
                    let per_rank = 4 / ranks;
                    let experts = 2 + 4 * rank * per_rank..2 + 4 * (rank + 1) * per_rank;
                    let grads = grads[..2].iter().chain(&grads[experts]).cloned();
                    let expected = (output.clone(), grad_input.clone(), grads.collect());
                    assert_same_run(
                        &format!("{dtype:?} rank {rank} of {ranks}"),
                        placed,
                        &expected,
                    );
                }
            }
        }
    }

    #[test]
    fn a_rank_holds_its_shards_experts_only() {
        let config = MoeConfig::new(4, 2, 8, 0.01).unwrap();
        let layer = build(&params(4, &config, DType::F64, 1), &config);
        let channels = group(2).pop().unwrap();
        let shard = ExpertShard::new(1, 2, 4).unwrap();
        let placed = layer
            .on_shard(&ExpertPlacement::new(shard, Arc::new(channels)))
            .unwrap();
        assert_eq!((placed.bank().held(), placed.shard()), (2..4, shard));
        let names: Vec<String> = crate::layers::NamedParameters::parameters(&placed)
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(names.len(), 2 + 2 * 4);
        assert_eq!(names[2], "experts.2.c_fc.weight");
        let foreign = ExpertShard::new(0, 2, 6).unwrap();
        let channels = group(2).pop().unwrap();
        let err = layer
            .on_shard(&ExpertPlacement::new(foreign, Arc::new(channels)))
            .unwrap_err();
        assert!(err.to_string().contains("a shard of 6 experts"), "{err}");
    }

    #[test]
    fn a_rank_whose_peer_is_gone_fails_instead_of_waiting() {
        let config = MoeConfig::new(2, 1, 8, 0.01).unwrap();
        let layer = build(&params(4, &config, DType::F64, 2), &config);
        let mut endpoints = group(2);
        let ours = endpoints.remove(0);
        drop(endpoints);
        let shard = ExpertShard::new(0, 2, 2).unwrap();
        let placed = layer
            .on_shard(&ExpertPlacement::new(shard, Arc::new(ours)))
            .unwrap();
        let input = random(3, &[1, 3, 4], 1.0, DType::F64);
        let err = placed.forward(&ops(), &input).unwrap_err();
        assert!(err.is_exchange_failure(), "{err}");
        assert_eq!(
            err.to_string(),
            "expert exchange (combine): a rank of the group is gone"
        );
    }
}
