//! The measured timeline of a step: each op's real start and end per rank, drawn and traced like a
//! simulated one, and the plan re-costed with the measured op durations so the simulator's
//! prediction can be set beside the measurement.

use crate::error::TrainError;
use crate::stage::MeasuredOp;
use pipeweave_core::analysis::replay::TimedTask;
use pipeweave_core::formats::{svg, trace};
use pipeweave_core::{simulate, CostModel, Plan, Simulation, StageCosts, StageCostsSpec, Task};

/// The measured ops as a timeline of tasks (one task per op), per rank in start order.
pub fn measured_timeline(measured: &[Vec<MeasuredOp>]) -> Vec<Vec<TimedTask>> {
    let mut sequence = 0;
    measured
        .iter()
        .map(|ops| {
            let mut ops = ops.clone();
            ops.sort_by(|a, b| a.start.total_cmp(&b.start));
            ops.iter()
                .map(|op| {
                    sequence += 1;
                    TimedTask {
                        task: op.task,
                        start: op.start,
                        end: op.end,
                        sequence: sequence - 1,
                    }
                })
                .collect()
        })
        .collect()
}

/// Which measured mean a task's duration goes to: F, I, W, R, or a transfer.
fn cost_slot(task: &Task) -> Option<usize> {
    match task {
        Task::Forward(_) => Some(0),
        Task::InputGrad(_) => Some(1),
        Task::WeightGrad(_) => Some(2),
        Task::Recompute(_) => Some(3),
        Task::Offload(_) | Task::Reload(_) => Some(4),
        // A forward and an I again: no figure of its own in the cost model.
        Task::Backward(_) | Task::Overlapped { .. } | Task::RecomputeWeightGrad(_) => None,
    }
}

/// `plan` with every stage's F, I and W costs (and R and transfers, where measured) set to their
/// mean measured durations (seconds; B and F&B the sums of their parts, no link latency): what
/// the simulator needs to predict the step from measured op costs.
pub fn with_measured_costs(plan: &Plan, measured: &[Vec<MeasuredOp>]) -> Result<Plan, TrainError> {
    let stages = plan.problem().stages() as usize;
    let mut sums = vec![[0.0f64; 5]; stages];
    let mut counts = vec![[0usize; 5]; stages];
    for op in measured.iter().flatten() {
        if let (Some(sum), Some(count), Some(k)) = (
            sums.get_mut(op.work.stage.index()),
            counts.get_mut(op.work.stage.index()),
            cost_slot(&op.task),
        ) {
            sum[k] += op.end - op.start;
            count[k] += 1;
        }
    }
    let measured_mean =
        |s: usize, k: usize| (counts[s][k] > 0).then(|| sums[s][k] / counts[s][k] as f64);
    let mean = |s: usize, k: usize| measured_mean(s, k).unwrap_or(0.0);
    let costs: Vec<StageCosts> = (0..stages)
        .map(|s| {
            StageCostsSpec::builder()
                .forward(mean(s, 0))
                .input_grad(mean(s, 1))
                .weight_grad(mean(s, 2))
                .recompute_opt(measured_mean(s, 3))
                .offload_opt(measured_mean(s, 4))
                .build()
                .validate()
        })
        .collect::<Result<_, _>>()
        .map_err(TrainError::MeasuredCosts)?;
    let costs = CostModel::per_stage(costs, 0.0).map_err(TrainError::MeasuredCosts)?;
    let shape = (plan.problem().clone(), costs, plan.memory().clone());
    plan.clone()
        .reshaped(Some(shape), plan.orders().to_vec(), plan.facts())
        .map_err(TrainError::MeasuredCosts)
}

/// The files of a step's timeline.
pub struct StepTimeline {
    /// SVG of the measured timeline.
    pub measured_svg: String,
    /// SVG of the simulator's prediction from the measured op costs.
    pub simulated_svg: String,
    /// Chrome/Perfetto trace JSON of the measured timeline.
    pub trace: String,
    /// Measured step span (first start to last end, seconds).
    pub measured_seconds: f64,
    /// The simulator's prediction from measured op costs (seconds).
    pub simulated_seconds: f64,
}

/// The pipeline's own overhead in a measured step: the step as it ran against the step the
/// simulator replays from the same op durations (each op's mean, no waiting but what the
/// schedule's dependencies force). Their ratio is what the interpreter, the transport and the
/// threads add on top of the computation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PipelineOverhead {
    /// Measured step span (first op's start to last op's end, seconds).
    pub measured_seconds: f64,
    /// The simulator's step from the measured op costs (seconds).
    pub replayed_seconds: f64,
}

impl PipelineOverhead {
    /// `measured / replayed` (1 is no overhead).
    pub fn ratio(&self) -> f64 {
        self.measured_seconds / self.replayed_seconds.max(1e-12)
    }
}

/// The [`PipelineOverhead`] of the measured step `measured` of `plan`.
pub fn pipeline_overhead(
    plan: &Plan,
    measured: &[Vec<MeasuredOp>],
) -> Result<PipelineOverhead, TrainError> {
    let costed = with_measured_costs(plan, measured)?;
    let replayed = simulate(&costed).map_err(TrainError::Replay)?;
    let timeline = measured_timeline(measured);
    let ops = timeline.iter().flatten();
    let start = ops.clone().map(|t| t.start).fold(f64::INFINITY, f64::min);
    let end = ops.map(|t| t.end).fold(f64::NEG_INFINITY, f64::max);
    Ok(PipelineOverhead {
        measured_seconds: (end - start).max(0.0),
        replayed_seconds: replayed.makespan(),
    })
}

/// Draws and traces the measured step `measured` of `plan`, beside its simulation.
pub fn step_timeline(
    plan: &Plan,
    measured: &[Vec<MeasuredOp>],
    title: &str,
) -> Result<StepTimeline, TrainError> {
    let costed = with_measured_costs(plan, measured)?;
    let timeline = measured_timeline(measured);
    let start = timeline
        .iter()
        .flatten()
        .map(|t| t.start)
        .fold(f64::INFINITY, f64::min);
    let shifted: Vec<Vec<TimedTask>> = timeline
        .into_iter()
        .map(|tasks| {
            tasks
                .into_iter()
                .map(|t| TimedTask {
                    start: t.start - start,
                    end: t.end - start,
                    ..t
                })
                .collect()
        })
        .collect();
    let measured_sim = Simulation::from_timeline(&costed, shifted);
    let predicted = simulate(&costed).map_err(TrainError::Replay)?;
    let trace = serde_json::to_string(&trace::chrome_trace(&costed, &measured_sim, title))
        .map_err(TrainError::Trace)?;
    Ok(StepTimeline {
        measured_svg: svg::timeline_svg(&costed, &measured_sim, &format!("{title} (measured, s)")),
        simulated_svg: svg::timeline_svg(
            &costed,
            &predicted,
            &format!("{title} (simulated from measured op costs, s)"),
        ),
        trace,
        measured_seconds: measured_sim.makespan(),
        simulated_seconds: predicted.makespan(),
    })
}
