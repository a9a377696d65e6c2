//! A small numeric stage model for end-to-end tests and `pipeweave run`: every stage is a scalar
//! affine map `y = a x + b` in f64, and the loss of a microbatch is `(y - t)^2 / 2` on the last
//! stage of its route. Tied stages (DualPipe's replicas) share one set of weights.
//!
//! [`AffineModel::sequential_gradients`] computes the gradients of one step on a single device,
//! microbatch after microbatch; [`AffineStage`] is one rank's share for a backend, which
//! accumulates the same gradients in whatever order the schedule runs. The two must agree to
//! rounding.
//!
//! A stage declares and honours every residency instruction as the simulator models them: a drop keeps the
//! forward's input only and a recompute (spending its time) restores the activation; an offload
//! moves the activation to a host store and a reload brings it back, each a transfer on the rank's
//! host link, which runs beside the computes (one transfer at a time, in the program's order): a
//! transfer does not hold the rank up, a forward or recompute waits for every offload issued
//! before it, and a backward for its reload (the W, for a pair offloaded between its I and W). A
//! backward that finds its activation dropped or on the host is an error. A drop after an I keeps
//! the stage input and the output gradient, and an `RW` (spending its time) restores what the W
//! needs.

use crate::compute::{backward_in_halves, Capabilities, StageCompute};
use crate::stage_error::StageError;
use crate::timing::sleep_until;
use pipeweave_core::{Problem, StageId, Task, Work};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The weights, inputs and targets of one training step.
#[derive(Clone, Debug, PartialEq)]
pub struct AffineModel {
    /// Weight set of every stage (the first stage of its tied group).
    weight_set: Vec<usize>,
    /// `a` of every weight set.
    scale: Vec<f64>,
    /// `b` of every weight set.
    shift: Vec<f64>,
    /// Input of every microbatch.
    inputs: Vec<f64>,
    /// Target of every microbatch.
    targets: Vec<f64>,
}

/// Gradients of every weight set: (d loss / d a, d loss / d b).
pub type Gradients = Vec<(f64, f64)>;

impl AffineModel {
    /// Deterministic weights and data for `problem`.
    pub fn new(problem: &Problem) -> AffineModel {
        let stages = problem.stages() as usize;
        let mut weight_set: Vec<usize> = (0..stages).collect();
        for group in problem.tied_stages() {
            let first = group.iter().map(|s| s.index()).min().unwrap_or(0);
            for s in group {
                weight_set[s.index()] = first;
            }
        }
        let scale = (0..stages)
            .map(|s| 1.0 + 0.1 * ((s as f64) + 1.0).sin())
            .collect();
        let shift = (0..stages).map(|s| 0.05 * (s as f64).cos()).collect();
        let m = problem.microbatches() as usize;
        let inputs = (0..m)
            .map(|i| 0.5 + 0.1 * ((i as f64) * 0.7).cos())
            .collect();
        let targets = (0..m).map(|i| 1.0 - 0.03 * (i as f64)).collect();
        AffineModel {
            weight_set,
            scale,
            shift,
            inputs,
            targets,
        }
    }

    fn params(&self, stage: StageId) -> (f64, f64) {
        let w = self.weight_set[stage.index()];
        (self.scale[w], self.shift[w])
    }

    /// The gradients of one step computed on one device, microbatch by microbatch.
    pub fn sequential_gradients(&self, problem: &Problem) -> Gradients {
        let mut grads = vec![(0.0, 0.0); self.scale.len()];
        for route in problem.routes() {
            for mb in route.first().get()..route.end().get() {
                let mut xs = Vec::with_capacity(route.stages().len());
                let mut x = self.inputs[mb as usize];
                for &stage in route.stages() {
                    xs.push(x);
                    let (a, b) = self.params(stage);
                    x = a * x + b;
                }
                let mut g = x - self.targets[mb as usize];
                for (&stage, &input) in route.stages().iter().zip(&xs).rev() {
                    let (a, _) = self.params(stage);
                    let w = self.weight_set[stage.index()];
                    grads[w].0 += g * input;
                    grads[w].1 += g;
                    g *= a;
                }
            }
        }
        grads
    }

    /// The share of rank `rank`, spending `delay(task)` of wall time in each task the program
    /// runs (a whole backward and an overlapped F&B once, as the simulator prices them), for
    /// runs that compare measured with simulated time; zero for correctness runs.
    pub fn stage(&self, delay: impl Fn(&Task) -> Duration + Send + 'static) -> AffineStage {
        AffineStage {
            model: self.clone(),
            saved_input: HashMap::new(),
            weight_dropped: HashMap::new(),
            dropped: HashMap::new(),
            host: HashMap::new(),
            link: HostLink::default(),
            saved_grad: HashMap::new(),
            grads: vec![(0.0, 0.0); self.scale.len()],
            delay: Box::new(delay),
            fused: false,
            spent: Vec::new(),
        }
    }

    /// The largest relative difference between two gradient sets (0 when equal).
    pub fn max_relative_error(a: &Gradients, b: &Gradients) -> f64 {
        a.iter()
            .zip(b)
            .flat_map(|(x, y)| [(x.0, y.0), (x.1, y.1)])
            .map(|(x, y)| {
                let scale = x.abs().max(y.abs()).max(1e-300);
                (x - y).abs() / scale
            })
            .fold(
                if a.len() == b.len() {
                    0.0
                } else {
                    f64::INFINITY
                },
                f64::max,
            )
    }
}

/// The rank's host link: when it is free, when the last offload issued on it ends, and when
/// each reload ends.
#[derive(Default)]
struct HostLink {
    free: Option<Instant>,
    fence: Option<Instant>,
    reloaded: HashMap<Work, Instant>,
}

/// One rank's share of an [`AffineModel`].
pub struct AffineStage {
    model: AffineModel,
    /// The activations a backward needs (the stage input, for this model), by forward.
    saved_input: HashMap<Work, f64>,
    /// The inputs dropped forwards keep for their recomputes.
    dropped: HashMap<Work, f64>,
    /// What a pair whose W state was dropped after its I keeps for its `RW`: its stage input and
    /// the output gradient its I received.
    weight_dropped: HashMap<Work, (f64, f64)>,
    /// Activations on the host.
    host: HashMap<Work, f64>,
    link: HostLink,
    saved_grad: HashMap<Work, f64>,
    grads: Gradients,
    delay: Box<dyn Fn(&Task) -> Duration + Send>,
    /// Inside a fused task: its parts spend nothing, the task spends its own time.
    fused: bool,
    /// Every task this rank ran, in the order it ran them.
    spent: Vec<SpentTask>,
}

/// One task as a rank ran it: when its time started and ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpentTask {
    /// The task (a fused task once, not its parts).
    pub task: Task,
    /// When the task began spending its time.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
}

impl SpentTask {
    /// How long the task took.
    pub fn duration(&self) -> Duration {
        self.end.duration_since(self.start)
    }
}

impl AffineStage {
    /// The gradients this rank accumulated (zero for weight sets it does not hold).
    pub fn gradients(&self) -> &Gradients {
        &self.grads
    }

    fn spend(&mut self, task: Task) {
        if self.fused {
            return;
        }
        let start = Instant::now();
        let d = (self.delay)(&task);
        if !d.is_zero() {
            sleep_until(start + d);
        }
        let end = Instant::now();
        self.spent.push(SpentTask { task, start, end });
    }

    /// When this rank's first task started and its last task ended (None before any task): the
    /// schedule's measured makespan is the latest end less the earliest start over the ranks.
    pub fn busy(&self) -> Option<(Instant, Instant)> {
        let first = self.spent.iter().map(|s| s.start).min()?;
        let last = self.spent.iter().map(|s| s.end).max()?;
        Some((first, last))
    }

    /// A transfer on the host link: it starts when the link is free, takes its time beside the
    /// computes, and is recorded with its (possibly future) times; returns when it ends.
    fn transfer(&mut self, task: Task) -> Instant {
        let now = Instant::now();
        let start = self.link.free.map_or(now, |free| free.max(now));
        let end = start + (self.delay)(&task);
        self.link.free = Some(end);
        self.spent.push(SpentTask { task, start, end });
        end
    }

    /// Waits for every offload issued so far: what an allocation needs.
    fn wait_for_offloads(&self) {
        if let Some(fence) = self.link.fence {
            sleep_until(fence);
        }
    }

    fn missing(what: &str, work: Work) -> String {
        format!(
            "{what} of stage {} microbatch {}",
            work.stage, work.microbatch
        )
    }

    /// The bug of a weight gradient of `work` that finds what it needs missing (`why`).
    fn weight_grad_bug(work: Work, why: &str) -> StageError {
        StageError::bug(format!("{} {why}", Self::missing("weight gradient", work)))
    }

    /// Every task this rank ran, with its times, in the order it ran them (a fused task once).
    pub fn spent(&self) -> &[SpentTask] {
        &self.spent
    }

    /// The seconds each task this rank ran took (a fused task once).
    pub fn task_seconds(&self) -> impl Iterator<Item = (Task, f64)> + '_ {
        self.spent
            .iter()
            .map(|spent| (spent.task, spent.duration().as_secs_f64()))
    }

    /// Runs `parts` as one task: the parts spend nothing, then the task spends its time (unless
    /// it is itself part of an enclosing fused task).
    fn fused<R>(&mut self, task: Task, parts: impl FnOnce(&mut Self) -> R) -> R {
        let outer = std::mem::replace(&mut self.fused, true);
        let result = parts(self);
        self.fused = outer;
        self.spend(task);
        result
    }
}

/// `work`'s microbatch's entry of the model's `values` (its `what`: input or target).
fn of_microbatch(values: &[f64], work: Work, what: &str) -> Result<f64, StageError> {
    values.get(work.microbatch.index()).copied().ok_or_else(|| {
        StageError::bad_input(format!(
            "the model has no {what} for microbatch {}",
            work.microbatch
        ))
    })
}

/// Takes `work`'s entry out of `store`: the bug "nothing to `doing`: no `what` of ..." when it has
/// none.
fn take<V>(
    store: &mut HashMap<Work, V>,
    work: Work,
    doing: &str,
    what: &str,
) -> Result<V, StageError> {
    store.remove(&work).ok_or_else(|| {
        StageError::bug(format!(
            "nothing to {doing}: no {}",
            AffineStage::missing(what, work)
        ))
    })
}

/// Sums the gradients of every rank into one set.
pub fn total_gradients(stages: &[AffineStage]) -> Gradients {
    let sets = stages.first().map_or(0, |s| s.grads.len());
    let mut total = vec![(0.0, 0.0); sets];
    for stage in stages {
        for (t, g) in total.iter_mut().zip(&stage.grads) {
            t.0 += g.0;
            t.1 += g.1;
        }
    }
    total
}

impl StageCompute for AffineStage {
    type Tensor = f64;

    fn forward(&mut self, work: Work, input: Option<f64>) -> Result<f64, StageError> {
        self.wait_for_offloads();
        self.spend(Task::Forward(work));
        let x = match input {
            Some(x) => x,
            None => of_microbatch(&self.model.inputs, work, "input")?,
        };
        self.saved_input.insert(work, x);
        let (a, b) = self.model.params(work.stage);
        Ok(a * x + b)
    }

    fn loss(&mut self, work: Work, output: f64) -> Result<f64, StageError> {
        let target = of_microbatch(&self.model.targets, work, "target")?;
        Ok(output - target)
    }

    fn backward_input(&mut self, work: Work, grad_output: f64) -> Result<Option<f64>, StageError> {
        if let Some(end) = self.link.reloaded.remove(&work) {
            sleep_until(end);
        }
        if !self.saved_input.contains_key(&work) {
            let place = if self.dropped.contains_key(&work) {
                "dropped (no recompute ran)"
            } else if self.host.contains_key(&work) {
                "on the host (no reload ran)"
            } else {
                "missing"
            };
            return Err(StageError::bug(format!(
                "the backward finds the {} {place}",
                Self::missing("activation", work)
            )));
        }
        self.spend(Task::InputGrad(work));
        self.saved_grad.insert(work, grad_output);
        let (a, _) = self.model.params(work.stage);
        Ok(Some(a * grad_output))
    }

    fn backward_weight(&mut self, work: Work) -> Result<(), StageError> {
        // A pair offloaded between its I and W: the W waits for its reload.
        if let Some(end) = self.link.reloaded.remove(&work) {
            sleep_until(end);
        }
        if self.host.contains_key(&work) {
            return Err(Self::weight_grad_bug(
                work,
                "with its input on the host (no reload ran)",
            ));
        }
        if self.weight_dropped.contains_key(&work) {
            return Err(Self::weight_grad_bug(
                work,
                "with its state dropped (no recompute for it ran)",
            ));
        }
        self.spend(Task::WeightGrad(work));
        let g = self
            .saved_grad
            .remove(&work)
            .ok_or_else(|| Self::weight_grad_bug(work, "before its input gradient"))?;
        let x = self
            .saved_input
            .remove(&work)
            .ok_or_else(|| Self::weight_grad_bug(work, "without its forward"))?;
        let w = self.model.weight_set[work.stage.index()];
        self.grads[w].0 += g * x;
        self.grads[w].1 += g;
        Ok(())
    }

    fn backward(&mut self, work: Work, grad_output: f64) -> Result<Option<f64>, StageError> {
        self.fused(Task::Backward(work), |stage| {
            backward_in_halves(stage, work, grad_output)
        })
    }

    fn forward_backward(
        &mut self,
        forward: Work,
        input: Option<f64>,
        backward: Work,
        grad_output: f64,
    ) -> Result<(f64, Option<f64>), StageError> {
        self.fused(Task::Overlapped { forward, backward }, |stage| {
            let output = stage.forward(forward, input)?;
            let grad_input = stage.backward(backward, grad_output)?;
            Ok((output, grad_input))
        })
    }

    /// Every residency instruction (see the module doc).
    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn drop_activations(&mut self, work: Work) -> Result<(), StageError> {
        let input = take(&mut self.saved_input, work, "drop", "forward")?;
        self.dropped.insert(work, input);
        Ok(())
    }

    fn recompute(&mut self, work: Work) -> Result<(), StageError> {
        let input = take(&mut self.dropped, work, "recompute from", "dropped forward")?;
        self.wait_for_offloads();
        self.spend(Task::Recompute(work));
        self.saved_input.insert(work, input);
        Ok(())
    }

    fn drop_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        let input = take(&mut self.saved_input, work, "drop", "forward")?;
        let grad = take(
            &mut self.saved_grad,
            work,
            "drop",
            "input-gradient backward",
        )?;
        self.weight_dropped.insert(work, (input, grad));
        Ok(())
    }

    fn recompute_weight_grad(&mut self, work: Work) -> Result<(), StageError> {
        let (input, grad) = take(
            &mut self.weight_dropped,
            work,
            "recompute for the weight gradient from",
            "dropped weight-gradient state",
        )?;
        self.wait_for_offloads();
        self.spend(Task::RecomputeWeightGrad(work));
        // The forward and the input-gradient backward again: for an affine stage, what the W
        // needs is the stage input and the output gradient themselves.
        self.saved_input.insert(work, input);
        self.saved_grad.insert(work, grad);
        Ok(())
    }

    fn offload(&mut self, work: Work) -> Result<(), StageError> {
        let input = take(&mut self.saved_input, work, "offload", "forward")?;
        self.host.insert(work, input);
        let end = self.transfer(Task::Offload(work));
        self.link.fence = Some(self.link.fence.map_or(end, |f| f.max(end)));
        Ok(())
    }

    fn reload(&mut self, work: Work) -> Result<(), StageError> {
        let input = take(&mut self.host, work, "reload", "offload")?;
        self.saved_input.insert(work, input);
        let end = self.transfer(Task::Reload(work));
        self.link.reloaded.insert(work, end);
        Ok(())
    }
}
