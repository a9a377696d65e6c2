//! `dual`: bidirectional pipelines (DeepSeek DualPipe and DualPipeV).
//!
//! Source: DeepSeek's `dualpipe.py` / `dualpipev.py` (`step()`), phases as in
//! [`crate::schedules::dualpipe`].
//!
//! - On a one-chunk 1F1B plan: **DualPipe**. Every stage `i` gets a mirrored replica, stage
//!   `P + i`, on rank `P - 1 - i`, holding the same weights (tied stages). Microbatches `0..M/2`
//!   flow from rank 0 down through stages `0..P`; microbatches `M/2..M` flow from rank `P - 1` up
//!   through the replicas. A replica costs and holds what its original does.
//! - On a two-chunk plan (`vpp(.., chunks=2)`, either layout): **DualPipeV**. The model's `2P`
//!   chunks are placed in a V, rank `r` holding stages `r` and `2P - 1 - r`; all microbatches enter
//!   and leave at rank 0. Chunk `c` of rank `r` keeps the costs and memory chunk `c` had.
//!
//! One forward of one direction is paired with one full backward of the other into an overlapped
//! F&B task (its own cost, `FB`). Without `zero_bubble` every backward is a full B; DeepSeek's
//! split of the last backwards into I and queued W comes with `zero_bubble` (its default policy on
//! dual plans).
//!
//! Requires: one-forward-one-backward pacing (`f1b`, or `vpp` after `f1b`) on the linear or an
//! interleaved layout, whole backwards. Preconditions: DualPipe needs an even rank count and an
//! even microbatch count `M >= 2P`; more than two chunks per rank are rejected. DualPipeV takes
//! every `M`: below DeepSeek's `M >= 2P` its order is 1F1B on the same V placement (the ZB-V order
//! with whole backwards), never slower than 1F1B.
//! May change: placement (stages, routes, tied stages), per-stage costs and memory, the layout (to
//! DualPipe or DualPipeV), orders; the pacing stays.
//!
//! Before (`f1b(gpipe)`) and after (`dual(f1b(gpipe))`), 2 ranks, 4 microbatches, unit costs
//! (`X` is an overlapped F&B labelled by its forward; lower case marks the rank's second stage):
//! ```text
//! rank  0 | F0 F1 .  .  B0 ~  F2 B1 ~  F3 B2 ~  .  B3 ~        rank  0 | F0 f2 F1 b2 ~  x3 ~  ~  b3 ~  B1 ~
//! rank  1 | .  F0 B0 ~  F1 B1 ~  F2 B2 ~  F3 B3 ~  .  .         rank  1 | f2 F0 f3 B0 ~  X1 ~  ~  B1 ~  b3 ~
//! ```

use crate::error::TransformError;
use crate::pass::{Changes, Contract, Pass, Requires};
use crate::schedules::dualpipe::DualShape;
use pipeweave_core::{
    CostModel, DualKind, Facts, Layout, LayoutKind, MemoryModel, Pacing, Plan, Problem,
    ProblemSpec, StageCosts, StageMemory,
};

/// The bidirectional pass.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dual;

/// Which bidirectional pipeline a plan becomes, from its layout.
fn shape_of(plan: &Plan) -> Result<DualShape, TransformError> {
    let problem = plan.problem();
    let (p, m) = (problem.ranks(), problem.microbatches());
    match plan.facts().layout {
        Layout::Linear => {
            if p % 2 != 0 {
                return Err(TransformError::precondition(
                    "dual",
                    "DualPipe needs an even number of ranks",
                    format!("ranks = {p}"),
                ));
            }
            if m % 2 != 0 || m < 2 * p {
                return Err(TransformError::precondition(
                    "dual",
                    "DualPipe needs an even number of microbatches >= 2 x ranks",
                    format!("microbatches = {m}, ranks = {p}"),
                ));
            }
            Ok(DualShape {
                ranks: p,
                microbatches: m,
                v: false,
            })
        }
        Layout::Interleaved { chunks: 2, .. } => Ok(DualShape {
            ranks: p,
            microbatches: m,
            v: true,
        }),
        other => Err(TransformError::precondition(
            "dual",
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
    let costs = CostModel::per_stage(costs, plan.costs().comm())
        .map_err(|e| TransformError::core("dual: costs", e))?;
    Ok((problem, costs, MemoryModel::per_stage(memory)))
}

impl Pass for Dual {
    type Prepared = (DualShape, (Problem, CostModel, MemoryModel));

    fn name(&self) -> &str {
        "dual"
    }

    fn contract(&self) -> Contract {
        Contract {
            requires: Requires {
                pacing: &[Pacing::OneForwardOneBackward],
                layout: &[LayoutKind::Linear, LayoutKind::Interleaved],
                whole_backwards: true,
            },
            changes: Changes {
                placement: true,
                layout: true,
                ..Changes::default()
            },
        }
    }

    fn prepare(&self, plan: &Plan) -> Result<Self::Prepared, TransformError> {
        let shape = shape_of(plan)?;
        Ok((shape, reshape(plan, shape)?))
    }

    fn apply(&self, plan: Plan, (shape, layout): Self::Prepared) -> Result<Plan, TransformError> {
        let orders = shape.orders(false);
        let kind = if shape.v {
            DualKind::DualPipeV
        } else {
            DualKind::DualPipe
        };
        let facts = Facts {
            layout: Layout::Dual(kind),
            ..plan.facts()
        };
        plan.reshaped(Some(layout), orders, facts)
            .map_err(|e| TransformError::core("dual", e))
    }
}
