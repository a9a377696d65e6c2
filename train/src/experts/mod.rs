//! Mixtures of experts in training: the load-balancing loss's share per microbatch
//! ([`per_microbatch_aux`]) and expert parallelism ([`ExpertParallel`]).
//!
//! **Expert parallelism** (`--expert-parallel X`): every pipeline rank of every data-parallel
//! replica is `X` expert ranks (world `D x P x X`, world rank `(d·X + x)·P + p`). The `X` ranks of
//! a pipeline rank run the same program on the same microbatches: each runs the attention, the
//! layer norms, the router, the embedding and the head on every token (replicated, the same
//! bits), holds and runs only its `E/X` experts (kernels' [`ExpertPlacement`]: expert rank `x`
//! holds experts `x·E/X .. (x+1)·E/X`), and exchanges rows with the others of its group
//! (`exchange.rs`): in each forward of a mixture every rank sends its experts' outputs to every
//! other (the combine's all-to-all), in each input backward its experts' input gradients (the
//! dispatch backward's). The dispatch itself needs no message: every rank has every token's row.
//! Each expert sees the same rows in the same order as on one rank, and the combine adds them in
//! one order, so `X > 1` gives the bits of `X = 1`.
//!
//! Why replicate the tokens rather than split each microbatch's sequences over the `X` ranks:
//! with a split, the attention's and the router's weight gradients would be sums of `X` partial
//! products (a product over fewer rows may round differently, and its sum is made in another
//! order) and the load-balancing loss would be each slice's, so no split could give the bits of
//! one rank.
//!
//! Weight gradients: the gradients of the replicated parameters are the same on every expert
//! rank (the same computation); an expert's come from the rank holding it. The threads backend
//! keeps one fold per expert rank and takes each parameter's sum from its owner
//! (`ExpertParallel::merge`): expert rank 0 for the replicated ones, the holder for an
//! expert's. Evaluation (forward only) runs every expert on its pipeline rank: the same outputs.
//! The MPI backend runs each expert rank as a process of its own (`mpi_exchange.rs`: the
//! exchange between a group's processes, and the owners' gradients gathered within the group).

mod exchange;
#[cfg(feature = "mpi")]
pub(crate) mod mpi_exchange;
pub(crate) mod slot;
mod watched;

pub(crate) use exchange::ExpertGroups;
pub(crate) use watched::Watched;

use crate::error::TrainError;
use candle_core::Tensor;
use pipeweave_kernels::{
    ExchangePhase, ExpertExchange, ExpertPlacement, ExpertRows, ExpertShard, GptConfig,
    KernelError, StageModel,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One of the `X` expert ranks of a pipeline rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertRank(u32);

impl ExpertRank {
    /// Expert rank `x`.
    pub fn new(x: u32) -> Self {
        ExpertRank(x)
    }

    /// Its index.
    pub fn get(self) -> u32 {
        self.0
    }
}

/// `config` with its mixture's load-balancing coefficient divided by `microbatches` (the global
/// batch's microbatches, times the sequence chunks of each where a plan splits sequences): each
/// microbatch's backward adds its own loss, so the step's is the mean over microbatches, times
/// the coefficient, summed over the layers. A model without a mixture is unchanged.
pub fn per_microbatch_aux(
    config: &GptConfig,
    microbatches: usize,
) -> Result<GptConfig, TrainError> {
    let Some(moe) = config.moe() else {
        return Ok(*config);
    };
    let scaled = moe
        .with_aux_coefficient(moe.aux_coefficient() / microbatches.max(1) as f64)
        .map_err(TrainError::kernel_config("the load-balancing coefficient"))?;
    Ok(config.with_moe(scaled))
}

/// Waits until `latency` has passed since `issued`: an exchange issued then ends no sooner, as
/// over an interconnect whose all-to-all takes that long (`--exchange-latency`, to measure what
/// an overlapped pair hides where the exchange costs time; zero on a real run).
/// The rank's compute slot is given up for the sleep only, so an exchange that needs none keeps
/// it.
pub(crate) fn settle(issued: Instant, latency: Duration) {
    if let Some(rest) = latency.checked_sub(issued.elapsed()) {
        slot::while_waiting(|| std::thread::sleep(rest));
    }
}

/// A model's expert parallelism: each expert rank's shard, and which rank's gradient each
/// parameter of each position takes.
#[derive(Debug, Clone)]
pub struct ExpertParallel {
    shards: Vec<ExpertShard>,
    /// Per position, per parameter (in the whole model's order): the expert rank whose
    /// gradients give it and its index among that rank's.
    owners: Vec<Vec<(usize, usize)>>,
}

impl ExpertParallel {
    /// `ranks` expert ranks over the experts of `config`, whose positions' models are `models`
    /// (as one rank holding every expert has them). `ranks` must divide the experts.
    pub fn new(config: &GptConfig, models: &[StageModel], ranks: u32) -> Result<Self, TrainError> {
        let experts = config.moe().map_or(0, |moe| moe.experts());
        if config.moe().is_none() {
            return Err(TrainError::invalid(
                "expert ranks",
                ranks,
                "expert parallelism needs a mixture of experts (--experts)",
            ));
        }
        let shards = ExpertShard::all(ranks as usize, experts)
            .map_err(TrainError::kernel_config("the expert ranks"))?;
        let owners = models
            .iter()
            .enumerate()
            .map(|(k, model)| owners_of(k, model, &shards))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExpertParallel { shards, owners })
    }

    /// The number of expert ranks `X`.
    pub fn ranks(&self) -> u32 {
        self.shards.len() as u32
    }

    /// Expert rank `x`'s placement, exchanging through `exchange`.
    pub(crate) fn placement(
        &self,
        x: ExpertRank,
        exchange: Arc<dyn ExpertExchange>,
    ) -> Result<ExpertPlacement, TrainError> {
        let shard = self.shards.get(x.get() as usize).ok_or_else(|| {
            TrainError::invariant(format!("no expert rank {} of {}", x.get(), self.ranks()))
        })?;
        Ok(ExpertPlacement::new(*shard, exchange))
    }

    /// Every position's gradients, in the whole model's parameter order, from each expert
    /// rank's (`per_rank[x][k]`: rank `x`'s sums at position `k`, in its own order).
    pub(crate) fn merge(
        &self,
        per_rank: &[Vec<Vec<Tensor>>],
    ) -> Result<Vec<Vec<Tensor>>, TrainError> {
        self.owners
            .iter()
            .enumerate()
            .map(|(k, owners)| {
                owners
                    .iter()
                    .map(|&(x, i)| {
                        let grad = per_rank
                            .get(x)
                            .and_then(|r| r.get(k))
                            .and_then(|g| g.get(i));
                        grad.cloned().ok_or_else(|| {
                            TrainError::invariant(format!(
                                "expert rank {x} has no gradient {i} at position {k}"
                            ))
                        })
                    })
                    .collect()
            })
            .collect()
    }
}

/// Which expert rank's gradient gives each parameter of position `k`'s `model`: the first rank
/// whose share of the model has it (rank 0 for the replicated parameters).
fn owners_of(
    k: usize,
    model: &StageModel,
    shards: &[ExpertShard],
) -> Result<Vec<(usize, usize)>, TrainError> {
    let mut held: Vec<HashMap<String, usize>> = Vec::with_capacity(shards.len());
    for &shard in shards {
        let placement = ExpertPlacement::new(shard, Arc::new(Unconnected));
        let share = model
            .clone()
            .with_experts(&placement)
            .map_err(TrainError::kernel_config(format!(
                "the expert ranks of position {k}"
            )))?;
        let names = share.parameter_names().into_iter();
        held.push(names.enumerate().map(|(i, name)| (name, i)).collect());
    }
    model
        .parameter_names()
        .into_iter()
        .map(|name| {
            held.iter()
                .enumerate()
                .find_map(|(x, names)| names.get(&name).map(|&i| (x, i)))
                .ok_or_else(|| {
                    TrainError::invariant(format!("no expert rank holds the parameter {name}"))
                })
        })
        .collect()
}

/// The exchange of a placement that only lists a rank's parameters: it never runs a layer.
#[derive(Debug)]
struct Unconnected;

impl ExpertExchange for Unconnected {
    fn exchange(
        &self,
        phase: ExchangePhase,
        _rows: Vec<ExpertRows>,
    ) -> Result<Vec<ExpertRows>, KernelError> {
        Err(KernelError::ExpertExchange {
            phase: phase.name(),
            reason: "a placement made to list parameters has no group".into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;
    use pipeweave_kernels::{MoeConfig, StageLayout};

    fn config() -> GptConfig {
        let moe = MoeConfig::new(4, 2, 16, 0.01).unwrap();
        GptConfig::new(1, 8, 2, 8).unwrap().with_moe(moe)
    }

    #[test]
    fn each_parameter_takes_its_gradient_from_its_owner() {
        let config = config();
        let layout = StageLayout::whole_model(&config);
        let model = StageModel::new(config, layout, 1, DType::F32).unwrap();
        let names = model.parameter_names();
        let parallel = ExpertParallel::new(&config, std::slice::from_ref(&model), 2).unwrap();
        let owner = |name: &str| {
            let i = names.iter().position(|n| n == name).unwrap();
            parallel.owners[0][i]
        };
        // Rank 1's share: the 8 replicated block parameters and the router after the embedding's
        // two, then experts 2 and 3.
        assert_eq!(owner("transformer.wte.weight"), (0, 0));
        assert_eq!(owner("transformer.h.0.moe.router.bias"), (0, 11));
        assert_eq!(owner("transformer.h.0.moe.experts.1.c_proj.bias"), (0, 19));
        assert_eq!(owner("transformer.h.0.moe.experts.2.c_fc.weight"), (1, 12));
        assert_eq!(owner("lm_head.weight"), (0, 22));
        let tensor = |v: f32| Tensor::new(&[v], &candle_core::Device::Cpu).unwrap();
        let per_rank: Vec<Vec<Vec<Tensor>>> = (0..2)
            .map(|x| vec![(0..23).map(|i| tensor((100 * x + i) as f32)).collect()])
            .collect();
        let merged = parallel.merge(&per_rank).unwrap();
        let value = |name: &str| {
            let i = names.iter().position(|n| n == name).unwrap();
            merged[0][i].to_vec1::<f32>().unwrap()[0]
        };
        assert_eq!(value("transformer.h.0.moe.experts.3.c_proj.bias"), 119.0);
        assert_eq!(value("transformer.h.0.attn.c_attn.weight"), 4.0);
        assert!(ExpertParallel::new(&config, &[model], 3).is_err());
    }

    #[test]
    fn the_balancing_loss_is_shared_by_the_microbatches() {
        let scaled = per_microbatch_aux(&config(), 8).unwrap();
        assert_eq!(scaled.moe().unwrap().aux_coefficient(), 0.01 / 8.0);
        let dense = GptConfig::new(1, 8, 2, 8).unwrap();
        assert_eq!(per_microbatch_aux(&dense, 8).unwrap(), dense);
    }
}
