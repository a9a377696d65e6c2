//! The measured timeline of a rank's step: every task's start and end, in seconds since the
//! step began ([`MeasuredOp`]), what the trace of a step and a profile's calibration read.

use crate::host_link::Transferred;
use pipeweave_core::{Task, Work};
use std::time::Instant;

/// One task as it ran: which, and when (seconds since the step's start).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MeasuredOp {
    /// The task: a single op (F, I or W; a fused B or an overlapped F&B is recorded as its
    /// parts: an overlapped pair's halves each from its start to its end on its own thread,
    /// the other half's computes included), a recompute, an offload or a reload.
    pub task: Task,
    /// Where and for what.
    pub work: Work,
    /// Start, in seconds since the step began.
    pub start: f64,
    /// End, in seconds since the step began.
    pub end: f64,
}

/// The tasks of a step as they ran, timed from the step's start.
#[derive(Debug)]
pub(crate) struct Recorder {
    epoch: Instant,
    measured: Vec<MeasuredOp>,
}

impl Recorder {
    /// An empty record of the step that began at `epoch`.
    pub(crate) fn new(epoch: Instant) -> Recorder {
        Recorder {
            epoch,
            measured: Vec::new(),
        }
    }

    fn since_epoch(&self, t: Instant) -> f64 {
        t.duration_since(self.epoch).as_secs_f64()
    }

    /// Records `task`, started at `start`, ending now.
    pub(crate) fn record(&mut self, task: Task, start: Instant) {
        self.measured.push(MeasuredOp {
            task,
            work: task.work(),
            start: self.since_epoch(start),
            end: self.epoch.elapsed().as_secs_f64(),
        });
    }

    /// Records `task`, run from `start` to `end` (a half of an overlapped pair, timed on its
    /// own thread).
    pub(crate) fn record_between(&mut self, task: Task, start: Instant, end: Instant) {
        self.measured.push(MeasuredOp {
            task,
            work: task.work(),
            start: self.since_epoch(start),
            end: self.since_epoch(end),
        });
    }

    /// Makes `work`'s latest recorded forward end now (its loss belongs to it).
    pub(crate) fn extend_forward(&mut self, work: Work) {
        let now = self.epoch.elapsed().as_secs_f64();
        if let Some(op) = self
            .measured
            .iter_mut()
            .rev()
            .find(|op| op.task == Task::Forward(work))
        {
            op.end = now;
        }
    }

    /// Records the host link's transfers as they ran.
    pub(crate) fn transfers(&mut self, transfers: Vec<Transferred>) {
        for transfer in transfers {
            self.measured.push(MeasuredOp {
                task: transfer.task,
                work: transfer.task.work(),
                start: self.since_epoch(transfer.start),
                end: self.since_epoch(transfer.end),
            });
        }
    }

    /// Every task recorded, in the order recorded.
    pub(crate) fn measured(&self) -> &[MeasuredOp] {
        &self.measured
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_task_is_timed_from_the_steps_start_and_its_loss_extends_its_forward() {
        let epoch = Instant::now();
        let mut recorder = Recorder::new(epoch);
        let (first, second) = (Work::new(0, 0), Work::new(0, 1));
        recorder.record(Task::Forward(first), epoch);
        recorder.record(Task::Forward(second), Instant::now());
        let ended = recorder.measured()[0].end;
        std::thread::sleep(Duration::from_millis(2));
        recorder.extend_forward(first);
        let ops = recorder.measured();
        assert_eq!(ops[0].work, first);
        assert_eq!(ops[0].start, 0.0);
        assert!(ops[0].end >= ended + 0.002);
        assert!(ops[1].start <= ops[1].end && ops[1].end < ops[0].end);
    }

    #[test]
    fn transfers_are_recorded_as_they_ran() {
        let epoch = Instant::now();
        let mut recorder = Recorder::new(epoch);
        let work = Work::new(1, 2);
        let end = epoch + Duration::from_millis(5);
        recorder.transfers(vec![Transferred {
            task: Task::Offload(work),
            start: epoch,
            end,
        }]);
        let op = recorder.measured()[0];
        assert_eq!((op.task, op.work), (Task::Offload(work), work));
        assert_eq!((op.start, op.end), (0.0, 0.005));
    }
}
