//! What a cut of a [`LayerTable`] costs: each stage's summed figures under one count of free
//! layers per stage ([`LayerTable::cut`], [`CutCosts`]), and each position's figures of any
//! problem a pass builds from a cut by one count per rank ([`LayerLayout::stages_of`]).

use super::{bad, LayerCosts, LayerTable};
use crate::error::CoreError;
use crate::ir::blocks::{cut_violation, spread_shares};
use crate::ir::cost::{StageCosts, StageCostsSpec};
use crate::ir::memory::{StageMemory, StageMemorySpec};
use crate::ir::problem::Problem;
use std::hash::{Hash, Hasher};

/// Every stage's costs and activation memory.
pub type StageFigures = (Vec<StageCosts>, Vec<StageMemory>);

/// Each stage's costs and activation memory under a cut of a [`LayerTable`].
#[derive(Clone, Debug, PartialEq)]
pub struct CutCosts {
    /// Free layers per stage.
    pub layers_per_stage: Vec<usize>,
    /// Seconds per stage.
    pub costs: Vec<StageCosts>,
    /// The seconds of one activation's send.
    pub comm: f64,
    /// Activation memory per stage, in units of `bytes_per_unit` bytes: `total` is the larger
    /// of what the stage's forward and its input gradient leave, `weight_grad` what the input
    /// gradient leaves.
    pub memory: Vec<StageMemory>,
    /// Bytes of one memory unit: the heaviest stage's activations of one microbatch, so a
    /// schedule's `memory=N` still counts microbatches (of the heaviest stage).
    pub bytes_per_unit: f64,
}

impl LayerTable {
    /// Each stage's summed costs and memory under `layers_per_stage` (one count of free layers
    /// per stage, summing to the free layers; a stage without a pinned layer needs one).
    pub fn cut(&self, layers_per_stage: &[usize]) -> Result<CutCosts, CoreError> {
        let ranges = self.stage_layers(layers_per_stage)?;
        let mut sums = Vec::with_capacity(ranges.len());
        for range in ranges {
            let members = &self.layers[range];
            let f: f64 = members.iter().map(|l| l.forward()).sum();
            let i: f64 = members.iter().map(|l| l.input_grad()).sum();
            let w: f64 = members.iter().map(|l| l.weight_grad()).sum();
            // The fused backward as measured where every layer's was, else the split's sum.
            let b: Option<f64> = members
                .iter()
                .all(LayerCosts::backward_measured)
                .then(|| members.iter().map(LayerCosts::full_backward).sum());
            let left: u64 = members.iter().map(|l| l.activation_bytes).sum();
            let held: u64 = members.iter().map(|l| l.weight_grad_bytes).sum();
            // The memory model holds a forward's figure until I and a part of it until W, so
            // where I leaves more than F did, the forward is charged that from its start: a
            // peak is never under-counted (over-counted by the difference only between F and
            // I).
            sums.push(((f, i, w, b), left.max(held), held));
        }
        let heaviest = sums.iter().map(|s| s.1).max().unwrap_or(0).max(1) as f64;
        // Every compute action also pays the runtime's own cost of running it.
        let action = self.action_seconds();
        let costs = sums
            .iter()
            .map(|&((f, i, w, b), _, _)| {
                StageCostsSpec::builder()
                    .forward(f + action)
                    .input_grad(i + action)
                    .weight_grad(w + action)
                    .full_backward_opt(b.map(|b| b + action))
                    .build()
                    .validate()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let memory = sums
            .iter()
            .map(|&(_, total, held)| {
                StageMemorySpec::builder()
                    .total(total as f64 / heaviest)
                    .weight_grad(held as f64 / heaviest)
                    .build()
                    .validate()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CutCosts {
            layers_per_stage: layers_per_stage.to_vec(),
            costs,
            comm: self.comm,
            memory,
            bytes_per_unit: heaviest,
        })
    }
}

/// A layer table cut by one count of free layers per rank (or evenly), as the figures of any
/// layout a pass builds from it: every stage gets the costs and memory of the layers at its
/// position, as the trainer places them (a rank's count spread over its positions by
/// [`spread_shares`]; without counts, the free layers even over the positions), rather than an
/// even part of its rank's share. Memory is in units of `bytes_per_unit` bytes, the cut's.
#[derive(Clone, Debug)]
pub struct LayerLayout {
    table: LayerTable,
    shares: Option<Vec<usize>>,
    bytes_per_unit: f64,
    /// Tokens per sequence of the model measured, where known (a sequence split cuts them).
    sequence: Option<u32>,
}

impl LayerLayout {
    /// `table` cut by `shares` (one count per rank; `None`: even over each layout's
    /// positions), memory counted in units of `bytes_per_unit` bytes (finite, > 0).
    pub fn new(
        table: LayerTable,
        shares: Option<Vec<usize>>,
        bytes_per_unit: f64,
    ) -> Result<LayerLayout, CoreError> {
        if !(bytes_per_unit.is_finite() && bytes_per_unit > 0.0) {
            return Err(bad(format!(
                "a memory unit of {bytes_per_unit} bytes must be finite and > 0"
            )));
        }
        Ok(LayerLayout {
            table,
            shares,
            bytes_per_unit,
            sequence: None,
        })
    }

    /// The same layout of a model whose sequences have `tokens` tokens (the profile's
    /// `seq_len`), which a sequence split cuts.
    pub fn with_sequence(mut self, tokens: Option<u32>) -> LayerLayout {
        self.sequence = tokens;
        self
    }

    /// Tokens per sequence, where the model gives them.
    pub fn sequence(&self) -> Option<u32> {
        self.sequence
    }

    /// The layers.
    pub fn table(&self) -> &LayerTable {
        &self.table
    }

    /// Free layers per rank, where given.
    pub fn shares(&self) -> Option<&[usize]> {
        self.shares.as_deref()
    }

    /// Bytes of one memory unit.
    pub fn bytes_per_unit(&self) -> f64 {
        self.bytes_per_unit
    }

    /// Free layers per position of `problem`'s routes, or `None` where it has no route or a
    /// stage has no rank.
    pub fn positions_of(&self, problem: &Problem) -> Option<Vec<usize>> {
        let route = problem.routes().first()?;
        let owners = route
            .stages()
            .iter()
            .map(|&s| problem.rank_of(s).map(|r| r.index()))
            .collect::<Option<Vec<usize>>>()?;
        Some(match &self.shares {
            Some(shares) if shares.len() == problem.ranks() as usize => {
                spread_shares(&owners, shares)
            }
            _ => self.table.even_cut(owners.len()),
        })
    }

    /// The costs and activation memory of every stage of `problem` (one entry per stage, memory
    /// in units of [`LayerLayout::bytes_per_unit`] bytes); `Ok(None)` where its routes differ
    /// in length or leave a stage out (then a pass divides evenly), an error where the layers
    /// cannot be placed on `problem`'s positions.
    pub fn stages_of(&self, problem: &Problem) -> Result<Option<StageFigures>, CoreError> {
        let Some(counts) = self.positions_of(problem) else {
            return Ok(None);
        };
        let shown = |c: &[usize]| c.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let (free, pinned) = (self.table.free_layers(), self.table.pinned());
        if let Some(reason) = cut_violation(&counts, free, &pinned) {
            return Err(bad(match &self.shares {
                Some(shares) => format!(
                    "--layers-per-stage {} (one count per rank) spread over the {} positions \
                     of this layout is {}: {reason}",
                    shown(shares),
                    counts.len(),
                    shown(&counts)
                ),
                None => reason,
            }));
        }
        let cut = self.table.cut(&counts)?;
        let mut position = vec![None; problem.stages() as usize];
        for route in problem.routes() {
            if route.stages().len() != counts.len() {
                return Ok(None);
            }
            for (k, stage) in route.stages().iter().enumerate() {
                if let Some(slot) = position.get_mut(stage.index()) {
                    *slot = Some(k);
                }
            }
        }
        let rescale = cut.bytes_per_unit / self.bytes_per_unit;
        let mut costs = Vec::with_capacity(position.len());
        let mut memory = Vec::with_capacity(position.len());
        for k in position {
            let Some(k) = k else {
                return Ok(None);
            };
            costs.push(cut.costs[k]);
            let m = cut.memory[k];
            memory.push(
                StageMemorySpec::builder()
                    .total(m.total() * rescale)
                    .weight_grad(m.weight_grad() * rescale)
                    .checkpoint(m.checkpoint() * rescale)
                    .build()
                    .validate()?,
            );
        }
        Ok(Some((costs, memory)))
    }
}

impl PartialEq for LayerLayout {
    fn eq(&self, other: &LayerLayout) -> bool {
        self.table == other.table
            && self.shares == other.shares
            && self.bytes_per_unit.to_bits() == other.bytes_per_unit.to_bits()
            && self.sequence == other.sequence
    }
}

impl Eq for LayerLayout {}

impl Hash for LayerLayout {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.table.hash(state);
        self.shares.hash(state);
        self.bytes_per_unit.to_bits().hash(state);
        self.sequence.hash(state);
    }
}
