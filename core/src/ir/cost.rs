//! The cost model: how long each op of each stage takes, and the latency of a cross-rank edge.
//!
//! Per stage: `F` (forward), `I` (backward for the input gradient), `W` (backward for the weight
//! gradient), `B` (the fused full backward; defaults to I + W) and `FB` (one forward overlapped with
//! one full backward in a single op; defaults to F + I + W), `R` (a recompute forward, which
//! rebuilds dropped activations; defaults to F) and `offload` (moving one microbatch's
//! activations of the stage between device and host, one way, over the rank's host link;
//! defaults to F). `comm` is added to every dependency edge whose two ops run on different
//! ranks. `a2a` is the time of the expert-parallel all-to-alls of one forward of a mixture of
//! experts (as many again in a backward), run on a communication resource beside the computes;
//! where they fall around each task is [`crate::ir::all_to_all`]'s. Every figure is finite and
//! non-negative.
//!
//! A model may also carry the [`LayerLayout`] its stages were cut from (a profile's layers), so
//! that a pass reshaping the problem prices each new position by its own layers. Costs are plain
//! data: a [`CostModel`] compares and hashes by its figures (each `f64` by its bits; validation
//! turns `-0` into `0`), so a plan's costs can be fingerprinted by hashing them.

use crate::error::CoreError;
use crate::formats::number::show_number;
use crate::ir::all_to_all::A2aPhases;
use crate::ir::ids::{MicrobatchId, StageId};
use crate::ir::layers::LayerLayout;
use crate::ir::op::{Op, OpKind, Task, Work};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use typed_builder::TypedBuilder;

/// Durations of one stage's ops, as a user writes them; validated by [`StageCostsSpec::validate`].
#[derive(Clone, Copy, Debug, TypedBuilder)]
pub struct StageCostsSpec {
    /// Forward.
    #[builder(default = 1.0)]
    forward: f64,
    /// Backward for the input gradient.
    #[builder(default = 1.0)]
    input_grad: f64,
    /// Backward for the weight gradient.
    #[builder(default = 1.0)]
    weight_grad: f64,
    /// Fused full backward; default `input_grad + weight_grad`.
    #[builder(default, setter(strip_option(fallback = full_backward_opt)))]
    full_backward: Option<f64>,
    /// Forward overlapped with a full backward; default `forward + full_backward`.
    #[builder(default, setter(strip_option(fallback = overlapped_opt)))]
    overlapped: Option<f64>,
    /// A recompute forward; default `forward`.
    #[builder(default, setter(strip_option(fallback = recompute_opt)))]
    recompute: Option<f64>,
    /// One transfer of a microbatch's activations between device and host; default `forward`.
    #[builder(default, setter(strip_option(fallback = offload_opt)))]
    offload: Option<f64>,
    /// The expert-parallel all-to-alls of one forward (dispatch and combine of every MoE layer
    /// together; a backward has as many again); 0 for a model without experts.
    #[builder(default = 0.0)]
    a2a: f64,
    /// The share of each compute spent in the experts (between the dispatch and the combine);
    /// the rest is attention and routing. Default one half.
    #[builder(default = 0.5)]
    expert_share: f64,
}

/// Validated durations of one stage's ops (compared and hashed by their bits).
#[derive(Clone, Copy, Debug)]
pub struct StageCosts {
    forward: f64,
    input_grad: f64,
    weight_grad: f64,
    full_backward: f64,
    overlapped: f64,
    /// Whether `overlapped` was given (else it is the sum of the parts).
    overlapped_given: bool,
    recompute: f64,
    offload: f64,
    a2a: f64,
    expert_share: f64,
}

/// The longest duration a cost figure may have: far beyond any step, and small enough that the
/// sums a plan makes of its durations (a fused backward of I + W, an F&B, a makespan of millions
/// of ops) stay finite numbers.
pub const MAX_DURATION: f64 = 1e100;

fn check_duration(stage: &str, name: &str, value: f64) -> Result<f64, CoreError> {
    if value.is_finite() && (0.0..=MAX_DURATION).contains(&value) {
        // `-0` as `0`, so that comparing bits is comparing numbers.
        Ok(value.abs())
    } else {
        Err(invalid(
            stage,
            format!(
                "{name} = {} must be a duration between 0 and {}",
                show_number(value),
                show_number(MAX_DURATION)
            ),
        ))
    }
}

/// The error of a cost figure of `stage` (or `all`) that is out of range.
fn invalid(stage: &str, reason: String) -> CoreError {
    CoreError::InvalidModel {
        model: "cost model",
        stage: stage.to_string(),
        reason,
    }
}

impl StageCostsSpec {
    /// Checks that every duration is finite and non-negative.
    pub fn validate(self) -> Result<StageCosts, CoreError> {
        self.validate_for("all")
    }

    fn validate_for(self, stage: &str) -> Result<StageCosts, CoreError> {
        let forward = check_duration(stage, "F", self.forward)?;
        let input_grad = check_duration(stage, "I", self.input_grad)?;
        let weight_grad = check_duration(stage, "W", self.weight_grad)?;
        let full_backward = check_duration(
            stage,
            "B",
            self.full_backward.unwrap_or(input_grad + weight_grad),
        )?;
        let overlapped = check_duration(
            stage,
            "FB",
            self.overlapped.unwrap_or(forward + full_backward),
        )?;
        let overlapped_given = self.overlapped.is_some();
        let recompute = check_duration(stage, "R", self.recompute.unwrap_or(forward))?;
        let offload = check_duration(stage, "offload", self.offload.unwrap_or(forward))?;
        let a2a = check_duration(stage, "a2a", self.a2a)?;
        if !(0.0..=1.0).contains(&self.expert_share) {
            return Err(invalid(
                stage,
                format!(
                    "experts = {} must be a share of the compute between 0 and 1",
                    show_number(self.expert_share)
                ),
            ));
        }
        if a2a > 0.0 && self.expert_share == 0.0 {
            return Err(invalid(
                stage,
                format!(
                    "a2a = {} is an all-to-all cost, but experts = 0 says the model has no experts",
                    show_number(a2a)
                ),
            ));
        }
        let expert_share = self.expert_share.abs();
        Ok(StageCosts {
            forward,
            input_grad,
            weight_grad,
            full_backward,
            overlapped,
            overlapped_given,
            recompute,
            offload,
            a2a,
            expert_share,
        })
    }
}

impl StageCosts {
    /// Forward duration.
    pub fn forward(&self) -> f64 {
        self.forward
    }
    /// Input-gradient backward duration.
    pub fn input_grad(&self) -> f64 {
        self.input_grad
    }
    /// Weight-gradient backward duration.
    pub fn weight_grad(&self) -> f64 {
        self.weight_grad
    }
    /// Fused full backward duration.
    pub fn full_backward(&self) -> f64 {
        self.full_backward
    }
    /// Overlapped forward + full backward duration.
    pub fn overlapped(&self) -> f64 {
        self.overlapped
    }
    /// Whether the overlapped duration was given (else an F&B costs its forward plus its
    /// backward: fusing saves nothing).
    pub fn overlapped_given(&self) -> bool {
        self.overlapped_given
    }
    /// Recompute forward duration.
    pub fn recompute(&self) -> f64 {
        self.recompute
    }
    /// Duration of one device-host transfer of a microbatch's activations.
    pub fn offload(&self) -> f64 {
        self.offload
    }
    /// The expert-parallel all-to-alls of one forward (a backward has as many again).
    pub fn a2a(&self) -> f64 {
        self.a2a
    }
    /// The share of each compute spent in the experts.
    pub fn expert_share(&self) -> f64 {
        self.expert_share
    }
    /// Duration of one atomic op of `kind` (the unfused figures: F, I or W).
    pub fn of(&self, kind: OpKind) -> f64 {
        match kind {
            OpKind::Forward => self.forward,
            OpKind::InputGrad => self.input_grad,
            OpKind::WeightGrad => self.weight_grad,
        }
    }
    /// All durations divided by `parts` (a rank's share split into `parts` chunks).
    pub fn split(&self, parts: u32) -> StageCosts {
        let k = f64::from(parts.max(1));
        StageCosts {
            forward: self.forward / k,
            input_grad: self.input_grad / k,
            weight_grad: self.weight_grad / k,
            full_backward: self.full_backward / k,
            overlapped: self.overlapped / k,
            overlapped_given: self.overlapped_given,
            recompute: self.recompute / k,
            offload: self.offload / k,
            a2a: self.a2a / k,
            expert_share: self.expert_share,
        }
    }

    fn key(&self) -> ([u64; 9], bool) {
        let figures = [
            self.forward,
            self.input_grad,
            self.weight_grad,
            self.full_backward,
            self.overlapped,
            self.recompute,
            self.offload,
            self.a2a,
            self.expert_share,
        ];
        (figures.map(f64::to_bits), self.overlapped_given)
    }
}

eq_and_hash_by_key!(StageCosts);

impl Default for StageCosts {
    fn default() -> Self {
        StageCostsSpec::builder()
            .build()
            .validate()
            .expect("the default unit costs are valid")
    }
}

/// Validated costs of every stage plus the cross-rank latency, optionally a factor per
/// microbatch (variable-length microbatches: microbatch `m`'s ops on every stage take
/// `scale[m]` times the stage's figures; transfers keep `comm`) and the [`LayerLayout`] the
/// stages were cut from, which prices the stages of reshaped problems. Compared and hashed as
/// data (the layout by value; it is shared between clones).
#[derive(Clone, Debug)]
pub struct CostModel {
    stages: Vec<StageCosts>,
    /// Whether any stage has all-to-alls (read per task: kept, not searched).
    a2a: bool,
    comm: f64,
    microbatch_scales: Vec<f64>,
    layers: Option<Arc<LayerLayout>>,
}

impl PartialEq for CostModel {
    /// The same figures, bit for bit, and the same layer layout (or none).
    fn eq(&self, other: &CostModel) -> bool {
        self.stages == other.stages
            && self.comm.to_bits() == other.comm.to_bits()
            && self.microbatch_scales.len() == other.microbatch_scales.len()
            && self
                .microbatch_scales
                .iter()
                .zip(&other.microbatch_scales)
                .all(|(a, b)| a.to_bits() == b.to_bits())
            && self.layers == other.layers
    }
}

impl Eq for CostModel {}

impl Hash for CostModel {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.stages.hash(state);
        self.comm.to_bits().hash(state);
        self.microbatch_scales.len().hash(state);
        for scale in &self.microbatch_scales {
            scale.to_bits().hash(state);
        }
        self.layers.hash(state);
    }
}

/// Whether any of `stages` has all-to-alls.
fn any_a2a(stages: &[StageCosts]) -> bool {
    stages.iter().any(|s| s.a2a > 0.0)
}

impl CostModel {
    /// The same costs for each of `stages` stages.
    pub fn uniform(stages: u32, costs: StageCosts, comm: f64) -> Result<CostModel, CoreError> {
        Self::per_stage(vec![costs; stages as usize], comm)
    }

    /// One entry per stage.
    pub fn per_stage(stages: Vec<StageCosts>, comm: f64) -> Result<CostModel, CoreError> {
        let comm = check_duration("all", "comm", comm)?;
        Ok(CostModel {
            a2a: any_a2a(&stages),
            stages,
            comm,
            microbatch_scales: Vec::new(),
            layers: None,
        })
    }

    /// The same model, with `layers` (the cut its stages come from) giving the figures of the
    /// problems passes reshape it into ([`LayerLayout::stages_of`]).
    pub fn with_layer_layout(mut self, layers: LayerLayout) -> CostModel {
        self.layers = Some(Arc::new(layers));
        self
    }

    /// The layer layout the stages were cut from, if any: where a reshaped problem's figures
    /// come from.
    pub fn layer_layout(&self) -> Option<&LayerLayout> {
        self.layers.as_deref()
    }

    /// The same model with microbatch `m`'s ops scaled by `scales[m]` (finite, > 0; empty for
    /// none). A microbatch beyond the list keeps the stage's figures.
    pub fn with_microbatch_scales(mut self, scales: Vec<f64>) -> Result<CostModel, CoreError> {
        if let Some((m, s)) = scales
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(invalid(
                "all",
                format!("microbatch {m}'s cost scale {s} must be finite and > 0"),
            ));
        }
        self.microbatch_scales = scales;
        Ok(self)
    }

    /// The same latency, microbatch scales and layer layout over other stages (a pass that
    /// changes the layout keeps what is not per stage).
    pub fn with_stages(&self, stages: Vec<StageCosts>) -> CostModel {
        CostModel {
            a2a: any_a2a(&stages),
            stages,
            comm: self.comm,
            microbatch_scales: self.microbatch_scales.clone(),
            layers: self.layers.clone(),
        }
    }

    /// The factor of microbatch `m`'s ops (1 without scales).
    pub fn microbatch_scale(&self, m: MicrobatchId) -> f64 {
        self.microbatch_scales
            .get(m.index())
            .copied()
            .unwrap_or(1.0)
    }

    /// The per-microbatch factors (empty: all 1).
    pub fn microbatch_scales(&self) -> &[f64] {
        &self.microbatch_scales
    }

    /// Validates per-stage specs, naming the stage in an error.
    pub fn from_specs(specs: Vec<StageCostsSpec>, comm: f64) -> Result<CostModel, CoreError> {
        let stages = specs
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.validate_for(&i.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        Self::per_stage(stages, comm)
    }

    /// Costs of each stage.
    pub fn stages(&self) -> &[StageCosts] {
        &self.stages
    }
    /// Costs of one stage (None when out of range).
    pub fn stage(&self, stage: StageId) -> Option<&StageCosts> {
        self.stages.get(stage.index())
    }
    /// Costs of one stage, or the default unit costs when it is out of range (the verifier
    /// reports such stages; analyses must not fail on them first).
    fn stage_or_default(&self, stage: StageId) -> StageCosts {
        self.stage(stage).copied().unwrap_or_default()
    }
    /// Duration of one atomic op (unfused).
    pub fn op_cost(&self, op: Op) -> f64 {
        self.stage_or_default(op.stage).of(op.kind) * self.microbatch_scale(op.microbatch)
    }
    /// Duration of a task: its fused figure for B and F&B, the op's own for F, I and W. An
    /// overlapped F&B costs its two parts, the forward stage's `F` plus the backward stage's `B`,
    /// unless both stages give `FB`, which then prices it (the longer of the two).
    pub fn task_duration(&self, task: &Task) -> f64 {
        let compute = self.compute_duration(task);
        if self.has_a2a() {
            compute + self.a2a_phases(task).inside_exposed
        } else {
            compute
        }
    }

    /// Whether any stage has all-to-alls.
    pub fn has_a2a(&self) -> bool {
        self.a2a
    }

    /// Duration of a task's computes alone (without its all-to-alls): [`CostModel::task_duration`]
    /// where no stage has all-to-alls.
    pub fn compute_duration(&self, task: &Task) -> f64 {
        let cost = |w: Work| self.stage_or_default(w.stage);
        let scale = |w: Work| self.microbatch_scale(w.microbatch);
        match *task {
            Task::Forward(w) => cost(w).forward() * scale(w),
            Task::InputGrad(w) => cost(w).input_grad() * scale(w),
            Task::WeightGrad(w) => cost(w).weight_grad() * scale(w),
            Task::Backward(w) => cost(w).full_backward() * scale(w),
            Task::Overlapped { forward, backward } => {
                let (f, b) = (cost(forward), cost(backward));
                if f.overlapped_given && b.overlapped_given {
                    (f.overlapped() * scale(forward)).max(b.overlapped() * scale(backward))
                } else {
                    f.forward() * scale(forward) + b.full_backward() * scale(backward)
                }
            }
            Task::Recompute(w) => cost(w).recompute() * scale(w),
            // The forward again, then the input-gradient backward again.
            Task::RecomputeWeightGrad(w) => (cost(w).recompute() + cost(w).input_grad()) * scale(w),
            Task::Offload(w) | Task::Reload(w) => cost(w).offload() * scale(w),
        }
    }

    /// Where `task`'s all-to-alls fall around its compute (see [`crate::ir::all_to_all`]).
    pub fn a2a_phases(&self, task: &Task) -> A2aPhases {
        let cost = |w: Work| self.stage_or_default(w.stage);
        let a2a = |w: Work| cost(w).a2a() * self.microbatch_scale(w.microbatch);
        match *task {
            Task::Forward(w) => A2aPhases::forward(a2a(w)),
            Task::InputGrad(w) | Task::Backward(w) => A2aPhases::backward(a2a(w)),
            Task::Recompute(w) => A2aPhases::inside(a2a(w)),
            Task::RecomputeWeightGrad(w) => A2aPhases::inside(2.0 * a2a(w)),
            Task::Overlapped { forward, backward } => {
                let f = cost(forward).forward() * self.microbatch_scale(forward.microbatch);
                let b = cost(backward).full_backward() * self.microbatch_scale(backward.microbatch);
                // A given F&B price fuses the computes: each half's share of it.
                let fused = self.compute_duration(task);
                let k = if f + b > 0.0 { fused / (f + b) } else { 1.0 };
                A2aPhases::overlapped(
                    f * k,
                    a2a(forward),
                    b * k,
                    a2a(backward),
                    cost(forward).expert_share(),
                )
            }
            Task::WeightGrad(_) | Task::Offload(_) | Task::Reload(_) => A2aPhases::NONE,
        }
    }

    /// Latency of one cross-rank edge.
    pub fn comm(&self) -> f64 {
        self.comm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microbatch_scales_multiply_every_task_of_their_microbatch() {
        let model = CostModel::uniform(2, StageCosts::default(), 0.5)
            .unwrap()
            .with_microbatch_scales(vec![1.0, 0.25])
            .unwrap();
        let work = |m: u32| Work {
            stage: StageId::new(1),
            microbatch: MicrobatchId::new(m),
        };
        assert_eq!(model.task_duration(&Task::Forward(work(0))), 1.0);
        assert_eq!(model.task_duration(&Task::Forward(work(1))), 0.25);
        assert_eq!(model.task_duration(&Task::Backward(work(1))), 0.5);
        // Beyond the list: the stage's figures; the latency is not scaled.
        assert_eq!(model.task_duration(&Task::WeightGrad(work(5))), 1.0);
        assert_eq!(model.comm(), 0.5);
        let kept = model.with_stages(vec![StageCosts::default().split(2); 4]);
        assert_eq!(kept.microbatch_scales(), [1.0, 0.25]);
        let err = CostModel::uniform(1, StageCosts::default(), 0.0)
            .unwrap()
            .with_microbatch_scales(vec![1.0, 0.0])
            .unwrap_err();
        assert!(
            err.to_string().contains("microbatch 1's cost scale 0"),
            "{err}"
        );
    }

    #[test]
    fn fused_costs_default_to_sums() {
        let c = StageCostsSpec::builder()
            .forward(1.0)
            .input_grad(2.0)
            .weight_grad(0.5)
            .build()
            .validate()
            .unwrap();
        assert_eq!(c.full_backward(), 2.5);
        assert_eq!(c.overlapped(), 3.5);
        assert_eq!(c.recompute(), 1.0);
        assert_eq!(c.offload(), 1.0);
        assert_eq!(c.split(2).forward(), 0.5);
        let r = StageCostsSpec::builder()
            .forward(2.0)
            .recompute(1.5)
            .offload(0.25)
            .build()
            .validate()
            .unwrap();
        assert_eq!((r.recompute(), r.split(2).offload()), (1.5, 0.125));
    }

    #[test]
    fn negative_and_nan_costs_are_rejected() {
        for (spec, why) in [
            (
                StageCostsSpec::builder().offload(-1.0).build(),
                "offload = -1",
            ),
            (
                StageCostsSpec::builder().forward(-1.0).build(),
                "F = -1 must be a duration between 0 and 1e100",
            ),
        ] {
            let err = spec.validate().unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
        }
        let err = CostModel::from_specs(
            vec![
                StageCostsSpec::builder().build(),
                StageCostsSpec::builder().weight_grad(f64::NAN).build(),
            ],
            0.0,
        )
        .unwrap_err();
        assert!(err.to_string().contains("stage 1"), "{err}");
        assert!(CostModel::uniform(2, StageCosts::default(), f64::INFINITY).is_err());
    }
}
