//! From sizes and per-rank costs to the unscheduled plan the passes start from: the glue between a
//! user's description and the pass driver ([`crate::compile`] runs the passes).

use crate::error::Error;
use pipeweave_core::{
    simulate_shared, CostModel, CutCosts, LayerLayout, MemoryModel, Plan, ProblemSpec, Profile,
    ReplayError, Sharing, Simulation, StageCosts, StageMemory,
};
use std::num::NonZeroU32;

/// What `pipeweave plan` needs besides the expression: sizes, costs and memory of a rank's share.
#[derive(Clone, Debug, PartialEq)]
pub struct PipelineConfig {
    ranks: u32,
    microbatches: u32,
    costs: Vec<StageCosts>,
    comm: f64,
    memory: Vec<StageMemory>,
    memory_limit: Option<f64>,
    microbatch_scales: Vec<f64>,
    /// With a profile: the figures of every position of the layouts passes build.
    layout: Option<LayerLayout>,
    /// What the ranks share ([`simulate_shared`]): cores (where fewer than the ranks, they
    /// time-share them) and host links.
    sharing: Sharing,
}

impl PipelineConfig {
    /// Unit costs, no latency, every activation held until W, no memory limit.
    pub fn new(ranks: u32, microbatches: u32) -> Result<PipelineConfig, Error> {
        // Validate the sizes now so errors point at them rather than at a pass.
        ProblemSpec::builder()
            .ranks(ranks)
            .microbatches(microbatches)
            .build()
            .validate()?;
        Ok(PipelineConfig {
            ranks,
            microbatches,
            costs: vec![StageCosts::default(); ranks as usize],
            comm: 0.0,
            memory: vec![StageMemory::default(); ranks as usize],
            memory_limit: None,
            microbatch_scales: Vec::new(),
            layout: None,
            sharing: Sharing::default(),
        })
    }

    /// The same costs for every rank's share, and the cross-rank latency.
    pub fn with_costs(mut self, costs: StageCosts, comm: f64) -> Result<PipelineConfig, Error> {
        CostModel::uniform(1, costs, comm)?;
        self.costs = vec![costs; self.ranks as usize];
        self.comm = comm;
        self.layout = None;
        Ok(self)
    }

    /// Costs per rank's share (one entry per rank; uneven models).
    pub fn with_rank_costs(mut self, costs: Vec<StageCosts>) -> Result<PipelineConfig, Error> {
        self.one_per_rank("cost model", costs.len())?;
        self.costs = costs;
        self.layout = None;
        Ok(self)
    }

    /// The activation memory of one microbatch on a rank's share.
    pub fn with_memory(mut self, memory: StageMemory) -> PipelineConfig {
        self.memory = vec![memory; self.ranks as usize];
        self.layout = None;
        self
    }

    /// The activation memory of one microbatch on each rank's share (one entry per rank; uneven
    /// models).
    pub fn with_rank_memory(mut self, memory: Vec<StageMemory>) -> Result<PipelineConfig, Error> {
        self.one_per_rank("memory model", memory.len())?;
        self.memory = memory;
        self.layout = None;
        Ok(self)
    }

    /// Refuses a `model` of `entries` entries that is not one per rank.
    fn one_per_rank(&self, model: &'static str, entries: usize) -> Result<(), Error> {
        if entries == self.ranks as usize {
            Ok(())
        } else {
            Err(Error::Core(pipeweave_core::CoreError::StageCountMismatch {
                model,
                got: entries,
                expected: self.ranks as usize,
            }))
        }
    }

    /// Costs and memory of every rank's share from a measured profile, the model's blocks cut
    /// by `layers_per_stage` (one count per rank's share) or evenly; comm is one activation's
    /// measured send. Memory is in units of the heaviest share's activations of one microbatch
    /// ([`CutCosts::bytes_per_unit`] bytes each). Where `vpp` gives a rank several positions,
    /// each gets the figures of the layers the trainer places there ([`LayerLayout`]: the
    /// share spread over the rank's positions; without a cut, the blocks even over the
    /// positions), not an even part of the share.
    pub fn with_profile(
        self,
        profile: &Profile,
        layers_per_stage: Option<&[usize]>,
    ) -> Result<(PipelineConfig, CutCosts), Error> {
        let even = profile.even_cut(self.ranks as usize);
        let layers = layers_per_stage.unwrap_or(&even);
        if layers.len() != self.ranks as usize {
            return Err(Error::Option {
                option: "--layers-per-stage",
                message: format!(
                    "{} counts for {} ranks: give one block count per rank's share",
                    layers.len(),
                    self.ranks
                ),
            });
        }
        let cut = profile.cut(layers)?;
        CostModel::per_stage(cut.costs.clone(), cut.comm)?;
        let mut config = self;
        config.costs = cut.costs.clone();
        config.comm = cut.comm;
        config.memory = cut.memory.clone();
        config.layout = Some(
            LayerLayout::new(
                profile.table()?,
                layers_per_stage.map(<[usize]>::to_vec),
                cut.bytes_per_unit,
            )?
            .with_sequence(
                profile
                    .seq_len()
                    .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            ),
        );
        Ok((config, cut))
    }

    /// One cost factor per microbatch (variable-length microbatches: microbatch `m`'s ops take
    /// `scales[m]` times the share's figures); empty for none.
    pub fn with_microbatch_scales(mut self, scales: Vec<f64>) -> Result<PipelineConfig, Error> {
        if !scales.is_empty() && scales.len() != self.microbatches as usize {
            return Err(Error::Option {
                option: "microbatch costs",
                message: format!(
                    "{} cost factors for {} microbatches",
                    scales.len(),
                    self.microbatches
                ),
            });
        }
        CostModel::uniform(1, StageCosts::default(), 0.0)?
            .with_microbatch_scales(scales.clone())?;
        self.microbatch_scales = scales;
        Ok(self)
    }

    /// Ranks that time-share the machine's cores: room for `slots` ranks computing at full
    /// speed at once (cores over compute threads per rank; finite, > 0), or `None` for one
    /// core (or device) per rank. Only the simulation changes ([`PipelineConfig::simulate`]).
    pub fn with_shared_cores(mut self, slots: Option<f64>) -> Result<PipelineConfig, Error> {
        if let Some(s) = slots {
            if !(s.is_finite() && s > 0.0) {
                return Err(Error::Option {
                    option: "--cores",
                    message: format!("room for {s} ranks: give a positive number of cores"),
                });
            }
        }
        self.sharing = self.sharing.with_cores(slots);
        Ok(self)
    }

    /// `ranks` consecutive ranks on each host link (1, the default: a link per rank; 2:
    /// neighbours share one; 4: four GPUs behind one PCIe switch): their transfers share the
    /// link's speed while they overlap. Only the simulation changes ([`PipelineConfig::simulate`]).
    pub fn with_ranks_per_link(mut self, ranks: u32) -> Result<PipelineConfig, Error> {
        let Some(ranks) = NonZeroU32::new(ranks) else {
            return Err(Error::Option {
                option: "--ranks-per-link",
                message: "0 ranks per host link: give 1 (a link per rank) or more".into(),
            });
        };
        self.sharing = self.sharing.with_ranks_per_link(ranks);
        Ok(self)
    }

    /// What the ranks share: cores and host links.
    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// Simulates `plan` on this configuration's machine: ranks time-share the cores where
    /// [`PipelineConfig::with_shared_cores`] gave fewer than the ranks, and their host links
    /// as [`PipelineConfig::with_ranks_per_link`] groups them.
    pub fn simulate(&self, plan: &Plan) -> Result<Simulation, ReplayError> {
        simulate_shared(plan, self.sharing)
    }

    /// A per-rank activation-memory bound the verifier enforces after every pass.
    pub fn with_memory_limit(mut self, limit: Option<f64>) -> PipelineConfig {
        self.memory_limit = limit;
        self
    }

    /// The activation memory of one microbatch on a rank's share (the heaviest share's where
    /// they differ).
    pub fn memory(&self) -> StageMemory {
        self.memory
            .iter()
            .copied()
            .max_by(|a, b| a.total().total_cmp(&b.total()))
            .unwrap_or_default()
    }

    /// The declared per-rank memory limit, if any.
    pub fn memory_limit(&self) -> Option<f64> {
        self.memory_limit
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Number of microbatches.
    pub fn microbatches(&self) -> u32 {
        self.microbatches
    }

    /// Tokens per sequence of the profiled model, where a profile gives them: what `seq_split`
    /// cuts, and whether `tune` tries it.
    pub fn sequence(&self) -> Option<u32> {
        self.layout.as_ref().and_then(LayerLayout::sequence)
    }

    /// The unscheduled plan of the plain layout (stage `r` on rank `r`).
    pub fn unscheduled_plan(&self) -> Result<Plan, Error> {
        let problem = ProblemSpec::builder()
            .ranks(self.ranks)
            .microbatches(self.microbatches)
            .build()
            .validate()?;
        let mut costs = CostModel::per_stage(self.costs.clone(), self.comm)?
            .with_microbatch_scales(self.microbatch_scales.clone())?;
        if let Some(layout) = &self.layout {
            costs = costs.with_layer_layout(layout.clone());
        }
        let memory = MemoryModel::per_stage(self.memory.clone());
        Ok(Plan::unscheduled(problem, costs, memory)?.with_memory_limit(self.memory_limit)?)
    }
}
