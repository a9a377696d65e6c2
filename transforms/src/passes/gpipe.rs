//! `gpipe`: the baseline schedule (GPipe, Huang et al. 2019).
//!
//! Source: GPipe; PyTorch's `ScheduleGPipe`. Every rank runs all its forwards, then all its full
//! backwards (B), each in microbatch order; on a rank that holds several stages, forwards of one
//! microbatch go in route order and backwards in reverse route order.
//!
//! Requires: an unscheduled plan (every order empty), any layout.
//! May change: the orders and the pacing (to fill-drain); placement, costs and memory stay.
//!
//! Before (unscheduled) and after, 2 ranks and 3 microbatches at unit costs:
//! ```text
//! rank 0 | F0 F1 F2 .  .  .  B0 ~  B1 ~  B2 ~
//! rank 1 | .  F0 F1 F2 B0 ~  B1 ~  B2 ~  .  .
//! ```

use super::repaced;
use crate::error::TransformError;
use crate::order::fill_drain;
use crate::pass::{Changes, Contract, Pass, Requires};
use pipeweave_core::{Pacing, Plan};

/// The GPipe baseline pass, `gpipe`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gpipe;

impl Gpipe {
    /// The pass's name: in expressions, the registry and errors.
    pub const NAME: &'static str = "gpipe";
}

impl Pass for Gpipe {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        Contract::new(Requires::paced(&[Pacing::Unscheduled]), Changes::PACING)
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let orders = fill_drain(plan.problem());
        repaced(Self::NAME, plan, orders, Pacing::FillDrain)
    }
}
