//! `seq_split(schedule, chunks=k, split=tokens|cost, memory=N)`: sequence-split microbatches
//! (Seq1F1B), long sequences in a fraction of the memory.
//!
//! Source: Sun et al., "Seq1F1B: Efficient Sequence-Level Pipeline Parallelism for Large
//! Language Model Training" (NAACL 2025), and sail-sg's `scheduler/seq1f1b.py`.
//!
//! Every microbatch's sequence is cut into `k` chunks ([`SequenceCut`]: equal tokens, or with
//! `split=cost` equal cost, Seq1F1B's computation-wise partition), and each chunk becomes a
//! unit of the pipeline: the problem's microbatches are the `M·k` chunks, with their causal
//! dependencies on every stage (chunk `c`'s F after chunk `c - 1`'s; chunk `c - 1`'s I after
//! chunk `c`'s: [`pipeweave_core::ir::deps`]). A chunk costs its share of the microbatch by the
//! per-token model of the profile (later chunks attend to more tokens), holds its tokens'
//! share of the activations (the memory model's per-microbatch scales), keeps its query, keys
//! and values on the device for later chunks where a later pass recomputes or offloads it (the
//! checkpoint is at least [`KV_SHARE`] of its activations: a recompute keeps it, an offload
//! moves the rest, [`pipeweave_core::moved_by`]), and sends its tokens' share of an activation (the
//! latency scaled by the largest share).
//!
//! The orders are the input's, rescheduled at chunk granularity:
//! - fill-drain: each task becomes its chunks, forwards in sequence order, backwards in reverse;
//! - one-forward-one-backward with whole backwards: Seq1F1B's rule, each rank's chunk forwards
//!   and (reversed per microbatch) chunk backwards merged after a warm-up of `w + k - 1`
//!   forwards, `w` the input's warm-up (on the linear layout `P - r - 2 + k`, sail-sg's order op
//!   for op); where that order cannot run, the chunked input order;
//! - split backwards (after `zero_bubble`): `zero_bubble`'s `auto` search over the chunks (its
//!   list scheduler sees their dependencies) within `memory=N`, by default the input's peak
//!   counted in chunks plus the `k - 1` chunks a microbatch's reversal holds:
//!   `max_r (peak_r + (k - 1)·a_r)·s`, with `a_r` a microbatch's activations on rank `r` and
//!   `s` a chunk's share (where nothing fits that default, limits halfway up to the chunked
//!   input's own peak, and at last the chunked input order itself; a limit given with
//!   `memory=N` is kept or refused).
//!
//! Requires: a scheduled plan (any pacing) that keeps its activations, on the linear or an
//! interleaved layout (not a dual plan), not split already; where the costs come from a profile,
//! its model's sequence length (`seq_len`), which must hold at least `k` tokens. May change: the
//! problem and models (the chunks), the pacing, the orders. `recompute` and `offload` may follow.
//!
//! Before (`f1b(gpipe)`) and after (`seq_split(f1b(gpipe), chunks=2)`), 2 ranks, 2 microbatches,
//! unit costs (chunk `c` of microbatch `m` is unit `2m + c`):
//! ```text
//! rank 0 | F0 F1 .  .  B0 ~  B1 ~        rank 0 | F0 F1 F2 .  .  B1 F3 B0 .  B3 B2
//! rank 1 | .  F0 B0 ~  F1 B1 ~  .        rank 1 | .  F0 F1 B1 F2 B0 F3 B3 B2 .
//! ```

use crate::error::TransformError;
use crate::order::warmup_merge;
use crate::pass::{Changes, Contract, Pass, Requires};
use crate::schedules::auto::auto_within;
use pipeweave_core::{
    max_peak, peak_per_rank, simulate, Backwards, CostModel, Facts, LayoutKind, MemoryModel,
    Pacing, Plan, Problem, ProblemSpec, RouteSpec, SequenceCut, SplitBy, StageMemory,
    StageMemorySpec, Task, MAX_SEQ_CHUNKS,
};

/// The share of a chunk's activations that stay on the device for later chunks where it is
/// recomputed or offloaded: its fused query, key and value tensor (what the kernels keep, the
/// query with the keys and values), 6h of a transformer layer's 34h bytes per token in 16-bit
/// (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
/// without the attention scores).
pub const KV_SHARE: f64 = 6.0 / 34.0;

/// The sequence-split pass, `seq_split`.
#[derive(Clone, Copy, Debug)]
pub struct SeqSplit {
    chunks: u32,
    by: SplitBy,
    memory: Option<f64>,
}

impl SeqSplit {
    /// The pass's name: in expressions, the registry and errors.
    pub const NAME: &'static str = "seq_split";

    /// `chunks` chunks per sequence (1 to [`MAX_SEQ_CHUNKS`]; 1 leaves the plan as it is), cut
    /// `by` tokens or cost, and the memory limit of a rescheduled split-backward plan (finite,
    /// > 0; None: the default of the module doc).
    pub fn new(chunks: u32, by: SplitBy, memory: Option<f64>) -> Result<SeqSplit, TransformError> {
        if chunks == 0 || chunks > MAX_SEQ_CHUNKS {
            return Err(TransformError::precondition(
                Self::NAME,
                &format!("1 <= chunks <= {MAX_SEQ_CHUNKS}"),
                format!("chunks = {chunks}"),
            ));
        }
        if let Some(m) = memory.filter(|m| !(m.is_finite() && *m > 0.0)) {
            return Err(TransformError::precondition(
                Self::NAME,
                "memory > 0",
                format!("memory={m} is not a positive number of activations"),
            ));
        }
        Ok(SeqSplit { chunks, by, memory })
    }

    /// The chunks, their costs and memory: the split problem and its models.
    fn reshape(&self, plan: &Plan) -> Result<(Problem, CostModel, MemoryModel), TransformError> {
        let k = self.chunks;
        let costs = plan.costs();
        let layout = costs.layer_layout();
        if let Some(layout) = layout {
            if layout.sequence().is_none() {
                return Err(TransformError::precondition(
                    Self::NAME,
                    "a model with a sequence",
                    "the profile's model gives no seq_len, so there is no sequence to split",
                ));
            }
        }
        let scale = |x: f64| layout.map_or(x, |l| l.table().length_scale(x));
        let tokens = layout.and_then(|l| l.sequence());
        let cut = SequenceCut::new(k, self.by, tokens, scale)
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        let cost_shares = cut.cost_shares(scale);
        let token_shares = cut.token_shares();
        let largest = token_shares.iter().copied().fold(0.0f64, f64::max);
        let problem = plan.problem();
        let units = u64::from(problem.microbatches()) * u64::from(k);
        let spec = ProblemSpec::builder()
            .ranks(problem.ranks())
            .microbatches(u32::try_from(units).unwrap_or(u32::MAX))
            .stage_to_rank(problem.stage_to_rank().iter().map(|r| r.get()).collect())
            .routes(if problem.has_explicit_routes() {
                problem
                    .route_specs()
                    .into_iter()
                    .map(|r| RouteSpec {
                        first: r.first * k,
                        end: r.end * k,
                        stages: r.stages,
                    })
                    .collect()
            } else {
                Vec::new()
            })
            .tied_stages(
                problem
                    .tied_stages()
                    .iter()
                    .map(|g| g.iter().map(|s| s.get()).collect())
                    .collect(),
            )
            .seq_chunks(k)
            .seq_bounds(cut.bounds().to_vec())
            .build();
        let split = spec
            .validate()
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        let scales = (0..problem.microbatches())
            .flat_map(|m| {
                let whole = costs.microbatch_scale(m.into());
                cost_shares.iter().map(move |share| whole * share)
            })
            .collect();
        let mut chunk_costs = CostModel::per_stage(costs.stages().to_vec(), costs.comm() * largest)
            .and_then(|c| c.with_microbatch_scales(scales))
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        if let Some(layout) = layout {
            chunk_costs = chunk_costs.with_layer_layout(layout.clone());
        }
        let stages = plan
            .memory()
            .stages()
            .iter()
            .map(keeping_keys_and_values)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        let memory_scales = (0..problem.microbatches())
            .flat_map(|m| {
                let whole = plan.memory().microbatch_scale(m.into());
                token_shares.iter().map(move |share| whole * share)
            })
            .collect();
        let memory = MemoryModel::per_stage(stages)
            .with_microbatch_scales(memory_scales)
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        Ok((split, chunk_costs, memory))
    }

    /// The default limit of a rescheduled split-backward plan (see the module doc), a chunk's
    /// share taken as the mean, `1/k`.
    fn default_limit(&self, plan: &Plan) -> f64 {
        let share = 1.0 / f64::from(self.chunks);
        let problem = plan.problem();
        let extra = f64::from(self.chunks - 1);
        peak_per_rank(plan)
            .iter()
            .map(|p| {
                let per_microbatch: f64 = problem
                    .stages_of(p.rank)
                    .iter()
                    .filter_map(|s| plan.memory().stages().get(s.index()))
                    .map(StageMemory::total)
                    .sum();
                (p.peak + extra * per_microbatch) * share
            })
            .fold(0.0, f64::max)
    }
}

/// A stage's figures with the checkpoint at least the keys and values (which later chunks
/// read, so a recomputed or offloaded chunk keeps them).
fn keeping_keys_and_values(stage: &StageMemory) -> Result<StageMemory, pipeweave_core::CoreError> {
    let total = stage.total();
    StageMemorySpec::builder()
        .total(total)
        .weight_grad(stage.weight_grad())
        .checkpoint(stage.checkpoint().max(KV_SHARE * total).min(total))
        .build()
        .validate()
}

/// Every task of `orders` as its `k` chunks: forwards in sequence order, backwards (I, W, B)
/// in reverse, so that each chunk's dependencies on its neighbours hold.
fn chunked(orders: &[Vec<Task>], k: u32) -> Result<Vec<Vec<Task>>, TransformError> {
    orders
        .iter()
        .map(|order| {
            let mut out = Vec::with_capacity(order.len() * k as usize);
            for task in order {
                if !matches!(
                    task,
                    Task::Forward(_) | Task::Backward(_) | Task::InputGrad(_) | Task::WeightGrad(_)
                ) {
                    return Err(TransformError::precondition(
                        SeqSplit::NAME,
                        "plain forwards and backwards",
                        format!("the order holds {}", task.notation()),
                    ));
                }
                let first = task.work().microbatch.get() * k;
                let chunks: Vec<u32> = if task.is_forward() {
                    (0..k).collect()
                } else {
                    (0..k).rev().collect()
                };
                for c in chunks {
                    let mut chunk = *task;
                    chunk.work_mut().microbatch = (first + c).into();
                    out.push(chunk);
                }
            }
            Ok(out)
        })
        .collect()
}

/// Seq1F1B's rule on chunked whole-backward `orders`: per rank, the chunk forwards and chunk
/// backwards merged after `w + k - 1` forwards. On the linear layout `w` is 1F1B's `P - r - 1`
/// (the `f1b` pass's rule, sail-sg's order); elsewhere the input `coarse` order's warm-up, the
/// forwards before the rank's first backward less the one its first pair begins with.
fn seq1f1b(coarse: &[Vec<Task>], orders: &[Vec<Task>], k: u32, linear: bool) -> Vec<Vec<Task>> {
    let ranks = coarse.len();
    let k = k as usize;
    coarse
        .iter()
        .zip(orders)
        .enumerate()
        .map(|(r, (input, order))| {
            let warmup = if linear {
                super::f1b::warmup(ranks, r, k)
            } else {
                let before_backward = input
                    .iter()
                    .position(|t| !t.is_forward())
                    .unwrap_or(input.len());
                before_backward.saturating_sub(1) + k - 1
            };
            let (forwards, backwards): (Vec<Task>, Vec<Task>) =
                order.iter().partition(|t| t.is_forward());
            warmup_merge(&forwards, &backwards, warmup)
        })
        .collect()
}

/// `auto` over the chunks of `baseline` (the input's orders chunked) within the default `limit`,
/// else within limits halfway up to the baseline's own peak, else the baseline's orders: where
/// the chunks' dependencies hold more than the default counts (few microbatches on many
/// stages), the split still runs, at no more memory than the input.
fn within_default(baseline: &Plan, limit: f64) -> Vec<Vec<Task>> {
    let ceiling = max_peak(baseline);
    let mut at = limit;
    for _ in 0..3 {
        if let Some(orders) = auto_within(baseline, at.min(ceiling)) {
            return orders;
        }
        at = 0.5 * (at + ceiling);
    }
    baseline.orders().to_vec()
}

impl Pass for SeqSplit {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        let requires = Requires::paced(Requires::SCHEDULED)
            .on_layouts(&[LayoutKind::Linear, LayoutKind::Interleaved]);
        Contract::new(requires, Changes::PLACEMENT.and(Changes::PACING))
    }

    fn describe(&self) -> String {
        let memory = self
            .memory
            .map_or(String::new(), |m| format!(", memory={m}"));
        format!(
            "{}(chunks={}, split={}{memory})",
            Self::NAME,
            self.chunks,
            self.by.name()
        )
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        super::whole_sequences(Self::NAME, &plan)?;
        if self.chunks == 1 {
            return Ok(plan);
        }
        let (problem, costs, memory) = self.reshape(&plan)?;
        let k = self.chunks;
        let facts = plan.facts();
        let chunked_orders = chunked(plan.orders(), k)?;
        let limit = self.memory.unwrap_or_else(|| self.default_limit(&plan));
        let shape = Some((problem, costs, memory));
        let baseline = plan
            .clone()
            .reshaped(shape.clone(), chunked_orders.clone(), facts)
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        let (orders, pacing) = match (facts.pacing, facts.backwards) {
            (Pacing::FillDrain, _) => return Ok(baseline),
            (_, Backwards::Whole) => {
                let linear = facts.layout.kind() == LayoutKind::Linear;
                let merged = seq1f1b(plan.orders(), &chunked_orders, k, linear);
                let runs = baseline
                    .clone()
                    .with_orders(merged.clone())
                    .is_ok_and(|p| simulate(&p).is_ok());
                if runs {
                    (merged, facts.pacing)
                } else {
                    return Ok(baseline);
                }
            }
            (_, Backwards::Split) => {
                let orders = match self.memory {
                    Some(_) => auto_within(&baseline, limit).ok_or_else(|| {
                        TransformError::unmet(
                            "a schedule of the chunks within the memory limit",
                            format!("no candidate fits in {limit} activations per rank"),
                        )
                    })?,
                    None => within_default(&baseline, limit),
                };
                (orders, Pacing::Custom)
            }
        };
        let facts = Facts { pacing, ..facts };
        baseline
            .reshaped(None, orders, facts)
            .map_err(|e| TransformError::core(Self::NAME, e))
    }
}
