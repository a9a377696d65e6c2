//! `zero_bubble(policy, memory)`: split backwards into I and W and move the Ws into bubbles.
//!
//! Source: Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024) and sail-sg's schedules;
//! DeepSeek's DualPipe/DualPipeV for the W handling of dual plans.
//!
//! Policies:
//! - `h1`: ZB-H1, memory as the input schedule (see [`crate::schedules::lagged`]);
//! - `h2`: ZB-H2, about twice 1F1B's activations, near zero bubble;
//! - `auto` (with `memory=N`, or `auto(N)`): cost-model driven. Candidates are the input order,
//!   the input with each backward split in place (its W right after its I), `h1`, `h2` (non-dual
//!   plans), the handcrafted ZB-V and sail-sg's ZB-V search (V placement,
//!   [`crate::schedules::zbv`], [`crate::schedules::zbv_auto`]), DeepSeek's order (dual plans)
//!   and the list scheduler of [`crate::schedules::greedy`] in several variants; each is verified
//!   and simulated, those within the memory limit compete and the shortest longest per-rank span
//!   wins (then the makespan, then the earlier candidate); the winner is then improved by
//!   critical-path swaps ([`crate::schedules::refine`]), which only accept improvements. So `auto`
//!   is deterministic and never worse than any candidate that fits, `h1`, DeepSeek's order and
//!   the ZB-V search's runs included. The limit defaults to the plan's declared limit, else the
//!   input plan's peak (on a dual plan, the larger of that and DeepSeek's peak). A limit the user
//!   gives (`memory=N`, or a declared limit) is searched across the ladder below it
//!   ([`crate::schedules::ladder`]): the search runs at `N` and at every multiple of half a
//!   microbatch below, and the fastest (by makespan) of every candidate those searches simulated
//!   (their results and the handcrafted schedules that fit) wins: the makespan never increases as
//!   `N` grows, and no handcrafted schedule that fits `N` is faster.
//! - `optimal` (with `memory=N` as `auto`, `budget=S` seconds, default 10, and optionally
//!   `nodes=K`, a deterministic budget of search nodes, whichever ends first): `auto`'s result,
//!   then the exact search of [`crate::schedules::exact`] for a faster schedule within the limit
//!   until the budget runs out. The plan carries the search's proven lower bound
//!   ([`Plan::with_proven_bound`]): run to the end, the schedule is optimal among those that run
//!   each F, I and W once within the limit. Not on dual plans (their fused F&B tasks are outside
//!   the search); on problems above [`crate::schedules::exact::MAX_SEARCH_OPS`] ops, `auto`'s
//!   result with the search's root bound.
//! - `deepseek` (dual plans only): DeepSeek's DualPipe/DualPipeV order with its split backwards and
//!   W queue.
//! - `in_place`: each backward split where it stands, its W right after its I: no W moves into a
//!   bubble, but the gradient leaves for the previous stage after the I. PipeOffload's group
//!   building block runs its ops so (`zero_bubble(vpp(f1b(gpipe), chunks=C, order=block),
//!   policy=in_place)` is their order op for op), and nothing is held for a late W.
//! - `v_half` / `v_min` (the V placement only): sail-sg's controllable-memory V schedules, about
//!   half and a third of 1F1B's activations, op for op as their generator orders them
//!   ([`crate::schedules::controllable`]). `auto` tries both among its candidates.
//! - default: `deepseek` on dual plans, `auto` elsewhere.
//!
//! Requires: one-forward-one-backward pacing (`f1b`, `vpp` after `f1b`, or `dual`) with whole
//! backwards, any layout. Preconditions: `h1` and `h2` need a plan of plain forwards and full
//! backwards (not a dual plan); `deepseek` needs a dual plan; `v_half` and `v_min` the V
//! placement; `auto` must find a schedule within the limit.
//! May change: the orders, the backwards (to split) and, with `auto`, the declared memory limit
//! (placement, costs and memory stay).
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
use crate::pass::{Changes, Contract, Pass, Requires};
use crate::schedules::auto::{auto_orders, auto_search};
use crate::schedules::cache::SearchCache;
use crate::schedules::controllable::Controllable;
use crate::schedules::dualpipe::DualShape;
use crate::schedules::exact::{improve, Budget};
use crate::schedules::ladder::fastest_within;
use crate::schedules::lagged::{lagged_orders, split_in_place, Hand};
use crate::schedules::memo::RungMemo;
use pipeweave_core::{max_peak, Backwards, Facts, Pacing, Plan, Task};
use std::time::Duration;

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
    /// `auto`'s result improved by the exact search within a time budget.
    Optimal {
        /// The per-rank limit, as `auto`'s.
        memory: Option<f64>,
        /// The search's time budget in seconds.
        budget: f64,
        /// Its node budget, if any (deterministic).
        nodes: Option<u64>,
    },
    /// Each backward split where it stands, its W right after its I.
    InPlace,
    /// DeepSeek's DualPipe/DualPipeV order.
    DeepSeek,
    /// sail-sg's V-Half or V-Min (V placement).
    Controllable(Controllable),
}

/// The zero-bubble pass, `zero_bubble`.
#[derive(Clone, Debug)]
pub struct ZeroBubble {
    policy: Policy,
    /// What its searches remember, shared with the other passes of its registry.
    cache: SearchCache,
}

impl ZeroBubble {
    /// The pass's name: in expressions, the registry and errors.
    pub const NAME: &'static str = "zero_bubble";

    /// `policy=optimal`'s time budget when none is given, in seconds.
    pub const DEFAULT_BUDGET: f64 = 10.0;

    /// Validates the arguments that do not depend on the plan.
    pub fn new(policy: Policy) -> Result<ZeroBubble, TransformError> {
        let memory = match policy {
            Policy::Auto { memory } | Policy::Optimal { memory, .. } => memory,
            _ => None,
        };
        if let Some(m) = memory {
            if !(m.is_finite() && m > 0.0) {
                return Err(TransformError::precondition(
                    Self::NAME,
                    "memory > 0",
                    format!("memory = {m}"),
                ));
            }
        }
        if let Policy::Optimal { budget, nodes, .. } = policy {
            if nodes == Some(0) {
                return Err(TransformError::precondition(
                    Self::NAME,
                    "nodes >= 1",
                    "nodes = 0".to_string(),
                ));
            }
            if !(budget.is_finite() && budget > 0.0 && budget <= MAX_BUDGET) {
                return Err(TransformError::precondition(
                    Self::NAME,
                    "0 < budget <= 86400 seconds",
                    format!("budget = {budget}"),
                ));
            }
        }
        Ok(ZeroBubble {
            policy,
            cache: SearchCache::new(),
        })
    }

    /// The same pass, its searches remembered in `cache` (shared with whoever holds a clone).
    pub fn with_cache(mut self, cache: SearchCache) -> ZeroBubble {
        self.cache = cache;
        self
    }
}

/// The longest time budget `policy=optimal` takes: a day.
const MAX_BUDGET: f64 = 86_400.0;

/// `auto`'s memory limit when none is given: the input plan's peak, or on a dual plan (of shape
/// `dual`) DeepSeek's (so that `auto` can always fall back on DeepSeek's order and never does
/// worse).
fn default_limit(plan: &Plan, dual: Option<DualShape>) -> f64 {
    let input = max_peak(plan);
    match dual {
        Some(shape) => {
            let split = Facts {
                backwards: Backwards::Split,
                ..plan.facts()
            };
            plan.clone()
                .with_facts(split)
                .and_then(|p| p.with_orders(shape.orders(plan, true)))
                .map_or(input, |deepseek| input.max(max_peak(&deepseek)))
        }
        None => input,
    }
}

/// What [`ZeroBubble::prepare`] decided for the plan.
enum Prepared {
    /// The orders of `h1`, `h2`, `v_half` or `v_min` (they read only the input's orders and
    /// sizes).
    Orders(Vec<Vec<Task>>),
    /// DeepSeek's order on the dual plan of this shape.
    DeepSeek(DualShape),
    /// The `auto` search within `limit` on a dual plan of shape `dual` or (None) any other;
    /// across the ladder below the limit when it is the user's.
    Auto {
        dual: Option<DualShape>,
        limit: f64,
        ladder: bool,
    },
    /// `auto` as above (not on a dual plan), then the exact search for `budget`.
    Optimal {
        limit: f64,
        ladder: bool,
        budget: Budget,
    },
}

impl Pass for ZeroBubble {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn contract(&self) -> Contract {
        Contract::new(
            Requires::paced(&[Pacing::OneForwardOneBackward]).with_whole_backwards(),
            Changes::BACKWARDS.and(Changes::MEMORY_LIMIT),
        )
    }

    fn describe(&self) -> String {
        match self.policy {
            Policy::Default => "zero_bubble".to_string(),
            Policy::H1 => "zero_bubble(policy=h1)".to_string(),
            Policy::H2 => "zero_bubble(policy=h2)".to_string(),
            Policy::DeepSeek => "zero_bubble(policy=deepseek)".to_string(),
            Policy::InPlace => "zero_bubble(policy=in_place)".to_string(),
            Policy::Auto { memory: Some(m) } => format!("zero_bubble(policy=auto, memory={m})"),
            Policy::Auto { memory: None } => "zero_bubble(policy=auto)".to_string(),
            Policy::Optimal {
                memory,
                budget,
                nodes,
            } => {
                let memory = memory.map_or(String::new(), |m| format!(", memory={m}"));
                let nodes = nodes.map_or(String::new(), |n| format!(", nodes={n}"));
                format!("zero_bubble(policy=optimal{memory}, budget={budget}{nodes})")
            }
            Policy::Controllable(Controllable::Half) => "zero_bubble(policy=v_half)".to_string(),
            Policy::Controllable(Controllable::Min) => "zero_bubble(policy=v_min)".to_string(),
        }
    }

    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let prepared = self.prepare(&plan)?;
        self.apply(plan, prepared)
    }
}

/// The two steps of [`ZeroBubble`]'s rewrite: the checks and what the rewrite needs, then the
/// rewrite.
impl ZeroBubble {
    fn prepare(&self, plan: &Plan) -> Result<Prepared, TransformError> {
        let dual = DualShape::of_plan(plan);
        let auto = |memory: Option<f64>| {
            let given = memory.or(plan.memory_limit());
            Prepared::Auto {
                dual,
                limit: given.unwrap_or_else(|| default_limit(plan, dual)),
                ladder: given.is_some(),
            }
        };
        match (self.policy, dual) {
            (Policy::Default | Policy::DeepSeek, Some(shape)) => Ok(Prepared::DeepSeek(shape)),
            (Policy::Default, None) => Ok(auto(None)),
            (Policy::Auto { memory }, _) => Ok(auto(memory)),
            (Policy::Optimal { .. }, Some(_)) => Err(TransformError::unmet(
                "policy optimal needs a plan without fused F&B tasks (not a dual plan)",
                "the input is a dual plan; use the default (deepseek) or auto".to_string(),
            )),
            (
                Policy::Optimal {
                    memory,
                    budget,
                    nodes,
                },
                None,
            ) => match auto(memory) {
                Prepared::Auto { limit, ladder, .. } => Ok(Prepared::Optimal {
                    limit,
                    ladder,
                    budget: Budget {
                        time: Some(Duration::from_secs_f64(budget)),
                        nodes,
                    },
                }),
                other => Ok(other),
            },
            (Policy::DeepSeek, None) => Err(TransformError::unmet(
                "policy deepseek needs a dual plan",
                format!("the plan has the {} layout", plan.facts().layout),
            )),
            (Policy::H1 | Policy::H2, Some(_)) => Err(TransformError::unmet(
                "policies h1 and h2 need plain forwards and full backwards (not a dual plan)",
                "the input is a dual plan; use the default (deepseek) or auto".to_string(),
            )),
            (Policy::H1 | Policy::H2, None) => {
                let hand = if self.policy == Policy::H1 {
                    Hand::H1
                } else {
                    Hand::H2
                };
                let orders = lagged_orders(plan, hand).map_err(|e| {
                    TransformError::unmet(
                        "plain forwards and full backwards in a warm-up / steady / cool-down \
                         order (no input gradient moved ahead of its forward)",
                        format!("on rank {}, {} {}", e.rank, e.task, e.why),
                    )
                })?;
                Ok(Prepared::Orders(orders))
            }
            (Policy::InPlace, _) => Ok(Prepared::Orders(split_in_place(plan.orders()))),
            (Policy::Controllable(kind), _) => {
                let p = plan.problem().ranks();
                if dual.is_some() || !plan.facts().layout.is_v_shaped(p) {
                    return Err(TransformError::unmet(
                        "policies v_half and v_min need the V placement \
                         (vpp(..., chunks=2, layout=v))",
                        format!("the plan has the {} layout", plan.facts().layout),
                    ));
                }
                let m = plan.problem().microbatches();
                let orders = self.cache.controllable(kind, p, m).ok_or_else(|| {
                    TransformError::unmet(
                        "sail-sg's V-Half/V-Min generator runs at these sizes",
                        format!(
                            "it does not at {p} ranks and {m} microbatches; use policy=auto \
                             with a memory limit"
                        ),
                    )
                })?;
                Ok(Prepared::Orders(orders))
            }
        }
    }

    fn apply(&self, plan: Plan, prepared: Prepared) -> Result<Plan, TransformError> {
        let split = Facts {
            backwards: Backwards::Split,
            ..plan.facts()
        };
        let plan = plan
            .with_facts(split)
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        let mut proven = None;
        let (orders, declared) = match prepared {
            Prepared::Orders(orders) => (orders, plan.memory_limit()),
            Prepared::DeepSeek(shape) => (shape.orders(&plan, true), plan.memory_limit()),
            Prepared::Auto {
                dual,
                limit,
                ladder,
            } => {
                let orders = if ladder {
                    // Every rung searches this plan: they share one memo.
                    let memo = RungMemo::new();
                    fastest_within(&plan, limit, &self.cache, |p, r| {
                        auto_search(p, dual, r, &self.cache, Some(&memo)).fitted
                    })
                    .map_or_else(|| auto_orders(&plan, dual, limit, &self.cache), Ok)?
                } else {
                    auto_orders(&plan, dual, limit, &self.cache)?
                };
                // The limit becomes the plan's declared bound, which the driver verifies.
                let declared = plan.memory_limit().map_or(limit, |l| l.min(limit));
                (orders, Some(declared))
            }
            Prepared::Optimal {
                limit,
                ladder,
                budget,
            } => {
                let incumbent = self.apply(
                    plan.clone(),
                    Prepared::Auto {
                        dual: None,
                        limit,
                        ladder,
                    },
                )?;
                let declared = incumbent.memory_limit();
                let (orders, bound) = improve(&plan, incumbent.orders().to_vec(), limit, budget);
                proven = bound;
                (orders, declared)
            }
        };
        let plan = plan
            .with_orders(orders)
            .and_then(|p| p.with_memory_limit(declared))
            .map_err(|e| TransformError::core(Self::NAME, e))?;
        Ok(match proven {
            Some(bound) => plan.with_proven_bound(bound),
            None => plan,
        })
    }
}
