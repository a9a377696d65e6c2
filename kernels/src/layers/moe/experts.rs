//! Phase 3 of a [`super::Moe`]: the experts. [`ExpertRows`] are the rows one expert receives
//! (or sends back: its outputs, their gradients); an [`ExpertBank`] is a run of consecutive
//! experts (all of them, or the ones an [`crate::ExpertShard`] holds), each an [`Mlp`], and runs
//! each expert on its own rows: an expert's products see the same rows on any shard.

use std::ops::Range;

use candle_core::{DType, Tensor};

use crate::error::{KernelError, Result};
use crate::layers::mlp::{Mlp, MlpPendingWeightGrad, MlpSaved};
use crate::layers::protocol::{held_tensors, joined, Layer, NamedParameters, ParameterSlots};
use crate::primitives::Primitives;

const LAYER: &str = "ExpertBank";

/// The rows `[n, d]` of one expert: the tokens it receives (in the routing's order for it,
/// tokens ascending), its outputs for them, or their gradients.
#[derive(Debug, Clone)]
pub struct ExpertRows {
    expert: usize,
    rows: Tensor,
}

impl ExpertRows {
    /// `rows` (`[n, d]`) of expert `expert` (its index among all the experts).
    pub fn new(expert: usize, rows: Tensor) -> Self {
        ExpertRows { expert, rows }
    }

    /// The expert's index among all the experts.
    pub fn expert(&self) -> usize {
        self.expert
    }

    /// The rows, `[n, d]`.
    pub fn rows(&self) -> &Tensor {
        &self.rows
    }

    /// The rows, taken.
    pub fn into_rows(self) -> Tensor {
        self.rows
    }
}

/// Consecutive experts `first..first + len`, each an [`Mlp`] `d -> h -> d`.
///
/// Parameters, in order: for each expert `e`, `{e}.c_fc.weight`, `{e}.c_fc.bias`,
/// `{e}.c_proj.weight`, `{e}.c_proj.bias` (`e` the expert's global index).
#[derive(Debug, Clone)]
pub struct ExpertBank {
    first: usize,
    mlps: Vec<Mlp>,
}

/// One expert's forward state.
#[derive(Debug)]
struct ExpertSaved {
    expert: usize,
    mlp: MlpSaved,
}

/// One expert's pending weight gradient.
#[derive(Debug)]
struct ExpertPending {
    expert: usize,
    mlp: MlpPendingWeightGrad,
}

/// What [`ExpertBank::forward`] keeps: each expert's state, in the order of its rows.
#[derive(Debug)]
pub struct ExpertsSaved {
    experts: Vec<ExpertSaved>,
}

/// What [`ExpertBank::backward_weight`] needs: each expert's pending state (none for an expert
/// that received no rows).
#[derive(Debug)]
pub struct ExpertsPending {
    experts: Vec<ExpertPending>,
}

impl ExpertBank {
    /// Experts `first..first + mlps.len()` (at least one), of one width, hidden width and dtype.
    pub fn new(first: usize, mlps: Vec<Mlp>) -> Result<Self> {
        let Some(head) = mlps.first() else {
            return Err(KernelError::InvalidArgument {
                field: "experts",
                value: "0".into(),
                reason: "a bank holds at least one expert",
            });
        };
        let shape = (head.width(), head.hidden(), head.dtype());
        if let Some(i) = mlps
            .iter()
            .position(|m| (m.width(), m.hidden(), m.dtype()) != shape)
        {
            let other = &mlps[i];
            return Err(KernelError::ExpertRowsMismatch {
                phase: "new",
                problem: format!(
                    "expert {} is {}x{} {:?}, expert {first} {}x{} {:?}",
                    first + i,
                    other.width(),
                    other.hidden(),
                    other.dtype(),
                    shape.0,
                    shape.1,
                    shape.2
                ),
            });
        }
        Ok(ExpertBank { first, mlps })
    }

    /// The experts held, by global index.
    pub fn held(&self) -> Range<usize> {
        self.first..self.first + self.mlps.len()
    }

    /// The model width `d`.
    pub fn width(&self) -> usize {
        self.mlps[0].width()
    }

    /// The experts' hidden width `h`.
    pub fn hidden(&self) -> usize {
        self.mlps[0].hidden()
    }

    /// The element type of the parameters.
    pub fn dtype(&self) -> DType {
        self.mlps[0].dtype()
    }

    /// The experts `experts` of this bank, as a bank of their own (parameters shared).
    pub(super) fn part(&self, experts: Range<usize>) -> Result<Self> {
        let held = self.held();
        if experts.is_empty() || experts.start < held.start || experts.end > held.end {
            return Err(KernelError::ExpertRowsMismatch {
                phase: "shard_bank",
                problem: format!("experts {experts:?} outside the bank's {held:?}"),
            });
        }
        let local = experts.start - self.first..experts.end - self.first;
        ExpertBank::new(experts.start, self.mlps[local].to_vec())
    }

    /// Expert `expert`'s MLP, if held.
    fn mlp(&self, expert: usize, phase: &'static str) -> Result<&Mlp> {
        let held = self.held();
        match held.contains(&expert) {
            true => Ok(&self.mlps[expert - self.first]),
            false => Err(KernelError::ExpertRowsMismatch {
                phase,
                problem: format!("rows for expert {expert}, outside the bank's {held:?}"),
            }),
        }
    }

    /// Runs each expert on its rows (each `[n, d]`, an expert at most once, in any order); the
    /// outputs come in the same order.
    pub fn forward(
        &self,
        ops: &dyn Primitives,
        inputs: &[ExpertRows],
    ) -> Result<(Vec<ExpertRows>, ExpertsSaved)> {
        check_distinct(inputs, "experts")?;
        let mut outputs = Vec::with_capacity(inputs.len());
        let mut saved = Vec::with_capacity(inputs.len());
        for input in inputs {
            let mlp = self.mlp(input.expert, "experts")?;
            crate::check::named(LAYER, "rows", &input.rows).rank_is(2, "[n, d]")?;
            let (output, mlp) = mlp.forward(ops, &input.rows)?;
            outputs.push(ExpertRows::new(input.expert, output));
            saved.push(ExpertSaved {
                expert: input.expert,
                mlp,
            });
        }
        Ok((outputs, ExpertsSaved { experts: saved }))
    }

    /// The input backward of [`ExpertBank::forward`]: `grads` are the gradients of its outputs
    /// (one per expert it ran, in any order); the input gradients come in the forward's order.
    pub fn backward_input(
        &self,
        ops: &dyn Primitives,
        saved: ExpertsSaved,
        grads: &[ExpertRows],
    ) -> Result<(Vec<ExpertRows>, ExpertsPending)> {
        check_distinct(grads, "experts_backward")?;
        if grads.len() != saved.experts.len() {
            return Err(KernelError::ExpertRowsMismatch {
                phase: "experts_backward",
                problem: format!(
                    "gradients for {} experts, the forward ran {}",
                    grads.len(),
                    saved.experts.len()
                ),
            });
        }
        let mut grad_inputs = Vec::with_capacity(grads.len());
        let mut pending = Vec::with_capacity(grads.len());
        for state in saved.experts {
            let expert = state.expert;
            let Some(grad) = grads.iter().find(|g| g.expert == expert) else {
                return Err(KernelError::ExpertRowsMismatch {
                    phase: "experts_backward",
                    problem: format!("no gradient for expert {expert}, which the forward ran"),
                });
            };
            let mlp = self.mlp(expert, "experts_backward")?;
            let (grad_input, mlp_pending) = mlp.backward_input(ops, state.mlp, &grad.rows)?;
            grad_inputs.push(ExpertRows::new(expert, grad_input));
            pending.push(ExpertPending {
                expert,
                mlp: mlp_pending,
            });
        }
        Ok((grad_inputs, ExpertsPending { experts: pending }))
    }

    /// The weight gradients of every held expert, in parameter order: zeros for an expert that
    /// received no rows.
    pub fn backward_weight(
        &self,
        ops: &dyn Primitives,
        pending: ExpertsPending,
    ) -> Result<Vec<Tensor>> {
        let mut by_expert: Vec<Option<MlpPendingWeightGrad>> =
            self.mlps.iter().map(|_| None).collect();
        for state in pending.experts {
            let held = self.held();
            let Some(slot) = by_expert.get_mut(state.expert.wrapping_sub(self.first)) else {
                return Err(KernelError::ExpertRowsMismatch {
                    phase: "experts_backward_weight",
                    problem: format!(
                        "a state of expert {}, outside the bank's {held:?}",
                        state.expert
                    ),
                });
            };
            *slot = Some(state.mlp);
        }
        let mut grads = Vec::with_capacity(4 * self.mlps.len());
        for (mlp, state) in self.mlps.iter().zip(by_expert) {
            match state {
                Some(state) => grads.extend(mlp.backward_weight(ops, state)?),
                None => {
                    for (_, parameter) in mlp.parameters() {
                        let zeros = vec![0.0; parameter.elem_count()];
                        grads.push(ops.float_tensor(&zeros, parameter.dims(), self.dtype())?);
                    }
                }
            }
        }
        Ok(grads)
    }
}

/// Fails if two of `rows` name the same expert.
fn check_distinct(rows: &[ExpertRows], phase: &'static str) -> Result<()> {
    for (i, part) in rows.iter().enumerate() {
        if rows[..i].iter().any(|other| other.expert == part.expert) {
            return Err(KernelError::ExpertRowsMismatch {
                phase,
                problem: format!("expert {} appears twice", part.expert),
            });
        }
    }
    Ok(())
}

impl NamedParameters for ExpertBank {
    fn push_parameters(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        for (expert, mlp) in self.held().zip(&self.mlps) {
            mlp.push_parameters(&joined(prefix, &expert.to_string()), out);
        }
    }
}

impl ParameterSlots for ExpertBank {
    fn push_slots<'a>(&'a mut self, out: &mut Vec<&'a mut Tensor>) {
        self.mlps.push_slots(out);
    }
}

held_tensors!(mut ExpertRows { rows });
held_tensors!(mut ExpertSaved { mlp });
held_tensors!(mut ExpertPending { mlp });
held_tensors!(mut ExpertsSaved { experts });
held_tensors!(mut ExpertsPending { experts });
