//! The interpreter of one rank's program, generic over the transport and the stage compute.
//!
//! It keeps the tensors in flight by (stage, microbatch): inputs of forwards (received or handed
//! over from a local stage), forward outputs waiting to be sent or to feed the loss, gradients
//! arriving for backwards, and input gradients waiting to be sent. Each instruction maps to one
//! call: computes to the [`StageCompute`], sends and receives to the [`Transport`] (a group's sends
//! go first, then its receives; transports buffer sends), markers to their hooks. A panic inside the
//! stage is caught and reported like an error, naming the rank and the instruction.

use crate::compute::StageCompute;
use crate::error::BackendError;
use crate::transport::{Transport, TransportFailure};
use pipeweave_core::{CommOp, Direction, Instr, Problem, RankProgram, Task, Work};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

struct Tensors<T> {
    inputs: HashMap<Work, T>,
    outputs: HashMap<Work, T>,
    grads: HashMap<Work, T>,
    grad_inputs: HashMap<Work, T>,
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

/// Runs `program` (a rank of a checked program set of `problem`) to its end.
pub fn run_rank<C, T>(
    program: &RankProgram,
    problem: &Problem,
    compute: &mut C,
    transport: &mut T,
) -> Result<(), BackendError>
where
    C: StageCompute,
    T: Transport<C::Tensor>,
{
    let rank = program.rank;
    let mut tensors = Tensors {
        inputs: HashMap::new(),
        outputs: HashMap::new(),
        grads: HashMap::new(),
        grad_inputs: HashMap::new(),
    };
    for (instr_index, instr) in program.instrs.iter().enumerate() {
        let what = || instr.to_string();
        let stage_error = |reason: String| BackendError::Stage {
            rank,
            instr: instr_index,
            what: what(),
            reason,
        };
        let missing = |reason: String| BackendError::Program {
            rank,
            instr: instr_index,
            what: what(),
            reason,
        };
        let guarded =
            |result: std::thread::Result<Result<(), String>>| -> Result<(), BackendError> {
                match result {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(reason)) => Err(stage_error(reason)),
                    Err(payload) => Err(BackendError::Panicked {
                        rank,
                        instr: instr_index,
                        what: what(),
                        reason: panic_message(payload),
                    }),
                }
            };
        match instr {
            Instr::Compute(task) => {
                let result = catch_unwind(AssertUnwindSafe(|| {
                    run_task(task, problem, compute, &mut tensors)
                }));
                match result {
                    Ok(Err(TaskError::Stage(reason))) => return Err(stage_error(reason)),
                    Ok(Err(TaskError::Missing(reason))) => return Err(missing(reason)),
                    Ok(Ok(())) => {}
                    Err(payload) => {
                        return Err(BackendError::Panicked {
                            rank,
                            instr: instr_index,
                            what: what(),
                            reason: panic_message(payload),
                        })
                    }
                }
            }
            Instr::Loss(work) => {
                let output = tensors.outputs.remove(work).ok_or_else(|| {
                    missing(format!(
                        "no forward output of stage {} for microbatch {}",
                        work.stage, work.microbatch
                    ))
                })?;
                let mut grad = None;
                guarded(catch_unwind(AssertUnwindSafe(|| {
                    grad = Some(compute.loss(*work, output)?);
                    Ok(())
                })))?;
                tensors
                    .grads
                    .insert(*work, grad.expect("set when the loss succeeded"));
            }
            Instr::Comm(group) => {
                let transport_error = |failure: TransportFailure,
                                       from: Option<pipeweave_core::RankId>,
                                       message| match failure
                {
                    TransportFailure::Aborted { failed } => BackendError::Aborted {
                        rank,
                        instr: instr_index,
                        failed,
                    },
                    TransportFailure::Unexpected { got } => BackendError::Protocol {
                        rank,
                        instr: instr_index,
                        from: from.unwrap_or(rank),
                        expected: message,
                        got,
                    },
                    TransportFailure::Timeout { seconds } => BackendError::Timeout {
                        rank,
                        instr: instr_index,
                        from: from.unwrap_or(rank),
                        message,
                        seconds,
                    },
                    TransportFailure::Broken(reason) => BackendError::Transport {
                        rank,
                        instr: instr_index,
                        reason,
                    },
                };
                for op in &group.ops {
                    if let CommOp::Send { to, message } = *op {
                        let from_work = Work {
                            stage: message.from_stage,
                            microbatch: message.microbatch,
                        };
                        let store = match message.direction {
                            Direction::Activation => &mut tensors.outputs,
                            Direction::Gradient => &mut tensors.grad_inputs,
                        };
                        let payload = store.remove(&from_work).ok_or_else(|| {
                            missing(format!("nothing computed to send as {message}"))
                        })?;
                        transport
                            .send(to, message, payload)
                            .map_err(|f| transport_error(f, None, message))?;
                    }
                }
                for op in &group.ops {
                    if let CommOp::Recv { from, message } = *op {
                        let payload = transport
                            .recv(from, message)
                            .map_err(|f| transport_error(f, Some(from), message))?;
                        let store = match message.direction {
                            Direction::Activation => &mut tensors.inputs,
                            Direction::Gradient => &mut tensors.grads,
                        };
                        store.insert(message.consumer(), payload);
                    }
                }
            }
            Instr::FreeOutput(work) => compute.free_output(*work),
            Instr::GradSync(stage) => {
                guarded(catch_unwind(AssertUnwindSafe(|| compute.grad_sync(*stage))))?
            }
            Instr::FlushWeightGrads => guarded(catch_unwind(AssertUnwindSafe(|| compute.flush())))?,
        }
    }
    Ok(())
}

enum TaskError {
    Stage(String),
    Missing(String),
}

fn take<T>(map: &mut HashMap<Work, T>, work: Work, what: &str) -> Result<T, TaskError> {
    map.remove(&work).ok_or_else(|| {
        TaskError::Missing(format!(
            "no {what} for stage {} microbatch {}",
            work.stage, work.microbatch
        ))
    })
}

/// Where a forward output goes: the loss, a local next stage, or a send.
fn place_output<T>(
    problem: &Problem,
    rank_of_work: pipeweave_core::RankId,
    work: Work,
    output: T,
    tensors: &mut Tensors<T>,
) {
    match problem
        .route_of(work.microbatch)
        .and_then(|r| r.next(work.stage))
    {
        Some(next) if problem.rank_of(next) == Some(rank_of_work) => {
            tensors.inputs.insert(
                Work {
                    stage: next,
                    microbatch: work.microbatch,
                },
                output,
            );
        }
        _ => {
            tensors.outputs.insert(work, output);
        }
    }
}

/// Where an input gradient goes: nowhere (first stage), a local previous stage, or a send.
fn place_grad_input<T>(
    problem: &Problem,
    rank_of_work: pipeweave_core::RankId,
    work: Work,
    grad: Option<T>,
    tensors: &mut Tensors<T>,
) {
    let Some(grad) = grad else { return };
    match problem
        .route_of(work.microbatch)
        .and_then(|r| r.prev(work.stage))
    {
        Some(prev) if problem.rank_of(prev) == Some(rank_of_work) => {
            tensors.grads.insert(
                Work {
                    stage: prev,
                    microbatch: work.microbatch,
                },
                grad,
            );
        }
        Some(_) => {
            tensors.grad_inputs.insert(work, grad);
        }
        None => {}
    }
}

fn forward_input<T>(
    problem: &Problem,
    work: Work,
    tensors: &mut Tensors<T>,
) -> Result<Option<T>, TaskError> {
    let first = problem
        .route_of(work.microbatch)
        .is_none_or(|r| r.prev(work.stage).is_none());
    if first {
        Ok(None)
    } else {
        take(&mut tensors.inputs, work, "forward input").map(Some)
    }
}

fn run_task<C: StageCompute>(
    task: &Task,
    problem: &Problem,
    compute: &mut C,
    tensors: &mut Tensors<C::Tensor>,
) -> Result<(), TaskError> {
    let owner = |w: Work| {
        problem
            .rank_of(w.stage)
            .unwrap_or(pipeweave_core::RankId::new(u32::MAX))
    };
    match *task {
        Task::Forward(w) => {
            let input = forward_input(problem, w, tensors)?;
            let output = compute.forward(w, input).map_err(TaskError::Stage)?;
            place_output(problem, owner(w), w, output, tensors);
        }
        Task::InputGrad(w) => {
            let grad = take(&mut tensors.grads, w, "output gradient")?;
            let grad_input = compute.backward_input(w, grad).map_err(TaskError::Stage)?;
            place_grad_input(problem, owner(w), w, grad_input, tensors);
        }
        Task::WeightGrad(w) => compute.backward_weight(w).map_err(TaskError::Stage)?,
        Task::Backward(w) => {
            let grad = take(&mut tensors.grads, w, "output gradient")?;
            let grad_input = compute.backward_input(w, grad).map_err(TaskError::Stage)?;
            compute.backward_weight(w).map_err(TaskError::Stage)?;
            place_grad_input(problem, owner(w), w, grad_input, tensors);
        }
        Task::Overlapped { forward, backward } => {
            let input = forward_input(problem, forward, tensors)?;
            let grad = take(&mut tensors.grads, backward, "output gradient")?;
            let (output, grad_input) = compute
                .forward_backward(forward, input, backward, grad)
                .map_err(TaskError::Stage)?;
            place_output(problem, owner(forward), forward, output, tensors);
            place_grad_input(problem, owner(backward), backward, grad_input, tensors);
        }
    }
    Ok(())
}
