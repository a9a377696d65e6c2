//! The interpreter of one rank's program, generic over the transport and the stage compute.
//!
//! It keeps the tensors in flight by (stage, microbatch): inputs of forwards (received or handed
//! over from a local stage), forward outputs waiting to be sent or to feed the loss, gradients
//! arriving for backwards, and input gradients waiting to be sent. `RankRun::dispatch` maps each
//! instruction to one call: computes to the [`StageCompute`], a communication group to one
//! [`Transport::exchange`] (every send and receive posted together, as the checker certifies),
//! markers to their hooks; the program ends with [`Transport::finish`]. Every call into the
//! stage or the transport goes through `RankRun::guarded`, so an error or a panic there becomes a
//! [`BackendError`] naming the rank and the instruction. A mixture of experts' all-to-all
//! instructions pass by: a compute runs its experts' exchanges inside its own calls.
//!
//! It runs only a [`CheckedRank`]: one rank's program of a [`pipeweave_core::CheckedPrograms`],
//! which only the checker makes, so no program reaches a backend unchecked. Before the first
//! instruction, [`check_capabilities`] refuses a program with residency instructions the compute
//! does not declare ([`BackendError::Unsupported`]).

use crate::compute::StageCompute;
use crate::error::BackendError;
use crate::stage_error::StageError;
use crate::transport::{Incoming, Outgoing, Transport, TransportFailure};
use pipeweave_core::ir::problem::Route;
pub use pipeweave_core::spmd::checked::CheckedRank;
use pipeweave_core::{
    CommGroup, CommOp, Direction, Instr, Problem, RankId, RankProgram, StageId, Task, Work,
};
use std::collections::{HashMap, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Which side of the interpreter a call goes to, for error reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    /// The [`StageCompute`].
    Stage,
    /// The [`Transport`].
    Transport,
}

impl Component {
    /// The name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Component::Stage => "stage",
            Component::Transport => "transport",
        }
    }
}

/// Why one call failed, before the rank and instruction are added.
enum Fault {
    /// The stage returned an error.
    Stage(StageError),
    /// The transport returned a failure.
    Transport(TransportFailure),
    /// A tensor the program needs is not there.
    Missing(String),
}

/// The tensors in flight on one rank.
struct Tensors<T> {
    inputs: HashMap<Work, T>,
    outputs: HashMap<Work, T>,
    grads: HashMap<Work, T>,
    grad_inputs: HashMap<Work, T>,
}

impl<T> Tensors<T> {
    fn new() -> Tensors<T> {
        Tensors {
            inputs: HashMap::new(),
            outputs: HashMap::new(),
            grads: HashMap::new(),
            grad_inputs: HashMap::new(),
        }
    }
}

fn take<T>(map: &mut HashMap<Work, T>, work: Work, what: &str) -> Result<T, Fault> {
    map.remove(&work).ok_or_else(|| {
        Fault::Missing(format!(
            "no {what} for stage {} microbatch {}",
            work.stage, work.microbatch
        ))
    })
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// One rank's run of its checked program (made by [`run_rank`] only, after
/// [`check_capabilities`]).
pub struct RankRun<'a, C: StageCompute, T> {
    program: &'a RankProgram,
    problem: &'a Problem,
    compute: &'a mut C,
    transport: &'a mut T,
    tensors: Tensors<C::Tensor>,
    /// The pairs whose input-gradient backward ran: a `Drop` of one of them drops what its W
    /// keeps (the plan rebuilds it with an `RW`), not its forward's saved state.
    input_grads_ran: HashSet<Work>,
}

/// Refuses `program` when it has a residency instruction (drop, recompute, offload, reload) that
/// `compute` does not declare in [`StageCompute::capabilities`]: the error names the rank, the
/// capability and the first instruction needing it. Calls nothing of the compute but
/// `capabilities`.
pub fn check_capabilities<C: StageCompute + ?Sized>(
    program: CheckedRank<'_>,
    compute: &C,
) -> Result<(), BackendError> {
    let instrs = &program.program().instrs;
    match compute.capabilities().first_unsupported(instrs) {
        None => Ok(()),
        Some((instr, capability)) => Err(BackendError::Unsupported {
            rank: program.rank(),
            instr,
            what: instrs[instr].to_string(),
            capability,
        }),
    }
}

/// Runs `program` (a rank of a checked program set, with its problem) to its end, after
/// [`check_capabilities`] (a refusal runs nothing).
///
/// Only a checked program runs: a plain [`RankProgram`] is not a [`CheckedRank`], so this does
/// not compile:
///
/// ```compile_fail,E0308
/// use pipeweave_backends::interpreter::run_rank;
/// use pipeweave_backends::numeric::AffineModel;
/// use pipeweave_backends::threads::channel_transports;
/// use pipeweave_core::{Problem, RankProgram};
///
/// fn unchecked(problem: &Problem, program: &RankProgram) {
///     let mut stage = AffineModel::new(problem).stage(|_| std::time::Duration::ZERO);
///     let mut transport = channel_transports::<f64>(1, std::time::Duration::from_secs(1))
///         .pop()
///         .unwrap();
///     let _ = run_rank(program, &mut stage, &mut transport);
/// }
/// ```
///
/// while a program of a [`pipeweave_core::CheckedPrograms`] does:
///
/// ```
/// use pipeweave_backends::interpreter::run_rank;
/// use pipeweave_backends::numeric::AffineModel;
/// use pipeweave_backends::threads::channel_transports;
/// use pipeweave_core::CheckedPrograms;
///
/// fn checked(programs: &CheckedPrograms) {
///     let problem = programs.problem();
///     let mut transports =
///         channel_transports::<f64>(problem.ranks() as usize, std::time::Duration::from_secs(1));
///     let rank = programs.ranks().next().unwrap();
///     let mut stage = AffineModel::new(problem).stage(|_| std::time::Duration::ZERO);
///     let _ = run_rank(rank, &mut stage, &mut transports[0]);
/// }
/// ```
pub fn run_rank<C, T>(
    program: CheckedRank<'_>,
    compute: &mut C,
    transport: &mut T,
) -> Result<(), BackendError>
where
    C: StageCompute,
    T: Transport<C::Tensor>,
{
    check_capabilities(program, compute)?;
    RankRun {
        program: program.program(),
        problem: program.problem(),
        compute,
        transport,
        tensors: Tensors::new(),
        input_grads_ran: HashSet::new(),
    }
    .run()
}

impl<C, T> RankRun<'_, C, T>
where
    C: StageCompute,
    T: Transport<C::Tensor>,
{
    fn rank(&self) -> RankId {
        self.program.rank
    }

    /// Every instruction in order, then the completion of the sends still in flight.
    fn run(mut self) -> Result<(), BackendError> {
        let program = self.program;
        for (index, instr) in program.instrs.iter().enumerate() {
            self.transport.at_instruction(index);
            self.guarded(index, Component::Stage, |run| run.dispatch(instr))?;
        }
        let end = program.instrs.len();
        self.transport.at_instruction(end);
        self.guarded(end, Component::Transport, |run| {
            run.transport.finish().map_err(Fault::Transport)
        })
    }

    /// Runs `call`, turning its fault or its panic into an error naming the rank and the
    /// instruction `index` (the end of the program when it is past the last instruction).
    fn guarded(
        &mut self,
        index: usize,
        component: Component,
        call: impl FnOnce(&mut Self) -> Result<(), Fault>,
    ) -> Result<(), BackendError> {
        let rank = self.rank();
        let what = self
            .program
            .instrs
            .get(index)
            .map_or_else(|| "end of program".to_string(), Instr::to_string);
        match catch_unwind(AssertUnwindSafe(|| call(self))) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(fault)) => Err(fault_error(rank, index, what, fault)),
            Err(payload) => Err(BackendError::Panicked {
                rank,
                instr: index,
                what,
                component: component.name(),
                reason: panic_message(payload),
            }),
        }
    }

    /// One instruction.
    fn dispatch(&mut self, instr: &Instr) -> Result<(), Fault> {
        match instr {
            Instr::Compute(task) => self.compute_task(task),
            Instr::Loss(work) => {
                let output = take(&mut self.tensors.outputs, *work, "forward output")?;
                let grad = self.compute.loss(*work, output).map_err(Fault::Stage)?;
                self.tensors.grads.insert(*work, grad);
                Ok(())
            }
            Instr::Comm(group) => self.exchange(group),
            Instr::FreeOutput(work) => {
                self.compute.free_output(*work);
                Ok(())
            }
            Instr::GradSync(stage) => self.compute.grad_sync(*stage).map_err(Fault::Stage),
            Instr::FlushWeightGrads => self.compute.flush().map_err(Fault::Stage),
            // Sends complete by `finish` at the latest; waiting for one earlier is never needed
            // for progress (the checker certified the stricter order).
            Instr::WaitSend { .. } => Ok(()),
            // PyTorch's parameter actions: every stage of ours keeps its whole parameters, and
            // its gradients are reduced at `GradSync` and `FlushWeightGrads`, which ours call.
            Instr::Params { .. } => Ok(()),
            Instr::Drop(work) if self.input_grads_ran.contains(work) => {
                self.compute.drop_weight_grad(*work).map_err(Fault::Stage)
            }
            Instr::Drop(work) => self.compute.drop_activations(*work).map_err(Fault::Stage),
            Instr::Offload(work) => self.compute.offload(*work).map_err(Fault::Stage),
            Instr::Reload(work) => self.compute.reload(*work).map_err(Fault::Stage),
            // A mixture of experts' all-to-alls among the expert ranks of this pipeline rank:
            // the computes of today run their experts' exchanges inside their forward and
            // backward calls (the trainer's expert-parallel MoE), or have no experts, so the
            // program's statement of them needs nothing more here.
            Instr::IssueAllToAll(_) | Instr::WaitAllToAll(_) => Ok(()),
        }
    }

    /// A communication group: the payloads of its sends out, its receives in, in one exchange.
    fn exchange(&mut self, group: &CommGroup) -> Result<(), Fault> {
        let mut sends = Vec::new();
        let mut receives = Vec::new();
        for op in &group.ops {
            match *op {
                CommOp::Send { to, message } => {
                    let store = match message.direction {
                        Direction::Activation => &mut self.tensors.outputs,
                        Direction::Gradient => &mut self.tensors.grad_inputs,
                    };
                    let payload = store.remove(&message.source()).ok_or_else(|| {
                        Fault::Missing(format!("nothing computed to send as {message}"))
                    })?;
                    sends.push(Outgoing {
                        to,
                        message,
                        payload,
                    });
                }
                CommOp::Recv { from, message } => receives.push(Incoming { from, message }),
            }
        }
        let received = self
            .transport
            .exchange(sends, &receives)
            .map_err(Fault::Transport)?;
        if received.len() != receives.len() {
            return Err(Fault::Transport(TransportFailure::Broken(format!(
                "the transport returned {} payloads for {} receives",
                received.len(),
                receives.len()
            ))));
        }
        for (incoming, payload) in receives.iter().zip(received) {
            let store = match incoming.message.direction {
                Direction::Activation => &mut self.tensors.inputs,
                Direction::Gradient => &mut self.tensors.grads,
            };
            store.insert(incoming.message.consumer(), payload);
        }
        Ok(())
    }

    fn compute_task(&mut self, task: &Task) -> Result<(), Fault> {
        match *task {
            Task::Forward(w) => {
                let input = self.forward_input(w)?;
                let output = self.compute.forward(w, input).map_err(Fault::Stage)?;
                self.place_output(w, output);
            }
            Task::InputGrad(w) => {
                let grad = take(&mut self.tensors.grads, w, "output gradient")?;
                let grad_input = self.compute.backward_input(w, grad).map_err(Fault::Stage)?;
                self.place_grad_input(w, grad_input);
                self.input_grads_ran.insert(w);
            }
            Task::WeightGrad(w) => self.compute.backward_weight(w).map_err(Fault::Stage)?,
            Task::Backward(w) => {
                let grad = take(&mut self.tensors.grads, w, "output gradient")?;
                let grad_input = self.compute.backward(w, grad).map_err(Fault::Stage)?;
                self.place_grad_input(w, grad_input);
            }
            Task::Overlapped { forward, backward } => {
                let input = self.forward_input(forward)?;
                let grad = take(&mut self.tensors.grads, backward, "output gradient")?;
                let (output, grad_input) = self
                    .compute
                    .forward_backward(forward, input, backward, grad)
                    .map_err(Fault::Stage)?;
                self.place_output(forward, output);
                self.place_grad_input(backward, grad_input);
            }
            Task::Recompute(w) => self.compute.recompute(w).map_err(Fault::Stage)?,
            Task::RecomputeWeightGrad(w) => self
                .compute
                .recompute_weight_grad(w)
                .map_err(Fault::Stage)?,
            // Transfers are instructions of their own in programs (`Instr::Offload`,
            // `Instr::Reload`); a compute naming one is run as that instruction.
            Task::Offload(w) => self.compute.offload(w).map_err(Fault::Stage)?,
            Task::Reload(w) => self.compute.reload(w).map_err(Fault::Stage)?,
        }
        Ok(())
    }

    /// The input of a forward: None on the first stage of its route (the stage loads the
    /// microbatch itself), else what was received or handed over.
    fn forward_input(&mut self, work: Work) -> Result<Option<C::Tensor>, Fault> {
        if self.neighbour(work, Route::prev).is_none() {
            Ok(None)
        } else {
            take(&mut self.tensors.inputs, work, "forward input").map(Some)
        }
    }

    /// `work`'s microbatch on the stage that `step` ([`Route::next`] or [`Route::prev`]) gives
    /// after `work`'s stage on its route, and whether this rank holds that stage; None at that
    /// end of the route.
    fn neighbour(
        &self,
        work: Work,
        step: fn(&Route, StageId) -> Option<StageId>,
    ) -> Option<(Work, bool)> {
        let stage = self
            .problem
            .route_of(work.microbatch)
            .and_then(|r| step(r, work.stage))?;
        let here = self.problem.rank_of(stage) == Some(self.rank());
        let neighbour = Work {
            stage,
            microbatch: work.microbatch,
        };
        Some((neighbour, here))
    }

    /// Where a forward output goes: a local next stage, or the loss or a send.
    fn place_output(&mut self, work: Work, output: C::Tensor) {
        let (store, key) = match self.neighbour(work, Route::next) {
            Some((next, true)) => (&mut self.tensors.inputs, next),
            _ => (&mut self.tensors.outputs, work),
        };
        store.insert(key, output);
    }

    /// Where an input gradient goes: nowhere (first stage), a local previous stage, or a send.
    fn place_grad_input(&mut self, work: Work, grad: Option<C::Tensor>) {
        let Some(grad) = grad else { return };
        let (store, key) = match self.neighbour(work, Route::prev) {
            Some((prev, true)) => (&mut self.tensors.grads, prev),
            Some((_, false)) => (&mut self.tensors.grad_inputs, work),
            None => return,
        };
        store.insert(key, grad);
    }
}

/// The error of a fault at instruction `instr` of `rank`.
fn fault_error(rank: RankId, instr: usize, what: String, fault: Fault) -> BackendError {
    match fault {
        Fault::Stage(source) => BackendError::Stage {
            rank,
            instr,
            what,
            source,
        },
        Fault::Missing(reason) => BackendError::Program {
            rank,
            instr,
            what,
            reason,
        },
        Fault::Transport(TransportFailure::Aborted { failed }) => BackendError::Aborted {
            rank,
            instr,
            failed,
            waiting: None,
        },
        Fault::Transport(TransportFailure::AbortedWhileWaiting {
            failed,
            from,
            message,
        }) => BackendError::Aborted {
            rank,
            instr,
            failed,
            waiting: Some((from, message)),
        },
        Fault::Transport(TransportFailure::Unexpected {
            from,
            expected,
            got,
        }) => BackendError::Protocol {
            rank,
            instr,
            from,
            expected,
            got,
        },
        Fault::Transport(TransportFailure::Timeout {
            from,
            message,
            seconds,
        }) => BackendError::Timeout {
            rank,
            instr,
            from,
            message,
            seconds,
        },
        Fault::Transport(TransportFailure::Stalled { seconds, report }) => {
            BackendError::Stalled { seconds, report }
        }
        Fault::Transport(TransportFailure::Broken(reason)) => BackendError::Transport {
            rank,
            instr,
            reason,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::{Capabilities, Capability};
    use pipeweave_core::testing::{placed, plan_on};
    use pipeweave_core::{CheckedPrograms, ProjectionOptions, StageCosts, StageId, StageMemory};

    /// A one-rank, two-stage plan of `order` whose programs need no transport, checked.
    fn local_programs(order: &[&str]) -> CheckedPrograms {
        let problem = placed(1, vec![0, 0]);
        let plan = plan_on(
            problem,
            StageCosts::default(),
            StageMemory::default(),
            &[&order.join(" ")],
        );
        CheckedPrograms::of_plan(&plan, None, ProjectionOptions::default()).unwrap()
    }

    fn local_program() -> CheckedPrograms {
        local_programs(&["0F0", "1F0", "1B0", "0B0"])
    }

    /// A stage that counts calls and can fail or panic in one hook.
    #[derive(Default)]
    struct Counting {
        calls: Vec<String>,
        panic_in: Option<&'static str>,
        capabilities: Capabilities,
    }

    impl Counting {
        fn hook(&mut self, name: &str) {
            self.calls.push(name.to_string());
            if self.panic_in == Some(name) {
                panic!("{name} broke");
            }
        }
    }

    /// Methods of [`StageCompute`] on a `Work` that [`Counting`] only records (and fails in when
    /// told), each with the name its hook records.
    macro_rules! only_hooks {
        ($($method:ident => $name:literal),+ $(,)?) => {$(
            fn $method(&mut self, _: Work) -> Result<(), StageError> {
                self.hook($name);
                Ok(())
            }
        )+};
    }

    impl StageCompute for Counting {
        type Tensor = f64;
        fn forward(&mut self, _: Work, input: Option<f64>) -> Result<f64, StageError> {
            self.hook("forward");
            Ok(input.unwrap_or(1.0) * 2.0)
        }
        fn loss(&mut self, _: Work, output: f64) -> Result<f64, StageError> {
            self.hook("loss");
            Ok(output)
        }
        fn backward_input(&mut self, _: Work, grad: f64) -> Result<Option<f64>, StageError> {
            self.hook("backward_input");
            Ok(Some(grad))
        }
        only_hooks!(
            backward_weight => "backward_weight",
            drop_activations => "drop",
            recompute => "recompute",
            offload => "offload",
            reload => "reload",
        );
        fn free_output(&mut self, _: Work) {
            self.hook("free_output");
        }
        fn grad_sync(&mut self, _: StageId) -> Result<(), StageError> {
            self.hook("grad_sync");
            Ok(())
        }
        fn flush(&mut self) -> Result<(), StageError> {
            self.hook("flush");
            Ok(())
        }
        fn capabilities(&self) -> Capabilities {
            self.capabilities
        }
    }

    /// A transport for programs that never communicate: any call is a bug.
    struct Silent;
    impl Transport<f64> for Silent {
        fn exchange(
            &mut self,
            _: Vec<Outgoing<f64>>,
            _: &[Incoming],
        ) -> Result<Vec<f64>, TransportFailure> {
            Err(TransportFailure::Broken("no peers".to_string()))
        }
        fn finish(&mut self) -> Result<(), TransportFailure> {
            panic!("finish broke")
        }
        fn abort(&mut self) {}
    }

    #[test]
    fn every_instruction_reaches_its_hook_and_a_transport_panic_names_the_end() {
        let programs = local_program();
        let mut stage = Counting::default();
        let rank = programs.ranks().next().unwrap();
        let err = run_rank(rank, &mut stage, &mut Silent).unwrap_err();
        assert_eq!(stage.calls.iter().filter(|c| *c == "forward").count(), 2);
        assert!(stage.calls.contains(&"grad_sync".to_string()));
        assert_eq!(stage.calls.last().unwrap(), "flush");
        match err {
            BackendError::Panicked {
                component, what, ..
            } => {
                assert_eq!(component, "transport");
                assert_eq!(what, "end of program");
            }
            other => panic!("expected a transport panic, got {other}"),
        }
    }

    #[test]
    fn a_panic_in_any_hook_names_the_rank_and_instruction() {
        let programs = local_program();
        let rank = programs.ranks().next().unwrap();
        for hook in [
            "forward",
            "loss",
            "backward_input",
            "backward_weight",
            "grad_sync",
            "flush",
        ] {
            let mut stage = Counting {
                panic_in: Some(hook),
                ..Counting::default()
            };
            let err = run_rank(rank, &mut stage, &mut Silent).unwrap_err();
            let text = err.to_string();
            assert!(text.starts_with("rank 0, instruction "), "{hook}: {text}");
            assert!(text.contains(&format!("{hook} broke")), "{hook}: {text}");
            assert!(text.contains("the stage panicked"), "{hook}: {text}");
        }
    }

    #[test]
    fn a_program_needing_a_capability_the_compute_lacks_runs_nothing() {
        let offloading = local_programs(&["0F0", "1F0", "0OFFLOAD0", "1B0", "0RELOAD0", "0B0"]);
        let recomputing = local_programs(&["0F0", "1F0", "1B0", "0R0", "0B0"]);
        for (programs, capability, what) in [
            (&offloading, Capability::Offload, "offload"),
            (&recomputing, Capability::Recompute, "drop"),
        ] {
            let rank = programs.ranks().next().unwrap();
            let supported = match capability {
                Capability::Offload => Capabilities {
                    recompute: true,
                    offload: false,
                },
                Capability::Recompute => Capabilities {
                    recompute: false,
                    offload: true,
                },
            };
            for capabilities in [Capabilities::NONE, supported] {
                let mut stage = Counting {
                    capabilities,
                    ..Counting::default()
                };
                let err = run_rank(rank, &mut stage, &mut Silent).unwrap_err();
                assert!(stage.calls.is_empty(), "{:?}", stage.calls);
                match &err {
                    BackendError::Unsupported {
                        rank,
                        instr,
                        what: instruction,
                        capability: refused,
                    } => {
                        assert_eq!(rank.get(), 0);
                        assert_eq!(*refused, capability);
                        assert!(instruction.starts_with(what), "{instruction}");
                        assert_eq!(
                            Capability::needed_by(&programs.programs().programs[0].instrs[*instr]),
                            Some(capability)
                        );
                    }
                    other => panic!("expected a refusal, got {other}"),
                }
                assert_eq!(err.kind(), pipeweave_core::FailureKind::BadInput);
                let text = err.to_string();
                assert!(text.starts_with("rank 0, instruction "), "{text}");
                assert!(text.contains("does not support"), "{text}");
            }
            // Declared, the capability's hooks run (and the silent transport fails at the end).
            let mut stage = Counting {
                capabilities: Capabilities::ALL,
                ..Counting::default()
            };
            let err = run_rank(rank, &mut stage, &mut Silent).unwrap_err();
            assert!(matches!(err, BackendError::Panicked { .. }), "{err}");
            assert!(stage.calls.iter().any(|c| c == what), "{:?}", stage.calls);
        }
    }
}
