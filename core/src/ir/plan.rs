//! The global plan: a problem, its cost and memory models, and every rank's order of tasks.
//!
//! A plan is structurally consistent by construction (one order per rank, one cost and memory entry
//! per stage, a valid memory limit, [`Facts`] that match its problem and orders); whether its
//! orders form a correct schedule is the verifier's job ([`crate::analysis::verify`]). Plans are
//! values: passes take one and return a new one.
//!
//! The pass history ([`Plan::passes`]) is a record for reports; what a plan *is* lives in its
//! [`Facts`], which passes read and declare.

use crate::error::CoreError;
use crate::ir::cost::{CostModel, StageCosts};
use crate::ir::facts::{Backwards, Facts, Layout, Pacing, Residency};
use crate::ir::ids::RankId;
use crate::ir::memory::{invalid as invalid_memory, MemoryModel, StageMemory};
use crate::ir::op::{Op, Task};
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;

/// What a plan drops of one (stage, microbatch) pair for a recompute
/// ([`Plan::recomputed_pairs`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Its forward's activations, right after the forward (until its `R`).
    pub after_forward: bool,
    /// What its W keeps, right after its input-gradient backward (until its `RW`).
    pub after_input_grad: bool,
}

/// A global pipeline plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    problem: Problem,
    costs: CostModel,
    memory: MemoryModel,
    memory_limit: Option<f64>,
    orders: Vec<Vec<Task>>,
    passes: Vec<String>,
    facts: Facts,
    /// A lower bound on every schedule of this problem within its memory limit that a search
    /// proved ([`Plan::proven_bound`]).
    proven_bound: Option<f64>,
}

impl Plan {
    /// A plan with empty orders: the input of the baseline pass. Its facts: the problem's own
    /// layout ([`Layout::of_problem`]), unscheduled, whole backwards.
    pub fn unscheduled(
        problem: Problem,
        costs: CostModel,
        memory: MemoryModel,
    ) -> Result<Plan, CoreError> {
        let ranks = problem.ranks() as usize;
        Plan::new(problem, costs, memory, vec![Vec::new(); ranks])
    }

    /// A plan with the given orders (one per rank), e.g. an imported schedule; checks the models
    /// match the problem. Its facts are what can be read off: the problem's own layout, custom
    /// pacing (unscheduled when every order is empty), and whether any backward is split.
    pub fn new(
        problem: Problem,
        costs: CostModel,
        memory: MemoryModel,
        orders: Vec<Vec<Task>>,
    ) -> Result<Plan, CoreError> {
        let facts = Facts {
            layout: Layout::of_problem(&problem),
            pacing: if orders.iter().all(Vec::is_empty) {
                Pacing::Unscheduled
            } else {
                Pacing::Custom
            },
            backwards: Backwards::of_orders(&orders),
            residency: Residency::of_orders(&orders),
        };
        Plan::assemble(problem, costs, memory, orders, facts)
    }

    fn assemble(
        problem: Problem,
        costs: CostModel,
        memory: MemoryModel,
        orders: Vec<Vec<Task>>,
        facts: Facts,
    ) -> Result<Plan, CoreError> {
        let stages = problem.stages() as usize;
        if costs.stages().len() != stages {
            return Err(CoreError::StageCountMismatch {
                model: "cost model",
                got: costs.stages().len(),
                expected: stages,
            });
        }
        if memory.stages().len() != stages {
            return Err(CoreError::StageCountMismatch {
                model: "memory model",
                got: memory.stages().len(),
                expected: stages,
            });
        }
        if orders.len() != problem.ranks() as usize {
            return Err(CoreError::RankCountMismatch {
                got: orders.len(),
                expected: problem.ranks() as usize,
            });
        }
        check_facts(&facts, &problem, &orders)?;
        Ok(Plan {
            problem,
            costs,
            memory,
            memory_limit: None,
            proven_bound: None,
            orders,
            passes: Vec::new(),
            facts,
        })
    }

    /// A plan whose per-stage costs and activation memory come from one rank's whole share:
    /// every stage gets the share divided by the number of distinct model chunks its rank holds
    /// (so a rank holding two chunks runs each in half the time). A replica of another stage
    /// (a later member of a tied group, as DualPipe's mirrors) is a copy of a chunk, not another
    /// chunk: it does not split the share. Memory is the default (everything held until W).
    pub fn from_rank_shares(
        problem: Problem,
        share: StageCosts,
        comm: f64,
        orders: Vec<Vec<Task>>,
    ) -> Result<Plan, CoreError> {
        let mut replica = vec![false; problem.stages() as usize];
        for group in problem.tied_stages() {
            for stage in group.iter().skip(1) {
                replica[stage.index()] = true;
            }
        }
        let mut chunks = vec![0u32; problem.ranks() as usize];
        for (s, r) in problem.stage_to_rank().iter().enumerate() {
            if !replica[s] {
                chunks[r.index()] += 1;
            }
        }
        let per_stage = |r: &RankId| chunks[r.index()];
        let costs = problem
            .stage_to_rank()
            .iter()
            .map(|r| share.split(per_stage(r)))
            .collect();
        let memory = problem
            .stage_to_rank()
            .iter()
            .map(|r| StageMemory::default().split(per_stage(r)))
            .collect();
        Plan::new(
            problem,
            CostModel::per_stage(costs, comm)?,
            MemoryModel::per_stage(memory),
            orders,
        )
    }

    /// The same plan with a per-rank activation-memory bound (units of one microbatch of a rank's
    /// share) that the verifier enforces.
    pub fn with_memory_limit(mut self, limit: Option<f64>) -> Result<Plan, CoreError> {
        if let Some(l) = limit {
            if !(l.is_finite() && l > 0.0) {
                return Err(invalid_memory(format!(
                    "the memory limit {l} must be finite and > 0"
                )));
            }
        }
        // A proven bound holds under a tighter limit, not a looser one.
        let tighter = match (limit, self.memory_limit) {
            (_, None) => true,
            (Some(new), Some(old)) => new <= old,
            (None, Some(_)) => false,
        };
        if !tighter {
            self.proven_bound = None;
        }
        self.memory_limit = limit;
        Ok(self)
    }

    /// The same problem, models and facts with new orders (one per rank).
    pub fn with_orders(self, orders: Vec<Vec<Task>>) -> Result<Plan, CoreError> {
        let facts = self.facts;
        self.reshaped(None, orders, facts)
    }

    /// The same plan declaring other facts (checked against the problem and the orders).
    pub fn with_facts(mut self, facts: Facts) -> Result<Plan, CoreError> {
        check_facts(&facts, &self.problem, &self.orders)?;
        if facts != self.facts {
            self.proven_bound = None;
        }
        self.facts = facts;
        Ok(self)
    }

    /// New orders and facts and, optionally, a new problem with its models (a pass that changes
    /// placement); the memory limit and pass history carry over.
    pub fn reshaped(
        self,
        shape: Option<(Problem, CostModel, MemoryModel)>,
        orders: Vec<Vec<Task>>,
        facts: Facts,
    ) -> Result<Plan, CoreError> {
        // Only new orders of the same problem and facts keep a proven bound.
        let keeps_bound = shape.is_none() && facts == self.facts;
        let (problem, costs, memory) = shape.unwrap_or((self.problem, self.costs, self.memory));
        let mut plan = Plan::assemble(problem, costs, memory, orders, facts)?;
        plan.memory_limit = self.memory_limit;
        plan.passes = self.passes;
        plan.proven_bound = self.proven_bound.filter(|_| keeps_bound);
        Ok(plan)
    }

    /// The same plan with `bound` proven (by a search over every schedule of its problem that
    /// runs each F, I and W once within its memory limit) to be a lower bound on their
    /// makespans. It is dropped by any change but new orders (a new problem, other facts, a
    /// looser limit), and reports take the larger of it and
    /// [`crate::analysis::bound::lower_bound`].
    pub fn with_proven_bound(mut self, bound: f64) -> Plan {
        self.proven_bound = (bound.is_finite() && bound > 0.0).then_some(bound);
        self
    }

    /// The proven lower bound a search left on this plan ([`Plan::with_proven_bound`]).
    pub fn proven_bound(&self) -> Option<f64> {
        self.proven_bound
    }

    /// Records that a pass produced this plan.
    pub fn record_pass(mut self, name: &str) -> Plan {
        self.passes.push(name.to_string());
        self
    }

    /// The problem.
    pub fn problem(&self) -> &Problem {
        &self.problem
    }
    /// The cost model.
    pub fn costs(&self) -> &CostModel {
        &self.costs
    }
    /// The memory model.
    pub fn memory(&self) -> &MemoryModel {
        &self.memory
    }
    /// The per-rank memory bound, if declared.
    pub fn memory_limit(&self) -> Option<f64> {
        self.memory_limit
    }
    /// Every rank's order.
    pub fn orders(&self) -> &[Vec<Task>] {
        &self.orders
    }
    /// One rank's order (empty when out of range).
    pub fn order(&self, rank: RankId) -> &[Task] {
        self.orders.get(rank.index()).map_or(&[], Vec::as_slice)
    }
    /// Names of the passes applied so far, in order: a record for reports. What the plan is
    /// lives in [`Plan::facts`].
    pub fn passes(&self) -> &[String] {
        &self.passes
    }
    /// What the plan says about itself: layout, pacing, whole or split backwards.
    pub fn facts(&self) -> Facts {
        self.facts
    }
    /// Total number of tasks over all ranks.
    pub fn task_count(&self) -> usize {
        self.orders.iter().map(Vec::len).sum()
    }
    /// Number of stages each rank holds, when all ranks hold the same number.
    pub fn chunks_per_rank(&self) -> Option<u32> {
        let mut counts = vec![0u32; self.problem.ranks() as usize];
        for r in self.problem.stage_to_rank() {
            counts[r.index()] += 1;
        }
        let first = counts[0];
        counts.iter().all(|&c| c == first).then_some(first)
    }
    /// Whether any order holds a residency task (recompute, offload, reload).
    pub fn manages_residency(&self) -> bool {
        !self.facts.residency.is_kept()
    }
    /// Per (stage, microbatch) pair ([`OpSlots::pair`]), what the plan drops for a recompute:
    /// its forward's activations (an `R` rebuilds them), what its W keeps (an `RW` rebuilds
    /// it); empty when it recomputes nothing.
    pub fn recomputed_pairs(&self) -> Vec<Dropped> {
        if !self.facts.residency.recomputed {
            return Vec::new();
        }
        let slots = self.slots();
        let mut dropped = vec![Dropped::default(); slots.pairs()];
        for task in self.orders.iter().flatten() {
            let (Task::Recompute(w) | Task::RecomputeWeightGrad(w)) = task else {
                continue;
            };
            if let Some(pair) = slots.pair(w.stage, w.microbatch) {
                match task {
                    Task::Recompute(_) => dropped[pair].after_forward = true,
                    _ => dropped[pair].after_input_grad = true,
                }
            }
        }
        dropped
    }
    /// Orders in PyTorch's action notation.
    pub fn orders_notation(&self) -> Vec<Vec<String>> {
        self.orders
            .iter()
            .map(|o| o.iter().map(Task::notation).collect())
            .collect()
    }
    /// The numbering of this plan's ops.
    pub fn slots(&self) -> OpSlots {
        OpSlots::of(&self.problem)
    }
    /// Size of a dense table indexed by [`Plan::op_slot`].
    pub fn op_slots(&self) -> usize {
        self.slots().len()
    }
    /// Dense index of an op, or None when its stage or microbatch is out of range.
    pub fn op_slot(&self, op: Op) -> Option<usize> {
        self.slots().op(op)
    }
}

/// The facts must describe the problem (layout) and the orders (whole backwards).
fn check_facts(facts: &Facts, problem: &Problem, orders: &[Vec<Task>]) -> Result<(), CoreError> {
    facts.layout.check(problem)?;
    if facts.backwards == Backwards::Whole && Backwards::of_orders(orders) == Backwards::Split {
        return Err(CoreError::InvalidProblem(
            "the plan claims whole backwards, but its orders run split I or W tasks".to_string(),
        ));
    }
    let residency = Residency::of_orders(orders);
    if facts.residency != residency {
        return Err(CoreError::InvalidProblem(format!(
            "the plan claims {}, but its orders hold {residency}",
            facts.residency
        )));
    }
    if facts.pacing == Pacing::Unscheduled && orders.iter().any(|o| !o.is_empty()) {
        return Err(CoreError::InvalidProblem(
            "the plan claims to be unscheduled, but its orders hold tasks".to_string(),
        ));
    }
    Ok(())
}
