//! [`MpiCluster`] (cargo feature `mpi`): one process per rank of every data-parallel replica and
//! expert rank, started by `mpirun -np D·P·X` ([`start`] starts MPI).
//!
//! - **Communicators.** World rank `w = (d·X + x)·P + r` is rank `r` of expert rank `x` of
//!   replica `d`, as on threads (`WorldLayout`; `X = 1` without expert parallelism): each replica
//!   is `X` pipelines running the same program on the same microbatches. The world is split into
//!   one pipeline communicator per (replica, expert rank), on which the rank's program runs over an
//!   [`MpiTransport`] (pipeline payloads are [`WireTensor`]s: the tensor's element type and shape
//!   travel in the message header and are checked on receipt). Both program sets (training and
//!   forward-only evaluation) are agreed on before the first step (checked once, then
//!   [`agree_on_programs`]: fingerprints compared; the cluster keeps the checked sets and runs
//!   its rank's [`pipeweave_backends::CheckedRank`] of them), and a step's own plan
//!   ([`Cluster::set_plan`], variable-length microbatches) the same way when every process
//!   switches to it.
//! - **Expert ranks** (`X > 1`). The `X` processes of a pipeline rank of a replica are a group
//!   with a communicator of its own, over which their mixtures exchange rows
//!   (`experts/mpi_exchange.rs`: one tag per phase, sends never waiting, waits giving the
//!   rank's compute slot to the other half of an overlapped pair). An overlapped pair calls the
//!   exchange from two threads at once, so MPI is started at `MPI_THREAD_MULTIPLE` ([`start`]).
//! - **Gradients.** A stage's weight gradients go to an ordered reduction
//!   ([`crate::reduce::Reduction`]) over a [`Mailbox`] among the processes of one expert rank
//!   (the world with `X = 1`; process `d P + r` of it is rank `r` of replica `d`): data-parallel
//!   replicas and DualPipe's mirrored stages pass a running sum along in global microbatch order,
//!   so with `deterministic` the sums are the bits of the threaded run. The reduction is advanced
//!   before every communication group of the pipeline (it starts while the pipeline still runs)
//!   and completed at the end of the program. With expert ranks, each process's sums are its
//!   share's; the group then gathers each parameter's from its owner (`gather_gradients` there),
//!   so every expert rank updates the whole model with the same gradients, as the threads'
//!   merge does, and world rank 0 alone writes the files.
//! - **Losses, norms, peaks.** Each microbatch's loss is computed by one process of expert rank 0
//!   (the others compute the same bits); a sum-reduction over the world of a vector with one slot
//!   per microbatch (zeros elsewhere) gives every process every loss exactly, and the losses are
//!   added in microbatch order as on threads. The squared gradient norms go the same way, one slot
//!   per parameter, filled by the first holder of its position at expert rank 0.
//! - **Failures.** A rank whose step fails returns the error (naming the rank and instruction);
//!   the caller reports it and calls [`Cluster::abandon`], which aborts the job. A wait longer
//!   than the timeout ends with who waits on whom, gathered from the other ranks of the pipeline
//!   (a rank waiting for a gradient sum says which); an expert exchange that waits longer fails
//!   naming the expert rank it waited for.

use crate::batch::StepBatch;
use crate::cluster::{Cluster, ClusterStep};
use crate::cut::ModelCut;
use crate::error::TrainError;
use crate::experts::mpi_exchange::{gather_gradients, MpiExchange};
use crate::experts::ExpertRank;
use crate::gradients::{GradSync, LocalGradients};
use crate::optim::squared_norms;
use crate::reduce::{decode, encode, Courier, GradientOwners, Reduction};
use crate::stage::{GptStage, Injection};
use crate::step::{GptModel, StageRun, TRAINER_RECEIVES};
use candle_core::{DType, Device, Tensor};
use pipeweave_backends::interpreter::run_rank;
use pipeweave_backends::mpi::rsmpi;
use pipeweave_backends::mpi::SharedMailbox;
use pipeweave_backends::mpi::{agree_on_programs, Mailbox, MpiTransport, FAILURE_STATUS};
use pipeweave_backends::mpi::{WireDType, WirePayload};
use pipeweave_backends::{Incoming, Outgoing, StageError, Transport, TransportFailure};
use pipeweave_core::{CheckedPrograms, Plan, Problem, ProjectionOptions, RankId};
use pipeweave_kernels::{ExpertExchange, ExpertPlacement, GptConfig};
use rsmpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use rsmpi::environment::{Threading, Universe};
use rsmpi::topology::{Color, Communicator, SimpleCommunicator};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A tensor as a pipeline payload over MPI.
#[derive(Debug, Clone)]
pub struct WireTensor(pub Tensor);

impl WirePayload for WireTensor {
    fn dtype(&self) -> WireDType {
        match self.0.dtype() {
            DType::F64 => WireDType::F64,
            DType::F16 => WireDType::F16,
            DType::BF16 => WireDType::BF16,
            DType::I64 => WireDType::I64,
            DType::U32 => WireDType::U32,
            DType::U8 => WireDType::U8,
            _ => WireDType::F32,
        }
    }

    fn shape(&self) -> Vec<usize> {
        self.0.dims().to_vec()
    }

    fn to_bytes(&self) -> Vec<u8> {
        // Activations and gradients are f32 or f64 (the model's dtype); `encode` handles both.
        encode(std::slice::from_ref(&self.0)).unwrap_or_default()
    }

    /// The tensor in host memory, where the bytes arrived; [`StepTransport`] moves it to the
    /// step's device.
    fn from_bytes(dtype: WireDType, shape: &[usize], bytes: &[u8]) -> Result<Self, String> {
        let like = match dtype {
            WireDType::F32 => Tensor::zeros(shape, DType::F32, &Device::Cpu),
            WireDType::F64 => Tensor::zeros(shape, DType::F64, &Device::Cpu),
            other => return Err(format!("a model tensor cannot be of type {other}")),
        }
        .map_err(|e| e.to_string())?;
        let mut tensors = decode(bytes, std::slice::from_ref(&like))?;
        tensors
            .pop()
            .map(WireTensor)
            .ok_or_else(|| "no tensor in the payload".to_string())
    }
}

/// The ordered reduction as the stage's [`GradSync`].
struct SharedReduction(Mutex<Reduction>);

impl SharedReduction {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Reduction>, StageError> {
        self.0
            .lock()
            .map_err(|_| StageError::bug("the gradient reduction was poisoned"))
    }
}

impl GradSync for SharedReduction {
    fn add(&self, position: usize, microbatch: u32, grads: Vec<Tensor>) -> Result<(), StageError> {
        self.lock()?
            .add(position, microbatch, grads)
            .map_err(|e| StageError::failed(format!("the gradient reduction: {e}")))
    }
}

/// The reduction's messages through the world's mailbox.
struct MailboxCourier<'a>(&'a mut Mailbox);

impl Courier for MailboxCourier<'_> {
    fn post(&mut self, to: usize, tag: u16, bytes: Vec<u8>) -> Result<(), String> {
        self.0.post(to, tag, bytes).map_err(|e| e.to_string())
    }

    fn try_receive(&mut self, from: usize, tag: u16) -> Result<Option<Vec<u8>>, String> {
        self.0.try_receive(from, tag).map_err(|e| e.to_string())
    }
}

/// The pipeline's transport for tensors, advancing the gradient reduction before every group
/// and completing it at the end of the program; received tensors are moved to `device`.
struct StepTransport<'a> {
    inner: &'a mut MpiTransport,
    mailbox: &'a mut Mailbox,
    reduction: Option<&'a SharedReduction>,
    world_rank: usize,
    /// Where the reduction's processes sit in the world (for status lines).
    place: (WorldLayout, ExpertRank),
    device: &'a Device,
}

impl StepTransport<'_> {
    fn pump(&mut self) -> Result<bool, TransportFailure> {
        let Some(reduction) = self.reduction else {
            return Ok(true);
        };
        let mut reduction = reduction
            .lock()
            .map_err(|e| TransportFailure::Broken(e.to_string()))?;
        reduction
            .pump(&mut MailboxCourier(self.mailbox))
            .map_err(TransportFailure::Broken)?;
        Ok(reduction.done())
    }

    /// This rank's status line while it waits for the reduction.
    fn waiting_line(&self) -> String {
        let awaited = self
            .reduction
            .and_then(|r| r.lock().ok().and_then(|r| r.awaited()));
        let rank = self.world_rank;
        let (layout, expert) = self.place;
        match awaited {
            Some(a) => format!(
                "world rank {rank} waits at the end of its program for the {} of position {}'s \
                 gradients from world rank {}",
                if a.total { "sum" } else { "running sum" },
                a.position,
                layout.world_rank(a.from, expert)
            ),
            None => format!("world rank {rank} is at the end of its program"),
        }
    }
}

impl Transport<Tensor> for StepTransport<'_> {
    fn exchange(
        &mut self,
        sends: Vec<Outgoing<Tensor>>,
        receives: &[Incoming],
    ) -> Result<Vec<Tensor>, TransportFailure> {
        self.pump()?;
        let sends = sends
            .into_iter()
            .map(|o| Outgoing {
                to: o.to,
                message: o.message,
                payload: WireTensor(o.payload),
            })
            .collect();
        let received: Vec<WireTensor> = self.inner.exchange(sends, receives)?;
        received
            .into_iter()
            .map(|w| {
                w.0.to_device(self.device)
                    .map_err(|e| TransportFailure::Broken(e.to_string()))
            })
            .collect()
    }

    fn at_instruction(&mut self, index: usize) {
        <MpiTransport as Transport<WireTensor>>::at_instruction(self.inner, index);
    }

    fn finish(&mut self) -> Result<(), TransportFailure> {
        <MpiTransport as Transport<WireTensor>>::finish(self.inner)?;
        let timeout = self.inner.timeout();
        let mut last_progress = Instant::now();
        let mut awaited = None;
        while !self.pump()? {
            let now = self
                .reduction
                .and_then(|r| r.lock().ok().and_then(|r| r.awaited()));
            if now != awaited {
                awaited = now;
                last_progress = Instant::now();
            }
            let line = self.waiting_line();
            if last_progress.elapsed() > timeout {
                return Err(self.inner.stalled(&|| line.clone()));
            }
            self.inner.answer_requests(&|| line.clone());
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    fn abort(&mut self) {
        self.inner.abort_world(FAILURE_STATUS)
    }
}

/// MPI, started for a run of `expert_ranks` expert ranks per pipeline rank: at
/// `MPI_THREAD_MULTIPLE` where there are several (the two halves of an overlapped pair exchange
/// rows from two threads at once), else single-threaded. `None` where MPI cannot start (not
/// under `mpirun`, or started already); an error where it gives fewer threads than the run needs.
pub fn start(expert_ranks: u32) -> Result<Option<Universe>, TrainError> {
    if expert_ranks <= 1 {
        return Ok(rsmpi::initialize());
    }
    let Some((universe, level)) = rsmpi::initialize_with_threading(Threading::Multiple) else {
        return Ok(None);
    };
    if level != Threading::Multiple {
        return Err(TrainError::invalid(
            "expert ranks",
            expert_ranks,
            format!(
                "expert ranks over MPI need MPI_THREAD_MULTIPLE (an overlapped pair exchanges \
                 rows from two threads), and this MPI provides {level:?}"
            ),
        ));
    }
    Ok(Some(universe))
}

/// Where the processes of a run sit: world rank `(d·X + x)·P + r` is rank `r` of expert rank
/// `x` of replica `d` (the threads backend's numbering); the reduction among the processes of
/// one expert rank numbers them `d·P + r`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WorldLayout {
    /// Pipeline ranks `P`.
    ranks: usize,
    /// Expert ranks `X`.
    experts: usize,
}

impl WorldLayout {
    /// The replica, the expert rank and the pipeline rank of world rank `world`.
    fn place(self, world: usize) -> (u32, ExpertRank, RankId) {
        let pipeline = world / self.ranks;
        (
            (pipeline / self.experts) as u32,
            ExpertRank::new((pipeline % self.experts) as u32),
            RankId::new((world % self.ranks) as u32),
        )
    }

    /// The world rank of process `process` of expert rank `expert`'s reduction.
    fn world_rank(self, process: usize, expert: ExpertRank) -> usize {
        let (replica, rank) = (process / self.ranks, process % self.ranks);
        (replica * self.experts + expert.get() as usize) * self.ranks + rank
    }
}

/// The expert ranks of this process's group (`X > 1`): their communicator (gradients) and their
/// mailbox (the exchanges' rows).
struct ExpertGroup {
    comm: SimpleCommunicator,
    mailbox: Arc<SharedMailbox>,
}

/// One process per rank of every data-parallel replica and expert rank (see the module doc).
pub struct MpiCluster {
    world: SimpleCommunicator,
    pipeline: SimpleCommunicator,
    world_rank: usize,
    replica: u32,
    rank: RankId,
    expert: ExpertRank,
    layout: WorldLayout,
    /// Present with several expert ranks.
    group: Option<ExpertGroup>,
    /// This process's number in its expert rank's reduction.
    process: usize,
    timeout: Duration,
    problem: Problem,
    /// The training programs (this rank's agreed on by the pipeline).
    programs: CheckedPrograms,
    /// The forward-only programs (agreed on too).
    eval_programs: CheckedPrograms,
    transport: MpiTransport,
    /// The reduction's, among the processes of this expert rank.
    mailbox: Mailbox,
    owners: GradientOwners,
    deterministic: bool,
}

impl MpiCluster {
    /// This process's part of `replicas` copies of `plan`'s pipeline, each rank `expert_ranks`
    /// expert ranks, over `world` (collective: every process of `world` calls it with the same
    /// arguments). The world must have `replicas × P × expert_ranks` processes; with several
    /// expert ranks, MPI must run at `MPI_THREAD_MULTIPLE` ([`start`]).
    pub fn new(
        world: &SimpleCommunicator,
        plan: &Plan,
        config: &GptConfig,
        (replicas, expert_ranks): (u32, u32),
        deterministic: bool,
        timeout: Duration,
    ) -> Result<MpiCluster, TrainError> {
        let problem = plan.problem().clone();
        let p = problem.ranks();
        // MPI ranks and sizes are non-negative `int`s.
        let size = usize::try_from(world.size()).unwrap_or(0);
        let world_rank = usize::try_from(world.rank()).unwrap_or(0);
        let expected = p as usize * replicas as usize * expert_ranks as usize;
        if size != expected {
            return Err(TrainError::invalid(
                "MPI processes",
                size,
                format!(
                    "the run needs ranks x dp x expert ranks = {p} x {replicas} x {expert_ranks} \
                     = {expected} processes (mpirun -np {expected})"
                ),
            ));
        }
        let layout = WorldLayout {
            ranks: p as usize,
            experts: expert_ranks as usize,
        };
        let (replica, expert, _) = layout.place(world_rank);
        let split = |what: &str, color: usize, key: i32| {
            let color = Color::with_value(i32::try_from(color).unwrap_or(i32::MAX));
            world
                .split_by_color_with_key(color, key)
                .ok_or_else(|| TrainError::Mpi {
                    what: format!("MPI gave no {what} communicator"),
                })
        };
        // Collective: every process splits the world the same three ways, in the same order.
        let pipeline = split("pipeline", world_rank / layout.ranks, world.rank())?;
        let reducers = split("reduction", expert.get() as usize, world.rank())?;
        let group = split(
            "expert group",
            replica as usize * layout.ranks + world_rank % layout.ranks,
            expert.get() as i32,
        )?;
        let group = match expert_ranks {
            1 => None,
            _ => Some(ExpertGroup {
                mailbox: Arc::new(SharedMailbox::new(&group).map_err(|e| TrainError::Mpi {
                    what: format!("the expert ranks' mailbox: {e}"),
                })?),
                comm: group,
            }),
        };
        let programs = checked_programs(plan, false)?;
        let rank = agree_on_programs(&pipeline, &programs)?.rank();
        let eval_programs = checked_programs(plan, true)?;
        agree_on_programs(&pipeline, &eval_programs)?;
        let cut = ModelCut::new(config, &problem)?;
        Ok(MpiCluster {
            world: world.duplicate(),
            transport: MpiTransport::new(&pipeline, timeout),
            mailbox: Mailbox::new(&reducers),
            process: usize::try_from(reducers.rank()).unwrap_or(0),
            owners: GradientOwners::new(&problem, &cut, replicas),
            rank,
            pipeline,
            world_rank,
            replica,
            expert,
            layout,
            group,
            timeout,
            problem,
            programs,
            eval_programs,
            deterministic,
        })
    }

    /// Every pipeline's programs of `plan` (same problem), checked, then agreed on by the
    /// processes of this one's pipeline (collective: all of them call it at the same step with
    /// the same plan, as the trainer's per-step plans do: every process prices the same
    /// lengths).
    fn agree_on(&self, plan: &Plan) -> Result<CheckedPrograms, TrainError> {
        if plan.problem() != &self.problem {
            return Err(TrainError::invalid(
                "plan",
                "a new plan",
                "a step's plan must keep the run's problem (ranks, stages, microbatches, routes)",
            ));
        }
        let programs = checked_programs(plan, false)?;
        agree_on_programs(&self.pipeline, &programs)?;
        Ok(programs)
    }

    /// This process's rank in the world.
    pub fn world_rank(&self) -> usize {
        self.world_rank
    }

    /// The failure of this process, naming its replica when there are several.
    fn located(&self, error: TrainError) -> TrainError {
        if self.world.size() as usize == self.problem.ranks() as usize {
            return error;
        }
        TrainError::Replica {
            replica: self.replica,
            world_rank: self.world_rank,
            source: Box::new(error),
        }
    }

    /// Runs this rank's checked program (training or forward-only) with `stage` over the pipeline
    /// (and the reduction, when training), the tensors it receives moved to `device`.
    fn run(
        &mut self,
        forward_only: bool,
        stage: &mut GptStage,
        reduction: Option<&SharedReduction>,
        device: &Device,
    ) -> Result<(), TrainError> {
        let programs = if forward_only {
            &self.eval_programs
        } else {
            &self.programs
        };
        let program = programs.rank(self.rank).ok_or_else(|| {
            TrainError::invariant(format!(
                "the agreed programs have none for rank {}",
                self.rank
            ))
        })?;
        let mut transport = StepTransport {
            inner: &mut self.transport,
            mailbox: &mut self.mailbox,
            reduction,
            world_rank: self.world_rank,
            place: (self.layout, self.expert),
            device,
        };
        run_rank(program, stage, &mut transport).map_err(TrainError::from)
    }

    /// Every microbatch's loss, added in microbatch order: each process fills the slots of the
    /// losses it computed (where its losses count: `counted`), the sum over `comm` gives all of
    /// them exactly.
    fn fold_losses(
        comm: &SimpleCommunicator,
        stage: &GptStage,
        microbatches: usize,
        counted: bool,
    ) -> Result<f64, TrainError> {
        let mut values = vec![0.0f64; microbatches];
        let mut counts = vec![0u32; microbatches];
        for (&m, &loss) in stage.losses().iter().filter(|_| counted) {
            if let (Some(v), Some(c)) = (values.get_mut(m as usize), counts.get_mut(m as usize)) {
                *v = loss;
                *c += 1;
            }
        }
        let mut all_values = vec![0.0f64; microbatches];
        let mut all_counts = vec![0u32; microbatches];
        comm.all_reduce_into(&values[..], &mut all_values[..], SystemOperation::sum());
        comm.all_reduce_into(&counts[..], &mut all_counts[..], SystemOperation::sum());
        all_values
            .iter()
            .zip(&all_counts)
            .enumerate()
            .try_fold(0.0, |sum, (m, (loss, count))| match count {
                1 => Ok(sum + loss),
                n => Err(TrainError::invariant(format!(
                    "microbatch {m} has {n} losses in the world, not one"
                ))),
            })
    }
}

impl MpiCluster {
    /// This process's expert placement for a step of `model` and its exchange (`None` with one
    /// expert rank), the rows it receives moved to `device`.
    fn exchange(
        &self,
        model: &GptModel,
        device: &Device,
    ) -> Result<Option<(ExpertPlacement, Arc<MpiExchange>)>, TrainError> {
        if model.expert_ranks() as usize != self.layout.experts {
            return Err(TrainError::invariant(format!(
                "the model has {} expert ranks per pipeline rank, the MPI world {}",
                model.expert_ranks(),
                self.layout.experts
            )));
        }
        let (Some(parallel), Some(group)) = (model.expert_parallel(), &self.group) else {
            return Ok(None);
        };
        let at = (self.replica, self.rank, self.expert);
        let mailbox = Arc::clone(&group.mailbox);
        let exchange = Arc::new(MpiExchange::new(
            at,
            mailbox,
            device.clone(),
            (self.timeout, model.exchange_latency()),
        )?);
        let shared: Arc<dyn ExpertExchange> = exchange.clone();
        Ok(Some((parallel.placement(self.expert, shared)?, exchange)))
    }

    /// Position `k`'s gradients in its parameter order from this process's reduced sums `own`:
    /// themselves with one expert rank, else each parameter's from its owner in the group.
    fn whole_gradients(
        &self,
        model: &GptModel,
        k: usize,
        own: &[Tensor],
    ) -> Result<Vec<Tensor>, TrainError> {
        let (Some(parallel), Some(group)) = (model.expert_parallel(), &self.group) else {
            return Ok(own.to_vec());
        };
        let whole: Vec<Tensor> = model
            .models()
            .get(k)
            .ok_or_else(|| TrainError::invariant(format!("the model has no position {k}")))?
            .parameters()
            .into_iter()
            .map(|(_, t)| t)
            .collect();
        gather_gradients(parallel, &group.comm, (self.expert, k), own, &whole)
    }
}

/// The device a step's tensors live on: its batch's (where the loader put the tokens).
fn device_of(batch: &StepBatch) -> Result<Device, TrainError> {
    batch
        .input(0)
        .map(|tokens| tokens.device().clone())
        .ok_or_else(|| TrainError::invariant("a step without microbatches"))
}

/// `plan`'s programs (training or forward-only), projected and checked.
fn checked_programs(plan: &Plan, forward_only: bool) -> Result<CheckedPrograms, TrainError> {
    let options = ProjectionOptions {
        recv: TRAINER_RECEIVES,
        forward_only,
    };
    Ok(CheckedPrograms::of_plan(plan, None, options)?)
}

impl Cluster for MpiCluster {
    fn set_plan(&mut self, plan: &Plan) -> Result<(), TrainError> {
        self.programs = self.agree_on(plan).map_err(|e| self.located(e))?;
        Ok(())
    }

    fn step(
        &mut self,
        model: &GptModel,
        batch: &StepBatch,
        injection: Option<(RankId, Injection)>,
    ) -> Result<ClusterStep, TrainError> {
        let reduction = Arc::new(SharedReduction(Mutex::new(Reduction::new(
            &self.owners,
            self.process,
            self.deterministic,
        ))));
        let sync: Arc<dyn GradSync> = reduction.clone();
        let how = StageRun {
            epoch: Instant::now(),
            forward_only: false,
            injection: injection
                .filter(|(w, _)| w.index() == self.world_rank)
                .map(|(_, what)| (self.rank, what)),
            offset: self.replica * self.problem.sample_groups(),
        };
        let batch = Arc::new(batch.clone());
        let device = device_of(&batch)?;
        let exchange = self.exchange(model, &device)?;
        let placement = exchange.as_ref().map(|(placement, _)| placement);
        let program = &self.programs.programs().programs[self.rank.index()];
        let mut stage = model
            .rank_stage(&self.problem, self.rank, &batch, &sync, how)?
            .with_residency(program)
            .with_experts(placement)?
            .with_pairs(model.pairs());
        drop(sync);
        self.run(false, &mut stage, Some(&reduction), &device)
            .map_err(|e| self.located(e))?;
        if let Some((_, exchange)) = &exchange {
            exchange.finish().map_err(|e| self.located(e))?;
        }
        let chunks = self.problem.seq_chunks() as usize;
        let counted = self.expert.get() == 0;
        let loss = Self::fold_losses(&self.world, &stage, batch.microbatches() * chunks, counted)?
            / batch.normalizer();
        let measured = vec![stage.measured().to_vec()];
        let peak = stage.peak_activation_bytes() as u64;
        let host = stage.peak_host_bytes() as u64;
        drop(stage);
        let mut peaks = vec![0u64; self.world.size() as usize];
        self.world.all_gather_into(&peak, &mut peaks[..]);
        let mut host_peaks = vec![0u64; self.world.size() as usize];
        self.world.all_gather_into(&host, &mut host_peaks[..]);
        let reduction = Arc::try_unwrap(reduction)
            .map_err(|_| TrainError::invariant("the stage still holds the reduction"))?;
        let totals = reduction
            .0
            .into_inner()
            .map_err(|_| TrainError::invariant("the gradient reduction was poisoned"))?
            .into_totals()
            .map_err(|what| TrainError::Mpi { what })?;
        let gradients = (0..self.owners.positions())
            .map(|k| match totals.get(&k) {
                Some(own) => self.whole_gradients(model, k, own).map(Some),
                None => Ok(None),
            })
            .collect::<Result<Vec<_>, TrainError>>()
            .map_err(|e| self.located(e))?;
        Ok(ClusterStep {
            loss,
            gradients,
            measured,
            peak_activation_bytes: peaks.into_iter().map(|p| p as usize).collect(),
            peak_host_bytes: host_peaks.into_iter().map(|p| p as usize).collect(),
        })
    }

    fn evaluate(
        &mut self,
        model: &GptModel,
        batch: &StepBatch,
    ) -> Result<(f64, usize), TrainError> {
        let sync: Arc<dyn GradSync> = Arc::new(LocalGradients::new(0, false));
        let how = StageRun {
            epoch: Instant::now(),
            forward_only: true,
            injection: None,
            offset: 0,
        };
        let batch = Arc::new(batch.clone());
        let mut stage = model.rank_stage(&self.problem, self.rank, &batch, &sync, how)?;
        self.run(true, &mut stage, None, &device_of(&batch)?)
            .map_err(|e| self.located(e))?;
        let chunks = self.problem.seq_chunks() as usize;
        let loss = Self::fold_losses(&self.pipeline, &stage, batch.microbatches() * chunks, true)?;
        Ok((loss, batch.tokens()))
    }

    fn squared_norms(
        &mut self,
        gradients: &[Option<Vec<Tensor>>],
        parameters: &[usize],
    ) -> Result<Vec<f64>, TrainError> {
        let total: usize = parameters.iter().sum();
        let mut local = vec![0.0f64; total];
        let mut offset = 0;
        for (k, &count) in parameters.iter().enumerate() {
            // Every expert rank holds the same gradients: expert rank 0's count.
            let first_holder = self.owners.holders(k).first().copied();
            if first_holder == Some(self.process) && self.expert.get() == 0 {
                let grads = gradients.get(k).and_then(Option::as_ref).ok_or_else(|| {
                    TrainError::invariant(format!("position {k} has no gradient"))
                })?;
                for (slot, norm) in local[offset..offset + count]
                    .iter_mut()
                    .zip(squared_norms(grads)?)
                {
                    *slot = norm;
                }
            }
            offset += count;
        }
        let mut all = vec![0.0f64; total];
        self.world
            .all_reduce_into(&local[..], &mut all[..], SystemOperation::sum());
        Ok(all)
    }

    fn share(&mut self, position: usize, tensors: Vec<Tensor>) -> Result<Vec<Tensor>, TrainError> {
        let first = self.owners.holders(position).first().copied().unwrap_or(0);
        let root = self.layout.world_rank(first, ExpertRank::new(0));
        let mut bytes = encode(&tensors).map_err(|what| TrainError::Mpi { what })?;
        let root = self.world.process_at_rank(i32::try_from(root).unwrap_or(0));
        root.broadcast_into(&mut bytes[..]);
        decode(&bytes, &tensors).map_err(|what| TrainError::Mpi { what })
    }

    fn is_writer(&self) -> bool {
        self.world_rank == 0
    }

    fn abandon(&mut self) {
        self.world.abort(FAILURE_STATUS)
    }
}
