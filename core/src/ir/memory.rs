//! The activation-memory model (the per-rank replay of it is [`crate::analysis::peak`]).
//!
//! Per stage: `total`, the activation memory one microbatch's forward leaves on the rank, and
//! `weight_grad`, the part of it held until that microbatch's W; the rest is released by I. A fused
//! backward (B) releases all of it. Figures are in units of one microbatch's activations of a rank's
//! whole share of the model, so a pass that splits a rank's share into chunks divides them. The
//! default keeps everything until W (`weight_grad = total`), which is how the reference schedules
//! count activations. `checkpoint` is what a forward whose activations are dropped for a later
//! recompute keeps (its stage input; default 0, the usual approximation: a stage's input is small
//! beside the activations inside it). `experts` is the part a mixture of experts' experts keep
//! (default 0): the rows the dispatch all-to-all sent them (each token once per expert it is
//! routed to) and what they compute from them, held from the forward until the W (the experts'
//! weight gradients read them, so it is a part of `weight_grad`), none of it in the checkpoint
//! (a recompute redoes the dispatch). It is counted apart ([`StageMemory::experts_part`], the
//! peak analysis's experts' share of a peak); the totals already hold it.
//!
//! The figures are plain data: [`StageMemory`] and [`MemoryModel`] compare and hash by their bits
//! (validation turns `-0` into `0`, so that is comparing the numbers).

use crate::error::CoreError;
use crate::ir::ids::{MicrobatchId, StageId};
use crate::ir::op::OpKind;
use typed_builder::TypedBuilder;

/// One stage's activation figures as a user writes them.
#[derive(Clone, Copy, Debug, TypedBuilder)]
pub struct StageMemorySpec {
    /// Memory one microbatch's forward leaves until its backward.
    #[builder(default = 1.0)]
    total: f64,
    /// Part of `total` held until W; default all of it.
    #[builder(default, setter(strip_option(fallback = weight_grad_opt)))]
    weight_grad: Option<f64>,
    /// Part of `total` a recomputed forward keeps until its recompute; default none.
    #[builder(default = 0.0)]
    checkpoint: f64,
    /// Part of `weight_grad` the experts of a mixture keep (see the module doc); default none.
    #[builder(default = 0.0)]
    experts: f64,
}

/// Validated activation figures of one stage (`0 <= weight_grad <= total`,
/// `0 <= checkpoint <= total`, `0 <= experts <= weight_grad`, finite; compared and hashed by
/// their bits).
#[derive(Clone, Copy, Debug)]
pub struct StageMemory {
    total: f64,
    weight_grad: f64,
    checkpoint: f64,
    experts: f64,
}

impl StageMemorySpec {
    /// Checks `0 <= weight_grad <= total`, `0 <= checkpoint <= total`,
    /// `0 <= experts <= weight_grad`, all finite.
    pub fn validate(self) -> Result<StageMemory, CoreError> {
        let total = self.total;
        let weight_grad = self.weight_grad.unwrap_or(total);
        if !(total.is_finite() && total >= 0.0) {
            return Err(invalid(format!("total = {total} must be finite and >= 0")));
        }
        if !(weight_grad.is_finite() && (0.0..=total).contains(&weight_grad)) {
            return Err(invalid(format!(
                "weight_grad = {weight_grad} must lie between 0 and total = {total}"
            )));
        }
        let checkpoint = self.checkpoint;
        if !(checkpoint.is_finite() && (0.0..=total).contains(&checkpoint)) {
            return Err(invalid(format!(
                "checkpoint = {checkpoint} must lie between 0 and total = {total}"
            )));
        }
        let experts = self.experts;
        if !(experts.is_finite() && (0.0..=weight_grad).contains(&experts)) {
            return Err(invalid(format!(
                "experts = {experts} must lie between 0 and weight_grad = {weight_grad} (the \
                 experts' rows are held until their weight gradients)"
            )));
        }
        // `-0` as `0` (every figure is >= 0 here), so that comparing bits is comparing numbers.
        Ok(StageMemory {
            total: total.abs(),
            weight_grad: weight_grad.abs(),
            checkpoint: checkpoint.abs(),
            experts: experts.abs(),
        })
    }
}

/// The error of a memory figure (or limit) that is out of range.
pub(crate) fn invalid(reason: String) -> CoreError {
    CoreError::InvalidModel {
        model: "memory model",
        stage: "all".to_string(),
        reason,
    }
}

impl StageMemory {
    /// Memory a forward leaves.
    pub fn total(&self) -> f64 {
        self.total
    }
    /// Part held until W.
    pub fn weight_grad(&self) -> f64 {
        self.weight_grad
    }
    /// Part a recomputed forward keeps until its recompute.
    pub fn checkpoint(&self) -> f64 {
        self.checkpoint
    }
    /// Part the experts of a mixture keep (see the module doc).
    pub fn experts(&self) -> f64 {
        self.experts
    }
    /// The experts' part alone, as figures of its own: `total` and `weight_grad` are
    /// `experts` (held from the forward to the W), no checkpoint (a recompute rebuilds it all),
    /// so every rule of the memory model counts it as it counts the whole.
    pub fn experts_part(&self) -> StageMemory {
        StageMemory {
            total: self.experts,
            weight_grad: self.experts,
            checkpoint: 0.0,
            experts: self.experts,
        }
    }
    /// What dropping a forward's activations for a recompute frees (and the recompute holds
    /// again): `total - checkpoint`.
    pub fn dropped(&self) -> f64 {
        self.total - self.checkpoint
    }
    /// What a pair recomputed for its W keeps from its I to its `RW`: its stage input and the
    /// output gradient its I received (each the size of a checkpoint), at most what the W keeps.
    pub fn weight_grad_checkpoint(&self) -> f64 {
        (2.0 * self.checkpoint).min(self.weight_grad)
    }
    /// Every figure times `factor` (finite, > 0: a validated scale).
    pub fn scaled(&self, factor: f64) -> StageMemory {
        StageMemory {
            total: self.total * factor,
            weight_grad: self.weight_grad * factor,
            checkpoint: self.checkpoint * factor,
            experts: self.experts * factor,
        }
    }
    /// Every figure divided by `parts`.
    pub fn split(&self, parts: u32) -> StageMemory {
        let k = f64::from(parts.max(1));
        StageMemory {
            total: self.total / k,
            weight_grad: self.weight_grad / k,
            checkpoint: self.checkpoint / k,
            experts: self.experts / k,
        }
    }
    /// Change of held memory when `kind` runs.
    pub fn delta(&self, kind: OpKind) -> f64 {
        match kind {
            OpKind::Forward => self.total,
            OpKind::InputGrad => -(self.total - self.weight_grad),
            OpKind::WeightGrad => -self.weight_grad,
        }
    }

    fn key(&self) -> [u64; 4] {
        [self.total, self.weight_grad, self.checkpoint, self.experts].map(f64::to_bits)
    }
}

eq_and_hash_by_key!(StageMemory);

impl Default for StageMemory {
    fn default() -> Self {
        StageMemorySpec::builder()
            .build()
            .validate()
            .expect("the default memory figures are valid")
    }
}

/// Validated activation figures of every stage, optionally a factor per microbatch (sequence
/// chunks of different lengths: microbatch `m` holds `scale[m]` times the stage's figures);
/// compared and hashed as data.
#[derive(Clone, Debug)]
pub struct MemoryModel {
    stages: Vec<StageMemory>,
    microbatch_scales: Vec<f64>,
}

impl PartialEq for MemoryModel {
    fn eq(&self, other: &MemoryModel) -> bool {
        self.stages == other.stages && self.scale_bits() == other.scale_bits()
    }
}

impl Eq for MemoryModel {}

impl std::hash::Hash for MemoryModel {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.stages.hash(state);
        self.scale_bits().hash(state);
    }
}

impl MemoryModel {
    /// The same figures for each of `stages` stages.
    pub fn uniform(stages: u32, memory: StageMemory) -> MemoryModel {
        Self::per_stage(vec![memory; stages as usize])
    }
    /// One entry per stage.
    pub fn per_stage(stages: Vec<StageMemory>) -> MemoryModel {
        MemoryModel {
            stages,
            microbatch_scales: Vec::new(),
        }
    }
    /// The same model with microbatch `m`'s figures scaled by `scales[m]` (finite, > 0; empty
    /// for none). A microbatch beyond the list keeps the stage's figures.
    pub fn with_microbatch_scales(mut self, scales: Vec<f64>) -> Result<MemoryModel, CoreError> {
        if let Some((m, s)) = scales
            .iter()
            .enumerate()
            .find(|(_, s)| !(s.is_finite() && **s > 0.0))
        {
            return Err(invalid(format!(
                "microbatch {m}'s memory scale {s} must be finite and > 0"
            )));
        }
        self.microbatch_scales = scales;
        Ok(self)
    }
    /// Figures of every stage (for one microbatch of scale 1).
    pub fn stages(&self) -> &[StageMemory] {
        &self.stages
    }
    /// Whether any stage's experts keep memory of their own.
    pub fn has_experts(&self) -> bool {
        self.stages.iter().any(|s| s.experts > 0.0)
    }
    /// The per-microbatch factors (empty: all 1).
    pub fn microbatch_scales(&self) -> &[f64] {
        &self.microbatch_scales
    }
    /// The factor of microbatch `m`'s figures (1 without scales).
    pub fn microbatch_scale(&self, m: MicrobatchId) -> f64 {
        self.microbatch_scales
            .get(m.index())
            .copied()
            .unwrap_or(1.0)
    }
    /// What microbatch `microbatch` holds on `stage` (None for a stage out of range): the
    /// stage's figures times the microbatch's scale. The one place analyses and schedulers
    /// read an op's memory from.
    #[inline]
    pub fn of(&self, stage: StageId, microbatch: MicrobatchId) -> Option<StageMemory> {
        let figures = *self.stages.get(stage.index())?;
        match self.microbatch_scales.get(microbatch.index()) {
            Some(&scale) if scale != 1.0 => Some(figures.scaled(scale)),
            _ => Some(figures),
        }
    }
    /// The most any microbatch holds on `stage`: its figures times the largest scale.
    pub fn largest_on(&self, stage: StageId) -> Option<StageMemory> {
        let figures = *self.stages.get(stage.index())?;
        let largest = self
            .microbatch_scales
            .iter()
            .copied()
            .fold(0.0f64, f64::max);
        Some(if self.microbatch_scales.is_empty() {
            figures
        } else {
            figures.scaled(largest)
        })
    }
    fn scale_bits(&self) -> Vec<u64> {
        self.microbatch_scales.iter().map(|s| s.to_bits()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_grad_must_fit_in_total() {
        let err = StageMemorySpec::builder()
            .total(1.0)
            .weight_grad(1.5)
            .build()
            .validate()
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("weight_grad = 1.5 must lie between 0 and total = 1"),
            "{err}"
        );
        let m = StageMemorySpec::builder()
            .total(1.0)
            .weight_grad(0.25)
            .build()
            .validate()
            .unwrap();
        assert_eq!(m.delta(OpKind::InputGrad), -0.75);
        assert_eq!(m.split(2).total(), 0.5);
        assert_eq!((m.checkpoint(), m.dropped()), (0.0, 1.0));
        assert_eq!(m.weight_grad_checkpoint(), 0.0);
        let kept = StageMemorySpec::builder()
            .total(1.0)
            .checkpoint(0.125)
            .build()
            .validate()
            .unwrap();
        assert_eq!(
            (kept.dropped(), kept.split(2).checkpoint()),
            (0.875, 0.0625)
        );
        assert_eq!(kept.weight_grad_checkpoint(), 0.25);
        let err = StageMemorySpec::builder()
            .checkpoint(2.0)
            .build()
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("checkpoint = 2 must lie"), "{err}");
    }

    #[test]
    fn the_experts_part_is_held_until_the_w_and_counted_on_its_own() {
        let spec = |experts| {
            StageMemorySpec::builder()
                .total(1.0)
                .weight_grad(0.5)
                .checkpoint(0.125)
                .experts(experts)
                .build()
                .validate()
        };
        let m = spec(0.25).unwrap();
        let part = m.experts_part();
        assert_eq!((part.total(), part.weight_grad()), (0.25, 0.25));
        assert_eq!((part.checkpoint(), part.dropped()), (0.0, 0.25));
        assert_eq!(part.delta(OpKind::InputGrad), 0.0);
        assert_eq!(
            (m.split(2).experts(), m.scaled(3.0).experts()),
            (0.125, 0.75)
        );
        assert!(MemoryModel::uniform(2, m).has_experts());
        assert!(!MemoryModel::uniform(2, StageMemory::default()).has_experts());
        let err = spec(0.75).unwrap_err();
        assert!(
            err.to_string()
                .contains("experts = 0.75 must lie between 0 and weight_grad = 0.5"),
            "{err}"
        );
    }
}
