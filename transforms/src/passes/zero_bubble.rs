//! `zero_bubble(policy, memory)`: split backwards into I and W and move the Ws into bubbles.
//!
//! Source: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024) and sail-sg's schedules;
//! DeepSeek's DualPipe/DualPipeV for the W handling of dual plans.
//!
//! Policies:
//! - `h1`: ZB-H1, memory as the input schedule (see [`crate::schedules::lagged`]);
//! - `h2`: ZB-H2, about twice 1F1B's activations, near zero bubble;
//! - `auto` (with `memory=N`, or `auto(N)`): cost-model driven. Candidates are the input order,
//!   `h1`, `h2` (non-dual plans), the handcrafted ZB-V (V placement,
//!   [`crate::schedules::zbv`]), DeepSeek's order (dual plans) and the list scheduler of
//!   [`crate::schedules::greedy`] in several variants; each is verified and simulated, those within
//!   the memory limit compete and the shortest longest per-rank span wins (then the makespan, then
//!   the earlier candidate); the winner is then improved by critical-path swaps
//!   ([`crate::schedules::refine`]), which only accept improvements. So `auto` is deterministic and
//!   never worse than any candidate that fits, `h1` and DeepSeek's order included. The limit
//!   defaults to the plan's declared limit, else the input plan's peak (on a dual plan, the larger
//!   of that and DeepSeek's peak).
//! - `deepseek` (dual plans only): DeepSeek's DualPipe/DualPipeV order with its split backwards and
//!   W queue.
//! - default: `deepseek` on dual plans, `auto` elsewhere.
//!
//! Preconditions: the input comes from `f1b`, `vpp` after `f1b`, or `dual`; `h1` and `h2` need a
//! plan of plain forwards and full backwards (not a dual plan); `deepseek` needs a dual plan;
//! `auto` must find a schedule within the limit.
//! May change: the orders only (placement, costs and memory stay).
//!
//! Before (`f1b(gpipe)`) and after (`zero_bubble(f1b(gpipe), policy=h1)`), 4 ranks, 8
//! microbatches, unit costs (the `zero_bubble_grids` snapshot test holds more):
//! ```text
//! rank  0 | F0 F1 F2 F3 .  .  .  .  .  .  B0 ~  F4 B1 ~  F5 B2 ~  F6 B3 ~  F7 B4 ~  .  B5 ~  .  B6 ~  .  B7 ~
//! rank  1 | .  F0 F1 F2 .  .  .  .  B0 ~  F3 B1 ~  F4 B2 ~  F5 B3 ~  F6 B4 ~  F7 B5 ~  .  B6 ~  .  B7 ~  .  .
//! rank  2 | .  .  F0 F1 .  .  B0 ~  F2 B1 ~  F3 B2 ~  F4 B3 ~  F5 B4 ~  F6 B5 ~  F7 B6 ~  .  B7 ~  .  .  .  .
//! rank  3 | .  .  .  F0 B0 ~  F1 B1 ~  F2 B2 ~  F3 B3 ~  F4 B4 ~  F5 B5 ~  F6 B6 ~  F7 B7 ~  .  .  .  .  .  .
//!
//! rank  0 | F0 F1 F2 F3 .  .  .  I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7
//! rank  1 | .  F0 F1 F2 .  .  I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7
//! rank  2 | .  .  F0 F1 .  I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7
//! rank  3 | .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7
//! ```

use crate::error::TransformError;
use crate::passes::dual::dual_shape_of_output;
use crate::schedules::greedy::{self, FillWaits, InFlight, Variant};
use crate::schedules::lagged::{lagged_orders, Hand};
use crate::schedules::refine::{better, refine};
use crate::schedules::zbv::{zbv_orders, Cooldown};
use crate::transform::{Position, Transform};
use pipeweave_core::memory::peak_per_rank;
use pipeweave_core::{simulate, Plan, Task};

/// How `zero_bubble` places weight gradients.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Policy {
    /// `deepseek` on dual plans, `auto` elsewhere.
    Default,
    /// ZB-H1.
    H1,
    /// ZB-H2.
    H2,
    /// Cost-model-driven search within a memory limit (units of a rank's activations).
    Auto {
        /// The per-rank limit; None takes the plan's declared limit or the input's peak.
        memory: Option<f64>,
    },
    /// DeepSeek's DualPipe/DualPipeV order.
    DeepSeek,
}

/// The zero-bubble pass.
#[derive(Clone, Copy, Debug)]
pub struct ZeroBubble {
    policy: Policy,
}

impl ZeroBubble {
    /// Validates the arguments that do not depend on the plan.
    pub fn new(policy: Policy) -> Result<ZeroBubble, TransformError> {
        if let Policy::Auto { memory: Some(m) } = policy {
            if !(m.is_finite() && m > 0.0) {
                return Err(TransformError::precondition(
                    "zero_bubble",
                    "memory > 0",
                    format!("memory = {m}"),
                ));
            }
        }
        Ok(ZeroBubble { policy })
    }

    fn resolved(&self, plan: &Plan) -> Policy {
        match self.policy {
            Policy::Default if dual_shape_of_output(plan).is_some() => Policy::DeepSeek,
            Policy::Default => Policy::Auto { memory: None },
            other => other,
        }
    }
}

fn max_peak(plan: &Plan) -> f64 {
    peak_per_rank(plan)
        .iter()
        .map(|p| p.peak)
        .fold(0.0, f64::max)
}

/// `auto`'s memory limit when none is given: the input plan's peak, or on a dual plan DeepSeek's
/// (so that `auto` can always fall back on DeepSeek's order and never does worse).
fn default_limit(plan: &Plan) -> f64 {
    let input = max_peak(plan);
    match dual_shape_of_output(plan) {
        Some(shape) => {
            let orders = (0..shape.ranks).map(|r| shape.order(r, true)).collect();
            plan.clone()
                .with_orders(orders)
                .map_or(input, |deepseek| input.max(max_peak(&deepseek)))
        }
        None => input,
    }
}

/// A candidate order set scored by (longest per-rank span, makespan).
struct Scored {
    orders: Vec<Vec<Task>>,
    span: f64,
    makespan: f64,
}

/// Simulates a candidate. Candidates come from this crate's generators; a cheap check that every
/// op is there (the op count, with the simulator rejecting repeats and deadlocks) stands in for
/// full verification, which the driver runs on the winner.
fn score(plan: &Plan, orders: Vec<Vec<Task>>, limit: f64) -> Option<Scored> {
    let candidate = plan.clone().with_orders(orders).ok()?;
    let ops: usize = candidate
        .orders()
        .iter()
        .flatten()
        .map(|t| t.ops().len())
        .sum();
    if ops != plan.problem().work_count() * 3 || max_peak(&candidate) > limit + 1e-9 {
        return None;
    }
    let sim = simulate(&candidate).ok()?;
    Some(Scored {
        span: sim.max_span(),
        makespan: sim.makespan(),
        orders: candidate.orders().to_vec(),
    })
}

/// Whether the plan has the V placement (rank `r` holds exactly stages `r` and `2P - 1 - r`, one
/// route through all stages in order).
fn is_v_layout(plan: &Plan) -> bool {
    let problem = plan.problem();
    let p = problem.ranks() as usize;
    problem.stages() as usize == 2 * p
        && problem.routes().len() == 1
        && problem.routes()[0]
            .stages()
            .iter()
            .enumerate()
            .all(|(i, s)| s.index() == i)
        && problem
            .stage_to_rank()
            .iter()
            .enumerate()
            .all(|(s, r)| r.index() == if s < p { s } else { 2 * p - 1 - s })
}

/// Simulated ops the local search may spend in total (its number of candidate evaluations is this
/// divided by the plan's op count, between 8 and 400).
const REFINE_OP_BUDGET: usize = 200_000;

/// The warm-up rules the search tries, the usual winners first (so the bound prunes more).
const IN_FLIGHT: [InFlight; 4] = [
    InFlight::CostAware {
        round_up: true,
        extra: 0,
    },
    InFlight::CostAware {
        round_up: false,
        extra: 0,
    },
    InFlight::Slope(2),
    InFlight::Memory,
];

/// The best of the list scheduler's variants by its own timing (longest per-rank span, then
/// makespan, then the earlier variant). Variants that cannot beat the best so far stop early.
fn best_greedy(plan: &Plan, limit: f64, dual: bool, bound: f64) -> Option<Vec<Vec<Task>>> {
    let multi_stage = plan.chunks_per_rank() != Some(1);
    let mut best: Option<greedy::Schedule> = None;
    for in_flight in IN_FLIGHT {
        for fill in [FillWaits::Always, FillWaits::IfTheyFit] {
            for prefer_input_grad in [true, false] {
                for reserve in [false, true] {
                    if reserve && !multi_stage {
                        continue;
                    }
                    for overlap in [false, true] {
                        if overlap && !dual {
                            continue;
                        }
                        let variant = Variant {
                            prefer_input_grad,
                            fill,
                            reserve,
                            overlap,
                            in_flight,
                        };
                        let bound = best.as_ref().map_or(bound, |b| b.max_span.min(bound));
                        let Some(found) = greedy::schedule_within(plan, limit, variant, bound)
                        else {
                            continue;
                        };
                        let wins = best.as_ref().is_none_or(|b| {
                            better((found.max_span, found.makespan), (b.max_span, b.makespan))
                        });
                        if wins {
                            best = Some(found);
                        }
                    }
                }
            }
        }
    }
    best.map(|b| b.orders)
}

/// The `auto` search.
fn auto_orders(plan: &Plan, limit: f64) -> Result<Vec<Vec<Task>>, TransformError> {
    let dual = dual_shape_of_output(plan);
    let mut candidates: Vec<Vec<Vec<Task>>> = vec![plan.orders().to_vec()];
    match dual {
        Some(shape) => candidates.push((0..shape.ranks).map(|r| shape.order(r, true)).collect()),
        None => {
            for hand in [Hand::H1, Hand::H2] {
                if let Ok(orders) = lagged_orders(plan, hand) {
                    candidates.push(orders);
                }
            }
            if is_v_layout(plan) {
                let (p, m) = (plan.problem().ranks(), plan.problem().microbatches());
                for cooldown in [Cooldown::Eager, Cooldown::Deferred] {
                    candidates.push(zbv_orders(p, m, cooldown));
                }
            }
        }
    }
    let mut best: Option<Scored> = None;
    let consider = |best: &mut Option<Scored>, orders: Vec<Vec<Task>>| {
        let Some(scored) = score(plan, orders, limit) else {
            return;
        };
        let wins = best
            .as_ref()
            .is_none_or(|b| better((scored.span, scored.makespan), (b.span, b.makespan)));
        if wins {
            *best = Some(scored);
        }
    };
    for orders in candidates {
        consider(&mut best, orders);
    }
    // The list scheduler only has to beat the handcrafted candidates.
    let bound = best.as_ref().map_or(f64::INFINITY, |b| b.span);
    if let Some(orders) = best_greedy(plan, limit, dual.is_some(), bound) {
        consider(&mut best, orders);
    }
    let ops = plan.problem().work_count() * 3;
    let budget = (REFINE_OP_BUDGET / ops.max(1)).clamp(8, 400);
    best.map(|b| refine(plan, b.orders, limit, budget))
        .ok_or_else(|| {
            TransformError::precondition(
                "zero_bubble",
                "auto finds a schedule within the memory limit",
                format!(
                    "no candidate fits in {limit} activations per rank (the input needs {})",
                    max_peak(plan)
                ),
            )
        })
}

impl Transform for ZeroBubble {
    fn name(&self) -> &'static str {
        "zero_bubble"
    }

    fn position(&self) -> Position {
        Position::ZeroBubble
    }

    fn describe(&self) -> String {
        match self.policy {
            Policy::Default => "zero_bubble".to_string(),
            Policy::H1 => "zero_bubble(policy=h1)".to_string(),
            Policy::H2 => "zero_bubble(policy=h2)".to_string(),
            Policy::DeepSeek => "zero_bubble(policy=deepseek)".to_string(),
            Policy::Auto { memory: Some(m) } => format!("zero_bubble(policy=auto, memory={m})"),
            Policy::Auto { memory: None } => "zero_bubble(policy=auto)".to_string(),
        }
    }

    fn check(&self, plan: &Plan) -> Result<(), TransformError> {
        if !plan.passes().iter().any(|n| n == "f1b") {
            return Err(TransformError::precondition(
                "zero_bubble",
                "input comes from f1b, vpp after f1b, or dual",
                format!("the plan came from passes [{}]", plan.passes().join(", ")),
            ));
        }
        let dual = dual_shape_of_output(plan).is_some();
        match self.resolved(plan) {
            Policy::H1 | Policy::H2 if dual => Err(TransformError::precondition(
                "zero_bubble",
                "policies h1 and h2 need plain forwards and full backwards (not a dual plan)",
                "the input is a dual plan; use the default (deepseek) or auto".to_string(),
            )),
            Policy::DeepSeek if !dual => Err(TransformError::precondition(
                "zero_bubble",
                "policy deepseek needs a dual plan",
                format!("the plan came from passes [{}]", plan.passes().join(", ")),
            )),
            _ => Ok(()),
        }
    }

    fn apply(&self, plan: Plan) -> Result<Plan, TransformError> {
        let orders = match self.resolved(&plan) {
            Policy::H1 | Policy::H2 => {
                let hand = if self.resolved(&plan) == Policy::H1 {
                    Hand::H1
                } else {
                    Hand::H2
                };
                lagged_orders(&plan, hand).map_err(|e| {
                    TransformError::precondition(
                        "zero_bubble",
                        "plain forwards and full backwards",
                        format!("rank {} runs {}", e.rank, e.task),
                    )
                })?
            }
            Policy::DeepSeek => {
                let shape = dual_shape_of_output(&plan).expect("check() accepted a dual plan");
                (0..shape.ranks).map(|r| shape.order(r, true)).collect()
            }
            policy @ (Policy::Auto { .. } | Policy::Default) => {
                let memory = match policy {
                    Policy::Auto { memory } => memory,
                    _ => None,
                };
                let limit = memory
                    .or(plan.memory_limit())
                    .unwrap_or_else(|| default_limit(&plan));
                let orders = auto_orders(&plan, limit)?;
                // The limit becomes the plan's declared bound, which the driver verifies.
                let declared = plan.memory_limit().map_or(limit, |l| l.min(limit));
                return plan
                    .with_orders(orders)
                    .and_then(|p| p.with_memory_limit(Some(declared)))
                    .map_err(|e| TransformError::core("zero_bubble", e));
            }
        };
        plan.with_orders(orders)
            .map_err(|e| TransformError::core("zero_bubble", e))
    }
}
