//! A rank's host link: a worker thread that copies offloaded states to host memory and back
//! beside the rank's computes, one transfer at a time in the order the rank issues them (the
//! simulator's link, [`pipeweave_core::analysis::replay`]).
//!
//! The rank hands a state over ([`HostLink::offload`]) and goes on computing; the worker copies
//! it into its host store ([`StageSaved::to_host`], releasing the device tensors) and reports
//! when it is done. A reload ([`HostLink::reload`]) queues behind the offloads before it and
//! brings the state back; the backward that needs it waits for it ([`HostLink::take`]). What
//! allocates device memory after an offload's place in the order waits for the offloads issued
//! whose place has come ([`HostLink::settle`]), so the device copies they free are free by then, as the plan
//! counts. The worker starts with the first transfer (most ranks never offload) and ends when the
//! link is dropped.

use crate::error::kernel_fault;
use pipeweave_backends::StageError;
use pipeweave_core::{Task, Work};
use pipeweave_kernels::{HostPending, HostSaved, KernelError, StagePendingWeightGrad, StageSaved};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Instant;

/// A state on the device that a transfer moves: a forward's saved state, or what an
/// input-gradient backward keeps for the weight gradient.
pub(crate) enum DeviceState {
    /// A forward's saved state (offloaded between the forward and the I).
    Saved(StageSaved),
    /// What the I keeps for the W (offloaded between the I and the W).
    Pending(StagePendingWeightGrad),
}

/// A state in the worker's host store.
enum HostState {
    Saved(HostSaved),
    Pending(HostPending),
}

impl HostState {
    fn bytes(&self) -> usize {
        match self {
            HostState::Saved(s) => s.bytes(),
            HostState::Pending(p) => p.bytes(),
        }
    }
}

/// What the worker is asked to do.
enum Job {
    Out(Work, DeviceState),
    In(Work),
}

/// A transfer the worker finished: which, when, its outcome (a reload's state) and the bytes in
/// the host store after it.
struct Done {
    task: Task,
    start: Instant,
    end: Instant,
    outcome: Result<Option<DeviceState>, KernelError>,
    host_bytes: usize,
}

/// One transfer as it ran on the link.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transferred {
    /// The offload or reload.
    pub task: Task,
    /// When the copy started.
    pub start: Instant,
    /// When it ended.
    pub end: Instant,
}

/// The worker's side of a link: its host store, jobs in, reports out.
fn run_worker(jobs: Receiver<Job>, done: Sender<Done>) {
    let mut store: HashMap<Work, HostState> = HashMap::new();
    let mut host_bytes = 0usize;
    for job in jobs {
        let start = Instant::now();
        let (task, outcome) = match job {
            Job::Out(work, state) => {
                let copied = match state {
                    DeviceState::Saved(s) => s.to_host().map(HostState::Saved),
                    DeviceState::Pending(p) => p.to_host().map(HostState::Pending),
                };
                let outcome = copied.map(|c| {
                    host_bytes += c.bytes();
                    store.insert(work, c);
                    None
                });
                (Task::Offload(work), outcome)
            }
            Job::In(work) => {
                let outcome = match store.remove(&work) {
                    Some(c) => {
                        host_bytes -= c.bytes();
                        match c {
                            HostState::Saved(s) => s.to_device().map(DeviceState::Saved),
                            HostState::Pending(p) => p.to_device().map(DeviceState::Pending),
                        }
                        .map(Some)
                    }
                    None => Err(KernelError::InvalidArgument {
                        field: "reload",
                        value: format!("stage {} microbatch {}", work.stage, work.microbatch),
                        reason: "nothing of it is in the host store",
                    }),
                };
                (Task::Reload(work), outcome)
            }
        };
        let report = Done {
            task,
            start,
            end: Instant::now(),
            outcome,
            host_bytes,
        };
        if done.send(report).is_err() {
            return; // the rank is gone
        }
    }
}

/// The rank's side of its host link.
#[derive(Default)]
pub(crate) struct HostLink {
    /// Jobs to the worker and its reports, once started.
    channels: Option<(Sender<Job>, Receiver<Done>)>,
    worker: Option<JoinHandle<()>>,
    /// Offloads issued and not reported done, in issue order.
    offloading: VecDeque<Work>,
    /// Offloads reported done, not yet collected by [`HostLink::finished`].
    offloaded: HashSet<Work>,
    /// Reloads issued and not reported done.
    reloading: HashSet<Work>,
    /// Reloaded states not yet taken by their backward.
    arrived: HashMap<Work, DeviceState>,
    /// Pairs whose state is in (or on its way to) the host store.
    on_host: HashSet<Work>,
    transfers: Vec<Transferred>,
    host_bytes: usize,
    host_peak_bytes: usize,
}

impl HostLink {
    fn send(&mut self, job: Job) -> Result<(), StageError> {
        if self.channels.is_none() {
            let (jobs, jobs_in) = channel();
            let (done_out, done) = channel();
            let worker = std::thread::Builder::new()
                .name("pipeweave-host-link".into())
                .spawn(move || run_worker(jobs_in, done_out))
                .map_err(|e| StageError::failed(format!("cannot start the host link: {e}")))?;
            self.worker = Some(worker);
            self.channels = Some((jobs, done));
        }
        let (jobs, _) = self.channels.as_ref().expect("started just above");
        jobs.send(job)
            .map_err(|_| StageError::failed("the host link's worker stopped"))
    }

    /// Starts copying `state` of `work` to the host store.
    pub(crate) fn offload(&mut self, work: Work, state: DeviceState) -> Result<(), StageError> {
        self.send(Job::Out(work, state))?;
        self.offloading.push_back(work);
        self.on_host.insert(work);
        Ok(())
    }

    /// Starts copying `work`'s state back from the host store, after the transfers before it.
    pub(crate) fn reload(&mut self, work: Work) -> Result<(), StageError> {
        if !self.on_host.remove(&work) {
            return Err(StageError::bug(format!(
                "reload of stage {} microbatch {}: nothing of it was offloaded",
                work.stage, work.microbatch
            )));
        }
        self.send(Job::In(work))?;
        self.reloading.insert(work);
        Ok(())
    }

    /// Whether `work`'s state is in (or on its way to) the host store.
    pub(crate) fn holds(&self, work: Work) -> bool {
        self.on_host.contains(&work)
    }

    /// Files the worker's next report, waiting for it when `wait` (false: none ready).
    fn receive(&mut self, wait: bool) -> Result<bool, StageError> {
        let Some((_, done)) = &self.channels else {
            return Ok(false);
        };
        let report = if wait {
            done.recv().ok()
        } else {
            match done.try_recv() {
                Ok(report) => Some(report),
                Err(TryRecvError::Empty) => return Ok(false),
                Err(TryRecvError::Disconnected) => None,
            }
        };
        let Some(report) = report else {
            return Err(StageError::failed(
                "the host link's worker stopped before its transfers ended",
            ));
        };
        self.host_bytes = report.host_bytes;
        self.host_peak_bytes = self.host_peak_bytes.max(report.host_bytes);
        self.transfers.push(Transferred {
            task: report.task,
            start: report.start,
            end: report.end,
        });
        let state = report.outcome.map_err(|e| {
            StageError::caused_by(
                kernel_fault(&e),
                format!("{} on the host link", report.task),
                e,
            )
        })?;
        let work = report.task.work();
        match report.task {
            Task::Offload(_) => {
                self.offloading.retain(|w| *w != work);
                self.offloaded.insert(work);
            }
            _ => {
                self.reloading.remove(&work);
                if let Some(state) = state {
                    self.arrived.insert(work, state);
                }
            }
        }
        Ok(true)
    }

    /// Waits until no offload that `wait_for` names is on its way.
    pub(crate) fn settle(&mut self, wait_for: impl Fn(&Work) -> bool) -> Result<(), StageError> {
        while self.offloading.iter().any(&wait_for) {
            self.receive(true)?;
        }
        Ok(())
    }

    /// Files the reports ready, without waiting.
    pub(crate) fn poll(&mut self) -> Result<(), StageError> {
        while self.receive(false)? {}
        Ok(())
    }

    /// Whether `work`'s offload ended (once: its device copy is then the caller's to free).
    pub(crate) fn finished(&mut self, work: Work) -> bool {
        self.offloaded.remove(&work)
    }

    /// `work`'s reloaded state, waiting for its reload to end (None: no reload of it was issued).
    pub(crate) fn take(&mut self, work: Work) -> Result<Option<DeviceState>, StageError> {
        while self.reloading.contains(&work) {
            self.receive(true)?;
        }
        Ok(self.arrived.remove(&work))
    }

    /// Waits for every transfer issued; the transfers since the last call, as they ran.
    pub(crate) fn finish(&mut self) -> Result<Vec<Transferred>, StageError> {
        while !self.offloading.is_empty() || !self.reloading.is_empty() {
            self.receive(true)?;
        }
        Ok(std::mem::take(&mut self.transfers))
    }

    /// The most bytes in the host store at once.
    pub(crate) fn host_peak_bytes(&self) -> usize {
        self.host_peak_bytes
    }
}

impl Drop for HostLink {
    fn drop(&mut self) {
        self.channels = None; // the worker's job queue ends
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_link_starts_no_worker_and_refuses_a_reload_of_nothing() {
        let mut link = HostLink::default();
        let work = Work::new(1, 3);
        // Nothing issued: settling, polling and finishing return at once, no thread started.
        link.settle(|_| true).unwrap();
        link.poll().unwrap();
        assert!(link.finish().unwrap().is_empty());
        assert!(link.worker.is_none());
        assert!(!link.holds(work) && !link.finished(work));
        let err = link.reload(work).unwrap_err();
        assert_eq!(err.kind(), pipeweave_core::FailureKind::Bug);
        assert!(
            err.to_string()
                .contains("reload of stage 1 microbatch 3: nothing of it was offloaded"),
            "{err}"
        );
        assert!(link.take(work).unwrap().is_none());
    }
}
