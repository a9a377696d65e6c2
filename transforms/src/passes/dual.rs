//! `dual(memory=N)`: bidirectional pipelines (DeepSeek DualPipe and DualPipeV).
//!
//! Source: DeepSeek's `dualpipe.py` / `dualpipev.py` (`step()`), phases as in
//! [`crate::schedules::dualpipe`]; below DeepSeek's sizes, counter-flow 1F1B
//! ([`crate::schedules::counterflow`]).
//!
//! - On a one-chunk 1F1B plan: **DualPipe**. Every stage `i` gets a mirrored replica, stage
//!   `P + i`, on rank `P - 1 - i`, holding the same weights (tied stages). Microbatches `0..M/2`
//!   (rounded down) flow from rank 0 down through stages `0..P` (route A); microbatches `M/2..M`
//!   flow from rank `P - 1` up through the replicas (route B). A replica costs and holds what its
//!   original does. With an odd `P` the middle rank holds a stage and its own mirror: both routes
//!   pass it there, and the two tied copies share one set of weights on one rank.
//! - On a two-chunk plan (`vpp(.., chunks=2)`, either layout): **DualPipeV**. The model's `2P`
//!   chunks are placed in a V, rank `r` holding stages `r` and `2P - 1 - r`; all microbatches enter
//!   and leave at rank 0. Chunk `c` of rank `r` keeps the costs and memory chunk `c` had.
//!
//! The order, by size:
//! - DeepSeek's sizes, `M >= 2P` (DualPipe: `P` and `M` even too): DeepSeek's order, op for op.
//!   One forward of one direction is paired with one full backward of the other into an
//!   overlapped F&B task (its own cost, `FB`). Without `zero_bubble` every backward is a full B;
//!   DeepSeek's split of the last backwards into I and queued W comes with `zero_bubble` (its
//!   default policy on dual plans).
//! - DualPipeV below them: 1F1B on the same V placement (the ZB-V order with whole backwards).
//! - DualPipe below them (`2 <= M < 2P`, an odd `M`, or an odd `P`): **counter-flow 1F1B**. Each
//!   route runs its own 1F1B; on every rank a list scheduler interleaves the two routes, which
//!   flow in opposite directions, so each fills the other's bubbles. Several variants (warm-up
//!   depth, strict or relaxed alternation, tie preference, DeepSeek's F&B pairing) are simulated
//!   and improved by critical-path swaps; the best whose makespan is at most the input 1F1B plan's
//!   and whose peak fits the memory budget wins. The budget is `memory=N` (declared on the plan
//!   as its limit, so a `zero_bubble` after it searches within it too), else the plan's declared limit, else
//!   DeepSeek's peak `P + 1` (units of a rank's share), so `dual` holds no more below DeepSeek's
//!   sizes than at them (the simulator reports each rank's actual peak; with unit costs it is
//!   `min(M, P + 1)`). `zero_bubble` on such a plan runs the same search with split backwards
//!   (queued Ws filling waits), its input order among the candidates.
//! - `M = 1`, or (uneven stage costs, a tight limit) no counter-flow order that qualifies: the plan
//!   stays the input 1F1B plan on its linear layout. One microbatch cannot fill two routes (a
//!   route carries at least one microbatch); 1F1B is what one route would be.
//!
//! Below DeepSeek's sizes, then, DualPipe is never slower than the 1F1B plan it starts from. With
//! F = 1, B = 2 and no latency, P = 4, M = 2..7: 12, 15, 17, 19, 21, 25 against 1F1B's 15, 18,
//! 21, 24, 27, 30.
//!
//! Requires: one-forward-one-backward pacing (`f1b`, or `vpp` after `f1b`) on the linear or an
//! interleaved layout, whole backwards. Preconditions: more than two chunks per rank are
//! rejected; every rank and microbatch count is accepted.
//! May change: placement (stages, routes, tied stages), per-stage costs and memory, the layout (to
//! DualPipe or DualPipeV), orders; the pacing stays.
//!
//! Before (`f1b(gpipe)`) and after (`dual(f1b(gpipe))`), 2 ranks, 4 microbatches, unit costs
//! (`X` is an overlapped F&B labelled by its forward; lower case marks the rank's second stage):
//! ```text
//! rank  0 | F0 F1 .  .  B0 ~  F2 B1 ~  F3 B2 ~  .  B3 ~        rank  0 | F0 f2 F1 b2 ~  x3 ~  ~  b3 ~  B1 ~
//! rank  1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  F3 B3 ~  .  .         rank  1 | f2 F0 f3 B0 ~  X1 ~  ~  B1 ~  b3 ~
//! ```
//! Counter-flow below DeepSeek's sizes, 4 ranks, 3 microbatches, unit costs (makespan 15, 1F1B's
//! 18; microbatch 0 on route A, 1 and 2 on route B):
//! ```text
//! rank  0 | F0 F1 F2 .  .  .  .  .  .  .  B0 ~  .  B1 ~  .  B2 ~        rank  0 | F0 .  .  f1 b1 ~  f2 b2 ~  .  .  .  .  B0 ~
//! rank  1 | .  F0 F1 F2 .  .  .  .  B0 ~  .  B1 ~  .  B2 ~  .  .         rank  1 | .  F0 f1 .  f2 .  b1 ~  .  b2 ~  B0 ~  .  .
//! rank  2 | .  .  F0 F1 .  .  B0 ~  F2 B1 ~  .  B2 ~  .  .  .  .         rank  2 | .  f1 F0 f2 .  .  B0 ~  b1 ~  .  b2 ~  .  .
//! rank  3 | .  .  .  F0 B0 ~  F1 B1 ~  F2 B2 ~  .  .  .  .  .  .         rank  3 | f1 f2 .  F0 B0 ~  .  .  .  .  b1 ~  .  b2 ~
//! ```

use super::relaid;
use crate::error::TransformError;
use crate::pass::{Changes, Contract, Pass, Requires};
use crate::schedules::counterflow;
use crate::schedules::dualpipe::DualShape;
use pipeweave_core::{
    simulate, CostModel, DualKind, Layout, LayoutKind, MemoryModel, Pacing, Plan, Problem,
    ProblemSpec, StageCosts, StageMemory, Task,
};

/// The bidirectional pass, `dual(memory=N)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dual {
    /// The counter-flow search's memory budget (activations per rank), declared on the plan as
    /// its limit; None: the plan's declared limit, else DeepSeek's peak `P + 1`.
    memory: Option<f64>,
}

impl Dual {
    /// The pass's name: in expressions, the registry and errors.
    pub const NAME: &'static str = "dual";

    /// The pass with the counter-flow budget `memory` (None: the plan's declared limit, else
    /// `P + 1`); refuses a budget that is not a positive number.
    pub fn new(memory: Option<f64>) -> Result<Dual, TransformError> {
        match memory {
            Some(m) if !(m.is_finite() && m > 0.0) => Err(TransformError::unmet(
                "memory > 0",
                format!("memory={m} is not a positive number of activations"),
            )),
            _ => Ok(Dual { memory }),
        }
    }
}

/// Which bidirectional pipeline a plan becomes, from its layout.
fn shape_of(plan: &Plan) -> Result<DualShape, TransformError> {
    let problem = plan.problem();
    let (p, m) = (problem.ranks(), problem.microbatches());
    match plan.facts().layout {
        Layout::Linear => Ok(DualShape {
            ranks: p,
            microbatches: m,
            v: false,
        }),
        Layout::Interleaved { chunks: 2, .. } => Ok(DualShape {
            ranks: p,
            microbatches: m,
            v: true,
        }),
        other => Err(TransformError::unmet(
            "one chunk per rank (DualPipe) or two (DualPipeV)",
            match other.chunks() {
                Some(c) => format!("the plan has {c} chunks per rank"),
                None => "ranks hold different numbers of stages".to_string(),
            },
        )),
    }
}

/// The problem, costs and memory of the bidirectional layout.
fn reshape(
    plan: &Plan,
    shape: DualShape,
) -> Result<(Problem, CostModel, MemoryModel), TransformError> {
    let input = plan.problem();
    let p = shape.ranks;
    // For every new stage, the input stage whose costs and memory it takes.
    let mut source = vec![0u32; 2 * p as usize];
    let mut owner = vec![0u32; 2 * p as usize];
    for rank in 0..p {
        let second = shape.second_stage(rank);
        owner[rank as usize] = rank;
        owner[second as usize] = rank;
        if shape.v {
            let held = input.stages_of(rank.into());
            source[rank as usize] = held[0].get();
            source[second as usize] = held[1].get();
        } else {
            source[rank as usize] = rank;
            // Stage P + i replicates stage i: rank r holds the replica of stage P - 1 - r.
            source[second as usize] = p - 1 - rank;
        }
    }
    let spec = if shape.v {
        ProblemSpec::builder()
            .ranks(p)
            .microbatches(shape.microbatches)
            .stage_to_rank(owner)
            .build()
    } else {
        ProblemSpec::dualpipe(p, shape.microbatches)
    };
    let problem = spec
        .validate()
        .map_err(|e| TransformError::core("dual: building the layout", e))?;
    let costs: Vec<StageCosts> = source
        .iter()
        .map(|&s| plan.costs().stages()[s as usize])
        .collect();
    let memory: Vec<StageMemory> = source
        .iter()
        .map(|&s| plan.memory().stages()[s as usize])
        .collect();
    let costs = plan.costs().with_stages(costs);
    Ok((problem, costs, MemoryModel::per_stage(memory)))
}

/// The input plan moved to the bidirectional layout, with empty orders (what the order
/// generators read: routes, placement, costs, memory limit).
fn bidirectional(
    plan: &Plan,
    kind: DualKind,
    layout: (Problem, CostModel, MemoryModel),
) -> Result<Plan, TransformError> {
    let ranks = layout.0.ranks() as usize;
    relaid(
        "dual: building the layout",
        plan.clone(),
        layout,
        Layout::Dual(kind),
        vec![Vec::new(); ranks],
    )
}

/// The counter-flow orders of `dual` (DualPipe's layout below DeepSeek's sizes) if one is no
/// slower than `input`, the 1F1B plan `dual` started from, and fits the memory budget.
fn counter_flow(input: &Plan, dual: &Plan, shape: DualShape) -> Option<Vec<Vec<Task>>> {
    // The driver verified the input, so it simulates; should it not, nothing is promised.
    let bound = simulate(input).ok()?.makespan();
    counterflow::best(dual, false, Some(bound), Some(shape.memory_budget(dual)))
}

impl Pass for Dual {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        let requires = Requires::paced(&[Pacing::OneForwardOneBackward])
            .on_layouts(&[LayoutKind::Linear, LayoutKind::Interleaved])
            .with_whole_backwards();
        let changes = Changes::PLACEMENT.and(Changes::LAYOUT);
        let changes = match self.memory {
            Some(_) => changes.and(Changes::MEMORY_LIMIT),
            None => changes,
        };
        Contract::new(requires, changes).establishing(LayoutKind::Dual)
    }

    fn describe(&self) -> String {
        match self.memory {
            Some(m) => format!("{}(memory={m})", Self::NAME),
            None => Self::NAME.to_string(),
        }
    }

    /// The plan stays as it is where one microbatch cannot fill two routes, or where no
    /// counter-flow order is both as fast as the input's 1F1B and within the memory budget
    /// (uneven stage costs, a tight declared limit).
    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        super::whole_sequences(Self::NAME, &plan)?;
        let shape = shape_of(&plan)?;
        if !shape.v && shape.microbatches < 2 {
            return Ok(plan);
        }
        let kind = if shape.v {
            DualKind::DualPipeV
        } else {
            DualKind::DualPipe
        };
        let plan = match self.memory {
            // The budget becomes the plan's declared limit (the lower of it and one declared
            // already), which the searches after it (`zero_bubble` on the dual plan) read and
            // the driver verifies.
            Some(m) => {
                let limit = plan.memory_limit().map_or(m, |l| l.min(m));
                plan.with_memory_limit(Some(limit))
                    .map_err(|e| TransformError::core(Self::NAME, e))?
            }
            None => plan,
        };
        let dual = bidirectional(&plan, kind, reshape(&plan, shape)?)?;
        let orders = if shape.v || shape.deepseek_applies() {
            shape.orders(&dual, false)
        } else {
            match counter_flow(&plan, &dual, shape) {
                Some(orders) => orders,
                None => return Ok(plan),
            }
        };
        dual.with_orders(orders)
            .map_err(|e| TransformError::core(Self::NAME, e))
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::built;
    use pipeweave_core::{simulate, DualKind, Layout, Plan, StageCosts};

    /// `expr` at P x M with unit costs (F = I = W = 1, so B = 2) and no latency.
    fn plan(expr: &str, p: u32, m: u32) -> Plan {
        built(expr, p, m, StageCosts::default()).unwrap()
    }

    /// `dual(f1b(gpipe))` at P x M has `layout` and `makespan`, no more than 1F1B's.
    fn check(p: u32, m: u32, layout: Layout, makespan: f64) {
        let dual = plan("dual(f1b(gpipe))", p, m);
        let f1b = simulate(&plan("f1b(gpipe)", p, m)).unwrap().makespan();
        assert_eq!(dual.facts().layout, layout, "P={p} M={m}");
        assert_eq!(simulate(&dual).unwrap().makespan(), makespan, "P={p} M={m}");
        assert!(makespan <= f1b, "P={p} M={m}: {makespan} > 1F1B's {f1b}");
    }

    #[test]
    fn every_size_is_accepted_and_never_slower_than_1f1b() {
        let dualpipe = Layout::Dual(DualKind::DualPipe);
        // One microbatch: 1F1B on the linear layout.
        check(4, 1, Layout::Linear, 12.0);
        // Counter-flow below DeepSeek's sizes (1F1B: 15, 30, 18, 9).
        check(4, 2, dualpipe, 12.0);
        check(4, 7, dualpipe, 25.0);
        check(3, 4, dualpipe, 15.0);
        check(1, 3, dualpipe, 9.0);
        // DeepSeek's own order (1F1B: 33).
        check(4, 8, dualpipe, 28.0);
    }
}
