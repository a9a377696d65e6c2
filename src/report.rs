//! The figures of a verified, simulated plan, as one serialisable report (the JSON of
//! `pipeweave plan --format json`) and as human-readable text (written by `report_text.rs`).

use pipeweave_core::TOLERANCE;
use pipeweave_core::{
    lower_bound, sequential_pairs_makespan, CheckReport, CutCosts, Plan, ProgramSet, Semantics,
    Sharing, Simulation, Task,
};
use pipeweave_transforms::schedules::exact::memory_bound;
use serde::{Serialize, Serializer};

/// Everything `pipeweave plan` reports. Field names are the CLI contract (../shared/CLI.md).
#[derive(Clone, Debug, Serialize)]
pub struct PlanReport {
    /// The expression that built the plan.
    pub expression: String,
    /// Names of the passes applied, in order.
    pub passes: Vec<String>,
    /// Number of ranks.
    pub ranks: u32,
    /// Number of (global) stages.
    pub stages: u32,
    /// Number of microbatches: with sequence chunks, the chunks (`M·k`, chunk `c` of microbatch
    /// `m` numbered `m·k + c`), which the orders name.
    pub microbatches: u32,
    /// Sequence chunks per microbatch (`seq_split`; 1: the sequences are whole).
    pub seq_chunks: u32,
    /// Stage -> rank.
    pub stage_to_rank: Vec<u32>,
    /// `[first_mb, end_mb, [stages]]` per route, as in the reference files.
    pub routes: Vec<(u32, u32, Vec<u32>)>,
    /// Groups of stages sharing weights.
    pub tied_stages: Vec<Vec<u32>>,
    /// Per rank, the tasks in order (in PyTorch's notation in the JSON, e.g. `"2F0"`).
    #[serde(serialize_with = "in_notation")]
    pub order: Vec<Vec<Task>>,
    /// When the last op ends.
    pub makespan: f64,
    /// Longest per-rank span (first start to last end).
    pub max_span: f64,
    /// The Zero Bubble paper's bubble rate.
    pub bubble_rate: f64,
    /// A certified lower bound on the makespan of every schedule of the plan's problem
    /// ([`certified_bound`]); `lower_bound_basis` says of which schedules.
    pub lower_bound: f64,
    /// What the bound rests on, so of which schedules it holds.
    pub lower_bound_basis: BoundBasis,
    /// The costs the figures are under, where the plan was imported (`check`): the `--costs`
    /// given, or the default unit costs with `(default)` after them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub costs: Option<String>,
    /// How far the makespan is above the bound, relative to the bound (0: proven optimal).
    pub optimality_gap: f64,
    /// Per rank, time spent running ops.
    pub busy_per_rank: Vec<f64>,
    /// Per rank, makespan minus busy time.
    pub idle_per_rank: Vec<f64>,
    /// Per rank, peak activations in units of one microbatch of a rank's share (on the device).
    pub peak_activations_per_rank: Vec<f64>,
    /// Per rank, the device peak (the same figures; present where the plan recomputes or
    /// offloads, beside the figures that differ from a plan that keeps everything).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_per_rank: Option<Vec<f64>>,
    /// Per rank, the peak of activations offloaded to host memory (where the plan offloads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_peak_per_rank: Option<Vec<f64>>,
    /// Per rank, the part of its device peak a mixture's experts keep (the rows they were
    /// dispatched; where `--activation-memory experts=E` gives them any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts_peak_per_rank: Option<Vec<f64>>,
    /// Per rank, the time its host link spends on transfers (where the plan offloads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_busy_per_rank: Option<Vec<f64>>,
    /// Consecutive ranks on one host link, where more than one (`--ranks-per-link`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ranks_per_link: Option<u32>,
    /// Per shared host link (ranks `k K .. (k + 1) K` for `K` ranks per link), the time any
    /// transfer runs on it (where the plan offloads over shared links).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_link_busy: Option<Vec<f64>>,
    /// Per rank, the pairs offloaded (where the plan offloads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offloads_per_rank: Option<Vec<usize>>,
    /// Per rank, the recompute forwards (R) it runs (where the plan recomputes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recomputes_per_rank: Option<Vec<usize>>,
    /// The recompute forwards of the whole plan (where it recomputes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recomputed_ops: Option<usize>,
    /// With all-to-alls (`--costs a2a=T`): the step's all-to-all time that runs under computes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a2a_hidden: Option<f64>,
    /// With all-to-alls: the step's all-to-all time the computes wait for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a2a_exposed: Option<f64>,
    /// With all-to-alls: the share of the step's all-to-all time that is hidden.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a2a_hidden_fraction: Option<f64>,
    /// With all-to-alls: the share of forwards and backwards run in overlapped F&B pairs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a2a_paired_fraction: Option<f64>,
    /// With all-to-alls: the makespan with each pair's halves run one after the other.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a2a_sequential_makespan: Option<f64>,
    /// The declared per-rank memory limit, if any.
    pub memory_limit: Option<f64>,
    /// With `--profile`: blocks per rank's share.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers_per_stage: Option<Vec<usize>>,
    /// With `--profile`: bytes of one memory unit (the heaviest share's activations of one
    /// microbatch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_per_unit: Option<f64>,
    /// With `--profile`: per rank, the peak activations in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_activation_bytes_per_rank: Option<Vec<f64>>,
    /// Whether every invariant held (always true in a report: unverified plans are errors).
    pub verified: bool,
    /// Messages between ranks in the checked programs.
    pub messages: usize,
    /// Communication groups (batched sends and receives) in the checked programs.
    pub communication_groups: usize,
    /// The semantics the programs were checked under.
    pub communication_checked: Vec<String>,
    /// Per rank, the most received tensors waiting for their compute at once.
    pub receive_buffers_per_rank: Vec<usize>,
    /// PyTorch's parameter actions the programs hold, their order checked: `unshard/reshard`
    /// (FSDP residency) and `gradient reduction` (where PyTorch scales the gradients by 1/M).
    pub parameter_actions: Vec<String>,
}

/// Writes each rank's tasks as their notation: the strings exist only while the JSON is written.
fn in_notation<S: Serializer>(orders: &[Vec<Task>], serializer: S) -> Result<S::Ok, S::Error> {
    /// One rank's tasks, serialised as a list of notations.
    struct Notations<'a>(&'a [Task]);
    impl Serialize for Notations<'_> {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_seq(self.0.iter().map(Task::notation))
        }
    }
    serializer.collect_seq(orders.iter().map(|order| Notations(order)))
}

/// Rounds away floating-point noise (1e-9) so reports are stable; figures too large to scale
/// stay as they are.
pub(crate) fn tidy(x: f64) -> f64 {
    // `+ 0.0` turns -0 into 0 (a report never prints "-0.000").
    let scaled = (x * 1e9).round() / 1e9 + 0.0;
    if scaled.is_finite() {
        scaled
    } else {
        x
    }
}

/// What a plan's lower bound rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundBasis {
    /// Dependencies, latency and each rank's work, memory relaxed
    /// ([`pipeweave_core::lower_bound`]): every schedule of the problem.
    Relaxed,
    /// What the declared memory limit forces as well
    /// ([`pipeweave_transforms::schedules::exact::memory_bound`]): every schedule that runs
    /// each op once and keeps its activations within the limit (no recompute, no offload).
    MemoryLimit,
    /// An exact search over those schedules (`zero_bubble(policy=optimal)`,
    /// [`Plan::proven_bound`]).
    Search,
}

/// The best lower bound known for `plan`'s problem and what it rests on: the relaxation's; what
/// the plan's declared memory limit forces where the plan keeps its activations; a search's
/// proven bound where it left one.
pub fn certified_bound(plan: &Plan) -> (f64, BoundBasis) {
    let mut best = placement_bound_with_basis(plan, plan.memory_limit());
    if let Some(proven) = plan.proven_bound() {
        if proven > best.0 + TOLERANCE {
            best = (proven, BoundBasis::Search);
        }
    }
    best
}

/// A lower bound on every schedule of `plan`'s problem that fits `limit` (None: no limit): the
/// relaxation's ([`lower_bound`]) and, for a plan that keeps its activations, what the limit
/// forces ([`memory_bound`]: schedules that keep their activations). A plan that recomputes or
/// offloads gets the relaxation's alone, which bounds its schedules too.
pub fn placement_bound(plan: &Plan, limit: Option<f64>) -> f64 {
    placement_bound_with_basis(plan, limit).0
}

/// [`placement_bound`] and what it rests on.
fn placement_bound_with_basis(plan: &Plan, limit: Option<f64>) -> (f64, BoundBasis) {
    let relaxed = (lower_bound(plan), BoundBasis::Relaxed);
    match limit {
        Some(limit) if !plan.manages_residency() => {
            let memory = memory_bound(plan, limit);
            if memory > relaxed.0 + TOLERANCE {
                (memory, BoundBasis::MemoryLimit)
            } else {
                relaxed
            }
        }
        _ => relaxed,
    }
}

impl PlanReport {
    /// Builds the report of a verified plan and its simulation.
    pub fn new(expression: &str, plan: &Plan, simulation: &Simulation) -> PlanReport {
        let problem = plan.problem();
        let (bound, basis) = certified_bound(plan);
        PlanReport {
            expression: expression.to_string(),
            passes: plan.passes().to_vec(),
            ranks: problem.ranks(),
            stages: problem.stages(),
            microbatches: problem.microbatches(),
            seq_chunks: problem.seq_chunks(),
            stage_to_rank: problem.stage_to_rank().iter().map(|r| r.get()).collect(),
            routes: problem
                .route_specs()
                .into_iter()
                .map(|r| (r.first, r.end, r.stages))
                .collect(),
            tied_stages: problem
                .tied_stages()
                .iter()
                .map(|g| g.iter().map(|s| s.get()).collect())
                .collect(),
            order: plan.orders().to_vec(),
            makespan: tidy(simulation.makespan()),
            max_span: tidy(simulation.max_span()),
            bubble_rate: tidy(simulation.bubble_rate()),
            lower_bound: tidy(bound),
            lower_bound_basis: basis,
            costs: None,
            optimality_gap: tidy(gap(simulation.makespan(), bound)),
            busy_per_rank: simulation.ranks().iter().map(|r| tidy(r.busy)).collect(),
            idle_per_rank: simulation.ranks().iter().map(|r| tidy(r.idle)).collect(),
            peak_activations_per_rank: simulation
                .ranks()
                .iter()
                .map(|r| tidy(r.peak_activations))
                .collect(),
            device_peak_per_rank: None,
            host_peak_per_rank: None,
            experts_peak_per_rank: plan.memory().has_experts().then(|| {
                simulation
                    .ranks()
                    .iter()
                    .map(|r| tidy(r.experts_peak_activations))
                    .collect()
            }),
            link_busy_per_rank: None,
            ranks_per_link: None,
            shared_link_busy: None,
            offloads_per_rank: None,
            recomputes_per_rank: None,
            recomputed_ops: None,
            a2a_hidden: None,
            a2a_exposed: None,
            a2a_hidden_fraction: None,
            a2a_paired_fraction: None,
            a2a_sequential_makespan: None,
            memory_limit: plan.memory_limit(),
            layers_per_stage: None,
            bytes_per_unit: None,
            peak_activation_bytes_per_rank: None,
            verified: true,
            messages: 0,
            communication_groups: 0,
            communication_checked: Vec::new(),
            receive_buffers_per_rank: Vec::new(),
            parameter_actions: Vec::new(),
        }
        .with_residency(plan, simulation)
        .with_all_to_alls(plan, simulation)
    }

    /// The figures of a mixture of experts' all-to-alls, where the costs have any.
    fn with_all_to_alls(mut self, plan: &Plan, simulation: &Simulation) -> PlanReport {
        let Some(a2a) = simulation.a2a() else {
            return self;
        };
        self.a2a_hidden = Some(tidy(a2a.hidden));
        self.a2a_exposed = Some(tidy(a2a.exposed));
        self.a2a_hidden_fraction = Some(tidy(a2a.hidden_fraction()));
        self.a2a_paired_fraction = Some(tidy(a2a.paired_ops));
        self.a2a_sequential_makespan = sequential_pairs_makespan(plan).ok().map(tidy);
        self
    }

    /// The figures of a plan's recomputes and transfers, where it has any.
    fn with_residency(mut self, plan: &Plan, simulation: &Simulation) -> PlanReport {
        let residency = plan.facts().residency;
        let count = |kind: fn(&Task) -> bool| -> Vec<usize> {
            plan.orders()
                .iter()
                .map(|o| o.iter().filter(|t| kind(t)).count())
                .collect()
        };
        let ranks = simulation.ranks();
        if !residency.is_kept() {
            self.device_peak_per_rank = Some(self.peak_activations_per_rank.clone());
        }
        if residency.offloaded {
            self.host_peak_per_rank = Some(
                ranks
                    .iter()
                    .map(|r| tidy(r.host_peak_activations))
                    .collect(),
            );
            self.link_busy_per_rank = Some(ranks.iter().map(|r| tidy(r.link_busy)).collect());
            self.offloads_per_rank = Some(count(|t| matches!(t, Task::Offload(_))));
        }
        if residency.recomputed {
            let recomputes =
                count(|t| matches!(t, Task::Recompute(_) | Task::RecomputeWeightGrad(_)));
            self.recomputed_ops = Some(recomputes.iter().sum());
            self.recomputes_per_rank = Some(recomputes);
        }
        self
    }

    /// Says which costs the figures are under: `text` (in `--costs` syntax), the default where
    /// `default`.
    pub fn with_costs(mut self, text: &str, default: bool) -> PlanReport {
        self.costs = Some(if default {
            format!("{text} (default)")
        } else {
            text.to_string()
        });
        self
    }

    /// Adds the shared host links' figures, where `sharing` puts several ranks on a link: per
    /// link, the time any of its ranks' transfers runs in `simulation`.
    pub fn with_links(mut self, sharing: Sharing, simulation: &Simulation) -> PlanReport {
        let per_link = sharing.ranks_per_link();
        if per_link <= 1 {
            return self;
        }
        self.ranks_per_link = Some(per_link);
        if self.link_busy_per_rank.is_none() {
            return self;
        }
        let timeline = simulation.timeline();
        let links = timeline.len().div_ceil(per_link as usize);
        let busy = (0..links)
            .map(|link| {
                let mut spans: Vec<(f64, f64)> = timeline
                    .iter()
                    .enumerate()
                    .filter(|(r, _)| sharing.link_of(*r) == link)
                    .flat_map(|(_, tasks)| tasks.iter().filter(|t| t.task.on_link()))
                    .map(|t| (t.start, t.end))
                    .collect();
                spans.sort_by(|a, b| a.0.total_cmp(&b.0));
                let (mut total, mut reach) = (0.0f64, f64::NEG_INFINITY);
                for (start, end) in spans {
                    let from = start.max(reach);
                    total += (end - from).max(0.0);
                    reach = reach.max(end);
                }
                tidy(total)
            })
            .collect();
        self.shared_link_busy = Some(busy);
        self
    }

    /// Adds a profile's cut: the blocks per share and the peaks in bytes.
    pub fn with_cut(mut self, cut: Option<&CutCosts>) -> PlanReport {
        if let Some(cut) = cut {
            self.layers_per_stage = Some(cut.layers_per_stage.clone());
            self.bytes_per_unit = Some(cut.bytes_per_unit);
            self.peak_activation_bytes_per_rank = Some(
                self.peak_activations_per_rank
                    .iter()
                    .map(|p| (p * cut.bytes_per_unit).round())
                    .collect(),
            );
        }
        self
    }

    /// Adds the figures of the checked programs and what their check counted.
    pub fn with_programs(mut self, programs: &ProgramSet, counts: &CheckReport) -> PlanReport {
        self.messages = counts.messages;
        self.communication_groups = counts.groups;
        self.receive_buffers_per_rank = programs.peak_receive_buffers();
        self.communication_checked = match programs.semantics {
            Semantics::Blocking => vec!["blocking rendezvous".to_string(), "batched".to_string()],
            Semantics::Batched => vec!["batched".to_string()],
            Semantics::Rendezvous => vec![Semantics::Rendezvous.to_string(), "batched".to_string()],
        };
        let kinds = [
            (counts.params.residency, "unshard/reshard"),
            (counts.params.reductions, "gradient reduction"),
        ];
        self.parameter_actions = kinds
            .iter()
            .filter(|(held, _)| *held)
            .map(|(_, kind)| kind.to_string())
            .collect();
        self
    }
}

/// `makespan` above `bound`, relative to `bound` (0 where the bound is 0). Never clamped: a
/// bound is below every makespan, so a negative gap is a bug, shown as it is for the tests
/// (`tests/bound_soundness.rs`) to catch.
pub(crate) fn gap(makespan: f64, bound: f64) -> f64 {
    if bound > 0.0 {
        makespan / bound - 1.0
    } else {
        0.0
    }
}
