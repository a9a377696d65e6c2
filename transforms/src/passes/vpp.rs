//! `vpp(chunks, group, layout)`: virtual pipeline stages (interleaving).
//!
//! Source: Megatron-Core's `forward_backward_pipelining_with_interleaving` (Narayanan et al. 2021)
//! for the interleaved 1F1B order; PyTorch's `ScheduleLoopedBFS` for the breadth-first GPipe order.
//!
//! Splits each rank's share of the model into `chunks` model chunks. With `layout = standard`
//! (the default), local chunk `c` of rank `r` becomes stage `c·P + r`, so a microbatch loops over
//! the ranks `chunks` times. With `layout = v` (two chunks), rank `r` holds stages `r` and
//! `2P - 1 - r`: the model goes down the ranks and back up, as DualPipeV and ZB-V use it. Each
//! chunk's costs and activation memory are the rank's share divided by `chunks`.
//!
//! Orders follow Megatron's schedule table: microbatches in groups of `group`
//! (`microbatch_group_size_per_vp_stage`, default `P` after `f1b` and `M` after `gpipe`), each
//! group running every chunk in turn; backwards use the same table with chunks reversed.
//! - every `M >= 1`: where Megatron refuses the default group (`M < P`, or `M mod P` between 1
//!   and `P - 1`), the generalisation takes PyTorch's `Interleaved1F1B` rounds as groups
//!   (`r = max(1, ⌊M/P⌋)` rounds of `⌈M/r⌉` microbatches, Megatron's warm-up with that group),
//!   or of fewer rounds, or one group of all `M`: the fastest of those orders that run (each is
//!   verified before it is chosen), PyTorch's on a tie; failing all, the breadth-first order. An explicit `group` keeps Megatron's
//!   rules on every layout, and `group = P` on the V layout is the default.
//! - after `f1b`, standard layout: rank `r` warms up with `2(P - r - 1) + (chunks - 1)·group`
//!   forwards, capped at `chunks·M`; then one forward and one backward alternate; then the
//!   remaining backwards.
//! - after `f1b`, V layout: the ZB-V order with whole backwards (warm-up `2(P - r) - 1` chunk-0
//!   forwards, `r` pairs of chunk-1 and chunk-0 forwards, `P - r` chunk-1 forward+backward pairs,
//!   then F0 B0 F1 B1 rounds; see [`crate::schedules::zbv`]), 1F1B's memory. With an explicit
//!   `group`, Megatron's table with a uniform warm-up `(chunks - 1)·group + P - 1` instead (chunk-0
//!   forwards flow down the ranks and chunk-1 forwards back up, so a warm-up that shrinks in one
//!   direction would starve the other).
//! - after `gpipe`: all forwards in table order, then all backwards (breadth-first).
//! - after `f1b`, standard layout, an explicit `group` below `P` (or `order=block` with any
//!   group, default `P`): PipeOffload's group building block ([`crate::schedules::group_block`],
//!   sail-sg's `group_interleaved_1f1b.py` op for op), whose smaller groups keep fewer
//!   activations in flight for `offload` to move; its backwards are meant to be split in place
//!   (`zero_bubble(...)`), as the block runs each W right after its B. `order=megatron` keeps
//!   Megatron's table and its rules on the group.
//!
//! Requires: fill-drain (`gpipe`) or one-forward-one-backward (`f1b`) pacing on the linear layout,
//! whole backwards. Preconditions: `chunks >= 1` (`chunks = 1` leaves the plan as it is);
//! `layout = v` needs `chunks = 2`; an explicit `group >= P` with `chunks >= 2` follows
//! Megatron's rules on every layout after `f1b`: `P <= group <= M` and `M mod group` is 0 or at
//! least `P` (otherwise the last group has dependency bubbles); the building block needs
//! `group <= M`, the standard layout and a block that exists for the sizes; after `gpipe`
//! (breadth-first) the group must not exceed `M`.
//! May change: placement (stages, stage-to-rank), per-stage costs and memory, the layout (to
//! interleaved), and the orders; the pacing stays.
//!
//! Before (`f1b`) and after (`chunks = 2`), 2 ranks, 4 microbatches, unit costs of a rank's share
//! (lower case: the rank's second chunk; the `vpp_grid_snapshot` test holds more):
//! ```text
//! rank  0 | F0 F1 .  .  B0 ~  F2 B1 ~  F3 B2 ~  .  B3 ~
//! rank  1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  F3 B3 ~  .  .
//!
//! rank  0 | F0 F1 f0 f1 F2 .  b0 ~  F3 b1 ~  f2 B0 ~  f3 B1 ~  .  b2 ~  .  b3 ~  B2 ~  B3 ~
//! rank  1 | .  F0 F1 f0 b0 ~  f1 b1 ~  F2 B0 ~  F3 B1 ~  f2 b2 ~  f3 b3 ~  B2 ~  B3 ~  .  .
//! ```

use super::relaid;
use crate::error::TransformError;
use crate::order::warmup_merge_with;
use crate::pass::{Changes, Contract, Pass, Requires};
use crate::schedules::group_block::{self, ShareCosts};
use crate::schedules::zbv::v_one_f_one_b;
use pipeweave_core::ir::problem::{MAX_STAGES, MAX_STAGE_MICROBATCH_PAIRS};
use pipeweave_core::{simulate, verify_schedule, TOLERANCE};
use pipeweave_core::{
    ChunkPlacement, CostModel, Layout, LayoutKind, MemoryModel, Pacing, Plan, Problem, ProblemSpec,
    Task, Work,
};

/// Largest chunk count accepted.
pub const MAX_CHUNKS: u32 = 64;

/// The interleaving pass, `vpp`. Built with [`Vpp::new`], which checks the arguments alone; the
/// checks that need the plan run in its [`Pass::rewrite`].
#[derive(Clone, Copy, Debug)]
pub struct Vpp {
    chunks: u32,
    group: Option<u32>,
    placement: ChunkPlacement,
    order: VppOrder,
}

/// Which interleaved order `vpp` builds after `f1b` on the standard layout (`order=...`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VppOrder {
    /// Megatron's schedule table where its rules accept the group, PipeOffload's building block
    /// for an explicit group below the rank count (the default).
    #[default]
    Auto,
    /// Megatron's schedule table (`order=megatron`): a group below the rank count is refused.
    Megatron,
    /// PipeOffload's group building block (`order=block`,
    /// [`crate::schedules::group_block`]), for any group (default `P`).
    Block,
}

impl VppOrder {
    /// The argument's word.
    pub fn name(self) -> &'static str {
        match self {
            VppOrder::Auto => "auto",
            VppOrder::Megatron => "megatron",
            VppOrder::Block => "block",
        }
    }
}

impl Vpp {
    /// The pass's name: in expressions, the registry and errors.
    pub const NAME: &'static str = "vpp";

    /// Validates the arguments that do not depend on the plan.
    pub fn new(
        chunks: u32,
        group: Option<u32>,
        placement: ChunkPlacement,
    ) -> Result<Vpp, TransformError> {
        if chunks == 0 || chunks > MAX_CHUNKS {
            return Err(TransformError::precondition(
                Self::NAME,
                &format!("1 <= chunks <= {MAX_CHUNKS}"),
                format!("chunks = {chunks}"),
            ));
        }
        if placement == ChunkPlacement::V && chunks != 2 {
            return Err(TransformError::precondition(
                Self::NAME,
                "layout = v needs chunks = 2",
                format!("chunks = {chunks}"),
            ));
        }
        if group == Some(0) {
            return Err(TransformError::precondition(
                Self::NAME,
                "group >= 1",
                "group = 0",
            ));
        }
        Ok(Vpp {
            chunks,
            group,
            placement,
            order: VppOrder::Auto,
        })
    }

    /// The same pass, building `order`; the block needs the standard layout.
    pub fn with_order(self, order: VppOrder) -> Result<Vpp, TransformError> {
        if order == VppOrder::Block && self.placement == ChunkPlacement::V {
            return Err(TransformError::precondition(
                Self::NAME,
                "order = block needs layout = standard",
                "layout = v",
            ));
        }
        Ok(Vpp { order, ..self })
    }

    /// Whether the orders come from PipeOffload's building block on a plan of `ranks` ranks:
    /// asked for, or an explicit group below the ranks under the default order.
    fn uses_block(&self, ranks: u32) -> bool {
        match self.order {
            VppOrder::Block => true,
            VppOrder::Megatron => false,
            VppOrder::Auto => {
                self.placement == ChunkPlacement::Standard && self.group.is_some_and(|g| g < ranks)
            }
        }
    }

    /// Number of chunks per rank.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    /// The layout the pass establishes.
    fn layout(&self) -> Layout {
        Layout::Interleaved {
            chunks: self.chunks,
            placement: self.placement,
        }
    }

    /// The global stage of local chunk `chunk` on `rank` of `ranks`.
    fn stage(&self, ranks: u32, rank: u32, chunk: u32) -> u32 {
        self.placement.stage(ranks, rank, chunk).get()
    }

    fn reshape(&self, plan: &Plan) -> Result<(Problem, CostModel, MemoryModel), TransformError> {
        let problem = plan.problem();
        let ranks = problem.ranks();
        let stages = ranks * self.chunks;
        let mut owner = vec![0u32; stages as usize];
        for rank in 0..ranks {
            for chunk in 0..self.chunks {
                owner[self.stage(ranks, rank, chunk) as usize] = rank;
            }
        }
        let new_problem = ProblemSpec::builder()
            .ranks(ranks)
            .microbatches(problem.microbatches())
            .stage_to_rank(owner.clone())
            .build()
            .validate()
            .map_err(|e| TransformError::core("vpp: building the interleaved problem", e))?;
        // Each chunk an even part of its rank's share, unless the costs know the layers of
        // every position (a profile).
        let placed = match plan.costs().layer_layout() {
            Some(figures) => figures
                .stages_of(&new_problem)
                .map_err(|e| TransformError::core("vpp: placing the profiled layers", e))?,
            None => None,
        };
        let (costs, memory) = match placed
            .filter(|(c, m)| c.len() == stages as usize && m.len() == stages as usize)
        {
            Some(figures) => figures,
            None => (
                owner
                    .iter()
                    .map(|&r| plan.costs().stages()[r as usize].split(self.chunks))
                    .collect(),
                owner
                    .iter()
                    .map(|&r| plan.memory().stages()[r as usize].split(self.chunks))
                    .collect(),
            ),
        };
        let costs = plan.costs().with_stages(costs);
        Ok((new_problem, costs, MemoryModel::per_stage(memory)))
    }

    /// Megatron's schedule table: (microbatch, chunk) in the order forwards visit them.
    fn table(&self, microbatches: u32, group: u32) -> Vec<(u32, u32)> {
        let mut table = Vec::with_capacity((microbatches * self.chunks) as usize);
        let mut first = 0;
        while first < microbatches {
            let end = first.saturating_add(group).min(microbatches);
            for chunk in 0..self.chunks {
                for mb in first..end {
                    table.push((mb, chunk));
                }
            }
            first = end;
        }
        table
    }

    fn warmup(&self, ranks: u32, rank: u32, group: u32) -> usize {
        let base = (self.chunks - 1) as usize * group as usize;
        match self.placement {
            ChunkPlacement::Standard => base + 2 * (ranks - rank - 1) as usize,
            ChunkPlacement::V => base + (ranks - 1) as usize,
        }
    }

    /// The orders on the interleaved `shape` (see the module doc): the V placement's 1F1B, the
    /// breadth-first table after fill-drain input, Megatron's table with the given group or
    /// (by default) `P` where Megatron accepts the sizes, else the generalisation.
    fn orders_for(&self, plan: &Plan, shape: &(Problem, CostModel, MemoryModel)) -> Vec<Vec<Task>> {
        let (p, m) = (plan.problem().ranks(), plan.problem().microbatches());
        let one_f_one_b = plan.facts().pacing == Pacing::OneForwardOneBackward;
        if !one_f_one_b {
            return self.table_orders(p, m, self.group.unwrap_or(m), false);
        }
        let default_group = self.group.is_none_or(|g| g == p);
        if self.placement == ChunkPlacement::V && default_group {
            return v_one_f_one_b(p, m);
        }
        if self.uses_block(p) {
            if let Some(orders) = self.block_orders(plan) {
                return orders;
            }
        }
        if let Some(g) = self.group {
            return self.table_orders(p, m, g, true);
        }
        if megatron_accepts(p, m, p) {
            return self.table_orders(p, m, p, true);
        }
        self.generalised_orders(plan, shape)
    }

    /// PipeOffload's building block with the pass's group (default `P`) and the minimum group of
    /// the plan's per-rank costs; `None` where no block exists for the sizes (refused by
    /// [`Vpp::check`] before the rewrite).
    fn block_orders(&self, plan: &Plan) -> Option<Vec<Vec<Task>>> {
        let problem = plan.problem();
        let (p, m) = (problem.ranks(), problem.microbatches());
        let shares: Vec<ShareCosts> = plan
            .costs()
            .stages()
            .iter()
            .map(|s| ShareCosts {
                forward: s.forward(),
                input: s.input_grad(),
                weight: s.weight_grad(),
            })
            .collect();
        let group = self.group.unwrap_or(p);
        group_block::orders(
            p,
            m,
            self.chunks,
            group,
            group_block::minimum_group(&shares),
        )
    }

    /// Interleaved 1F1B for sizes Megatron refuses (`M < P`, or `M mod P` below `P`): Megatron's
    /// table with the groups of PyTorch's `Interleaved1F1B` (`r = max(1, ⌊M/P⌋)` rounds of
    /// `⌈M/r⌉` microbatches), or of fewer rounds (up to 8 candidates, and one group of all `M`):
    /// the fastest under the cost model of those that run, PyTorch's on a tie; the breadth-first
    /// order when none runs.
    fn generalised_orders(
        &self,
        plan: &Plan,
        shape: &(Problem, CostModel, MemoryModel),
    ) -> Vec<Vec<Task>> {
        let (p, m) = (plan.problem().ranks(), plan.problem().microbatches());
        let rounds = (m / p).max(1);
        let mut groups: Vec<u32> = (1..=rounds).rev().take(8).map(|r| m.div_ceil(r)).collect();
        groups.push(m);
        groups.dedup();
        let mut best: Option<(f64, Vec<Vec<Task>>)> = None;
        for group in groups {
            let orders = self.table_orders(p, m, group, true);
            let Some(makespan) = self.makespan_if_runs(plan, shape, &orders) else {
                continue;
            };
            if best.as_ref().is_none_or(|(b, _)| makespan < *b - TOLERANCE) {
                best = Some((makespan, orders));
            }
        }
        best.map_or_else(|| self.table_orders(p, m, m, false), |(_, orders)| orders)
    }

    /// The makespan of `orders` on `shape` under the plan's costs, when they form a schedule that
    /// runs to its end (verified).
    fn makespan_if_runs(
        &self,
        plan: &Plan,
        shape: &(Problem, CostModel, MemoryModel),
        orders: &[Vec<Task>],
    ) -> Option<f64> {
        let trial = relaid(
            Self::NAME,
            plan.clone(),
            shape.clone(),
            self.layout(),
            orders.to_vec(),
        )
        .ok()?;
        verify_schedule(&trial).ok()?;
        simulate(&trial).ok().map(|s| s.makespan())
    }

    /// The plan must fit the size limits once split into chunks.
    fn check_size(&self, problem: &Problem) -> Result<(), TransformError> {
        let stages = u64::from(problem.ranks()) * u64::from(self.chunks);
        if stages * u64::from(problem.microbatches()) > MAX_STAGE_MICROBATCH_PAIRS
            || stages > u64::from(MAX_STAGES)
        {
            return Err(TransformError::unmet(
                "stages x microbatches within the plan size limit",
                format!(
                    "{} ranks x {} chunks x {} microbatches is too large",
                    problem.ranks(),
                    self.chunks,
                    problem.microbatches()
                ),
            ));
        }
        Ok(())
    }

    /// Megatron's rules on the group size, for its interleaved 1F1B on the standard layout.
    fn check_megatron_group(&self, problem: &Problem, group: u32) -> Result<(), TransformError> {
        let (p, m, g) = (problem.ranks(), problem.microbatches(), group);
        if megatron_accepts(p, m, g) {
            return Ok(());
        }
        if !(p <= g && g <= m) {
            return Err(TransformError::unmet(
                "ranks <= group <= microbatches",
                format!("ranks = {p}, group = {g}, microbatches = {m}"),
            ));
        }
        let rest = m % g;
        if rest != 0 && rest < p {
            return Err(TransformError::unmet(
                "microbatches mod group is 0 or >= ranks",
                format!(
                    "microbatches = {m}, group = {g}: the last group has {rest} < {p} microbatches"
                ),
            ));
        }
        Ok(())
    }

    /// Every rank's order from Megatron's table with groups of `group` microbatches: 1F1B with
    /// Megatron's warm-up, or breadth-first (all forwards, then all backwards).
    fn table_orders(
        &self,
        ranks: u32,
        microbatches: u32,
        group: u32,
        one_f_one_b: bool,
    ) -> Vec<Vec<Task>> {
        let table = self.table(microbatches, group);
        (0..ranks)
            .map(|rank| {
                let forward = |i: usize| {
                    let (mb, chunk) = table[i];
                    Task::Forward(Work::new(self.stage(ranks, rank, chunk), mb))
                };
                let backward = |i: usize| {
                    let (mb, chunk) = table[i];
                    let chunk = self.chunks - 1 - chunk;
                    Task::Backward(Work::new(self.stage(ranks, rank, chunk), mb))
                };
                let warmup = if one_f_one_b {
                    self.warmup(ranks, rank, group)
                } else {
                    table.len()
                };
                warmup_merge_with((table.len(), forward), (table.len(), backward), warmup)
            })
            .collect()
    }
}

/// Megatron's rules on the group size: `P <= group <= M`, and `M mod group` is 0 or at least `P`.
fn megatron_accepts(p: u32, m: u32, group: u32) -> bool {
    p <= group && group <= m && (m % group == 0 || m % group >= p)
}

impl Pass for Vpp {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        let requires = Requires::paced(&[Pacing::FillDrain, Pacing::OneForwardOneBackward])
            .on_layouts(&[LayoutKind::Linear])
            .with_whole_backwards();
        Contract::new(requires, Changes::PLACEMENT.and(Changes::LAYOUT))
            .establishing(LayoutKind::Interleaved)
    }

    fn describe(&self) -> String {
        let layout = self.placement.name();
        let order = match self.order {
            VppOrder::Auto => String::new(),
            other => format!(", order={}", other.name()),
        };
        match self.group {
            Some(g) => format!(
                "vpp(chunks={}, group={g}, layout={layout}{order})",
                self.chunks
            ),
            None => format!("vpp(chunks={}, layout={layout}{order})", self.chunks),
        }
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        super::whole_sequences(Self::NAME, &plan)?;
        self.check(&plan)?;
        if self.chunks == 1 {
            return Ok(plan);
        }
        let shape = self.reshape(&plan)?;
        let orders = self.orders_for(&plan, &shape);
        relaid(Self::NAME, plan, shape, self.layout(), orders)
    }
}

impl Vpp {
    /// The preconditions that need the plan: its size once split, and an explicit `group`.
    fn check(&self, plan: &Plan) -> Result<(), TransformError> {
        self.check_size(plan.problem())?;
        let one_f_one_b = plan.facts().pacing == Pacing::OneForwardOneBackward;
        if self.order == VppOrder::Block && !one_f_one_b {
            return Err(TransformError::unmet(
                "order = block needs a one-forward-one-backward input (f1b)",
                format!("the input's pacing is {:?}", plan.facts().pacing),
            ));
        }
        if self.chunks >= 2 && one_f_one_b && self.uses_block(plan.problem().ranks()) {
            return self.check_block(plan);
        }
        if let Some(group) = self.group.filter(|_| self.chunks >= 2) {
            if one_f_one_b {
                self.check_megatron_group(plan.problem(), group)?;
            } else if group > plan.problem().microbatches() {
                // Breadth-first orders only need the group to exist.
                return Err(TransformError::unmet(
                    "group <= microbatches",
                    format!(
                        "group = {group}, microbatches = {}",
                        plan.problem().microbatches()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The building block's preconditions: a group within the microbatches and a block that
    /// exists for the sizes.
    fn check_block(&self, plan: &Plan) -> Result<(), TransformError> {
        let (p, m) = (plan.problem().ranks(), plan.problem().microbatches());
        let group = self.group.unwrap_or(p);
        if group > m {
            return Err(TransformError::unmet(
                "group <= microbatches",
                format!("group = {group}, microbatches = {m}"),
            ));
        }
        if self.block_orders(plan).is_none() {
            return Err(TransformError::unmet(
                "PipeOffload's building block exists for the sizes (no two ops of a rank share a \
                 slot of the block, the warm-up offset stays below the ranks)",
                format!(
                    "ranks = {p}, chunks = {}, group = {group}: another group, or order = megatron",
                    self.chunks
                ),
            ));
        }
        Ok(())
    }
}
