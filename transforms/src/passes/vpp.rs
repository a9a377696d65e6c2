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
//!
//! Preconditions: the input comes from `gpipe` or `f1b` on the plain layout; `chunks >= 1`
//! (`chunks = 1` leaves the plan as it is); `layout = v` needs `chunks = 2`; after `f1b` with
//! `chunks >= 2` in the standard layout, Megatron's rules on the group size: `P <= group <= M` and
//! `M mod group` is 0 or at least `P` (otherwise the last group has dependency bubbles). The V
//! layout is not Megatron's schedule and takes any group size.
//! May change: placement (stages, stage-to-rank), per-stage costs and memory, and the orders.
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

use crate::error::TransformError;
use crate::order::warmup_merge;
use crate::schedules::zbv::{zbv_orders, Cooldown};
use crate::transform::{Position, Transform};
use pipeweave_core::{CostModel, MemoryModel, Plan, Problem, ProblemSpec, Task, Work};

/// Largest chunk count accepted.
pub const MAX_CHUNKS: u32 = 64;

/// How chunks are placed on ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Chunk `c` of rank `r` is stage `c·P + r`.
    Standard,
    /// Two chunks in a V: rank `r` holds stages `r` and `2P - 1 - r`.
    V,
}

/// The interleaving pass. Built with [`Interleave::new`], which checks the arguments alone;
/// the checks that need the plan run in [`Transform::check`].
#[derive(Clone, Copy, Debug)]
pub struct Interleave {
    chunks: u32,
    group: Option<u32>,
    layout: Layout,
}

impl Interleave {
    /// Validates the arguments that do not depend on the plan.
    pub fn new(
        chunks: u32,
        group: Option<u32>,
        layout: Layout,
    ) -> Result<Interleave, TransformError> {
        if chunks == 0 || chunks > MAX_CHUNKS {
            return Err(TransformError::precondition(
                "vpp",
                &format!("1 <= chunks <= {MAX_CHUNKS}"),
                format!("chunks = {chunks}"),
            ));
        }
        if layout == Layout::V && chunks != 2 {
            return Err(TransformError::precondition(
                "vpp",
                "layout = v needs chunks = 2",
                format!("chunks = {chunks}"),
            ));
        }
        if group == Some(0) {
            return Err(TransformError::precondition(
                "vpp",
                "group >= 1",
                "group = 0",
            ));
        }
        Ok(Interleave {
            chunks,
            group,
            layout,
        })
    }

    /// Number of chunks per rank.
    pub fn chunks(&self) -> u32 {
        self.chunks
    }

    fn after_f1b(plan: &Plan) -> bool {
        plan.passes().last().is_some_and(|p| p == "f1b")
    }

    fn group_for(&self, plan: &Plan) -> u32 {
        let problem = plan.problem();
        self.group.unwrap_or(if Self::after_f1b(plan) {
            problem.ranks()
        } else {
            problem.microbatches()
        })
    }

    /// The global stage of local chunk `chunk` on `rank` of `ranks`.
    fn stage(&self, ranks: u32, rank: u32, chunk: u32) -> u32 {
        match self.layout {
            Layout::Standard => chunk * ranks + rank,
            Layout::V if chunk == 0 => rank,
            Layout::V => 2 * ranks - 1 - rank,
        }
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
        let costs = owner
            .iter()
            .map(|&r| plan.costs().stages()[r as usize].split(self.chunks))
            .collect();
        let costs = CostModel::per_stage(costs, plan.costs().comm())
            .map_err(|e| TransformError::core("vpp: splitting costs", e))?;
        let memory = MemoryModel::per_stage(
            owner
                .iter()
                .map(|&r| plan.memory().stages()[r as usize].split(self.chunks))
                .collect(),
        );
        Ok((new_problem, costs, memory))
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
        match self.layout {
            Layout::Standard => base + 2 * (ranks - rank - 1) as usize,
            Layout::V => base + (ranks - 1) as usize,
        }
    }
}

/// 1F1B on the V placement: the handcrafted ZB-V order with every backward kept whole (each W
/// right after its I, fused into B), which keeps 1F1B's memory (`P` of a rank's share) and, unlike
/// a Megatron table on the V, keeps both chunks busy.
fn v_one_f_one_b(ranks: u32, microbatches: u32) -> Vec<Vec<Task>> {
    zbv_orders(ranks, microbatches, Cooldown::Eager)
        .into_iter()
        .map(|order| {
            let mut fused = Vec::with_capacity(order.len());
            for task in order {
                match (fused.last(), task) {
                    (Some(&Task::InputGrad(i)), Task::WeightGrad(w)) if i == w => {
                        fused.pop();
                        fused.push(Task::Backward(w));
                    }
                    _ => fused.push(task),
                }
            }
            fused
        })
        .collect()
}

impl Transform for Interleave {
    fn name(&self) -> &'static str {
        "vpp"
    }

    fn position(&self) -> Position {
        Position::Interleave
    }

    fn describe(&self) -> String {
        let layout = match self.layout {
            Layout::Standard => "standard",
            Layout::V => "v",
        };
        match self.group {
            Some(g) => format!("vpp(chunks={}, group={g}, layout={layout})", self.chunks),
            None => format!("vpp(chunks={}, layout={layout})", self.chunks),
        }
    }

    fn check(&self, plan: &Plan) -> Result<(), TransformError> {
        let last = plan.passes().last().map(String::as_str);
        if !matches!(last, Some("gpipe") | Some("f1b")) {
            return Err(TransformError::precondition(
                "vpp",
                "input comes from gpipe or f1b",
                format!("the plan came from passes [{}]", plan.passes().join(", ")),
            ));
        }
        let problem = plan.problem();
        if !problem.is_linear() {
            return Err(TransformError::precondition(
                "vpp",
                "plain layout: one stage per rank, stage s on rank s, one route",
                format!(
                    "the problem has {} stages on {} ranks",
                    problem.stages(),
                    problem.ranks()
                ),
            ));
        }
        let stages = u64::from(problem.ranks()) * u64::from(self.chunks);
        if stages * u64::from(problem.microbatches())
            > pipeweave_core::problem::MAX_STAGE_MICROBATCH_PAIRS
            || stages > u64::from(pipeweave_core::problem::MAX_STAGES)
        {
            return Err(TransformError::precondition(
                "vpp",
                "stages x microbatches within the plan size limit",
                format!(
                    "{} ranks x {} chunks x {} microbatches is too large",
                    problem.ranks(),
                    self.chunks,
                    problem.microbatches()
                ),
            ));
        }
        if self.chunks >= 2 && Self::after_f1b(plan) && self.layout == Layout::Standard {
            let (p, m, g) = (
                problem.ranks(),
                problem.microbatches(),
                self.group_for(plan),
            );
            if !(p <= g && g <= m) {
                return Err(TransformError::precondition(
                    "vpp",
                    "ranks <= group <= microbatches",
                    format!("ranks = {p}, group = {g}, microbatches = {m}"),
                ));
            }
            let rest = m % g;
            if rest != 0 && rest < p {
                return Err(TransformError::precondition(
                    "vpp",
                    "microbatches mod group is 0 or >= ranks",
                    format!("microbatches = {m}, group = {g}: the last group has {rest} < {p} microbatches"),
                ));
            }
        }
        Ok(())
    }

    fn apply(&self, plan: Plan) -> Result<Plan, TransformError> {
        if self.chunks == 1 {
            return Ok(plan);
        }
        let ranks = plan.problem().ranks();
        let microbatches = plan.problem().microbatches();
        let group = self.group_for(&plan);
        let one_f_one_b = Self::after_f1b(&plan);
        if one_f_one_b && self.layout == Layout::V && self.group.is_none() {
            let orders = v_one_f_one_b(ranks, microbatches);
            let shape = self.reshape(&plan)?;
            return plan
                .reshaped(Some(shape), orders)
                .map_err(|e| TransformError::core("vpp", e));
        }
        let table = self.table(microbatches, group);
        let orders = (0..ranks)
            .map(|rank| {
                let forwards: Vec<Task> = table
                    .iter()
                    .map(|&(mb, chunk)| {
                        Task::Forward(Work::new(self.stage(ranks, rank, chunk), mb))
                    })
                    .collect();
                let backwards: Vec<Task> = table
                    .iter()
                    .map(|&(mb, chunk)| {
                        let chunk = self.chunks - 1 - chunk;
                        Task::Backward(Work::new(self.stage(ranks, rank, chunk), mb))
                    })
                    .collect();
                let warmup = if one_f_one_b {
                    self.warmup(ranks, rank, group)
                } else {
                    forwards.len()
                };
                warmup_merge(&forwards, &backwards, warmup)
            })
            .collect();
        let shape = self.reshape(&plan)?;
        plan.reshaped(Some(shape), orders)
            .map_err(|e| TransformError::core("vpp", e))
    }
}
