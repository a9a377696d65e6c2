//! Chrome/Perfetto trace JSON of a simulated plan: one track per rank, every task a complete event
//! named and coloured by kind, and a flow arrow for every message between ranks. A plan that
//! offloads gets a second track per rank, `rank r link`, with its transfers.
//!
//! Times are the simulator's units written as milliseconds (`ts` and `dur` are in microseconds,
//! so one unit of time is 1000 µs). Open the file in `chrome://tracing` or <https://ui.perfetto.dev>.

use crate::analysis::simulate::Simulation;
use crate::ir::deps::predecessors;
use crate::ir::op::{OpKind, Task, TaskKind, Work};
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use serde_json::{json, Value};

const MICROS_PER_UNIT: f64 = 1000.0;

fn kind_name(kind: TaskKind) -> (&'static str, &'static str) {
    match kind {
        TaskKind::Forward => ("F", "thread_state_running"),
        TaskKind::InputGrad => ("I", "good"),
        TaskKind::WeightGrad => ("W", "yellow"),
        TaskKind::Backward => ("B", "rail_response"),
        TaskKind::Overlapped => ("F&B", "terrible"),
        TaskKind::Recompute => ("R", "olive"),
        TaskKind::Offload => ("OFFLOAD", "cq_build_attempt_failed"),
        TaskKind::Reload => ("RELOAD", "cq_build_attempt_passed"),
    }
}

/// A task's name in the trace: its notation, with sequence chunks `F3.1` (group 3, chunk 1).
fn task_name(problem: &Problem, task: &Task) -> String {
    if !problem.is_seq_split() {
        return task.to_string();
    }
    let plain = task.to_string();
    let number = task.work().microbatch.get().to_string();
    let kind = plain.strip_suffix(number.as_str()).unwrap_or(&plain);
    format!("{kind}{}", problem.microbatch_label(task.work().microbatch))
}

/// A task's arguments in the trace: kind, stage, microbatch and, with sequence chunks, its
/// sample group and chunk.
fn trace_args(problem: &Problem, kind: &str, work: Work) -> serde_json::Value {
    let mut args =
        json!({ "kind": kind, "stage": work.stage.get(), "microbatch": work.microbatch.get() });
    if problem.is_seq_split() {
        let (group, chunk) = problem.seq_chunk_of(work.microbatch);
        args["sample_group"] = json!(group);
        args["sequence_chunk"] = json!(chunk);
    }
    args
}

/// The track of rank `r`'s host link (after every rank's own track).
fn link_track(plan: &Plan, r: usize) -> usize {
    plan.orders().len() + r
}

/// The trace of `simulation` (a simulation of `plan`) as a JSON value.
pub fn chrome_trace(plan: &Plan, simulation: &Simulation, title: &str) -> Value {
    let mut events = vec![json!({
        "name": "process_name", "ph": "M", "pid": 0, "args": { "name": title }
    })];
    let mut where_run = vec![(usize::MAX, 0.0f64, 0.0f64); plan.op_slots()];
    for (r, tasks) in simulation.timeline().iter().enumerate() {
        events.push(json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": { "name": format!("rank {r}") }
        }));
        events.push(json!({
            "name": "thread_sort_index", "ph": "M", "pid": 0, "tid": r, "args": { "sort_index": 2 * r }
        }));
        if plan.facts().residency.offloaded {
            let link = link_track(plan, r);
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": 0, "tid": link, "args": { "name": format!("rank {r} link") }
            }));
            events.push(json!({
                "name": "thread_sort_index", "ph": "M", "pid": 0, "tid": link, "args": { "sort_index": 2 * r + 1 }
            }));
        }
        for t in tasks {
            let (kind, colour) = kind_name(t.task.kind());
            let work = t.task.work();
            let track = if t.task.on_link() {
                link_track(plan, r)
            } else {
                r
            };
            events.push(json!({
                "name": task_name(plan.problem(), &t.task),
                "cat": kind,
                "ph": "X",
                "pid": 0,
                "tid": track,
                "ts": t.start * MICROS_PER_UNIT,
                "dur": (t.end - t.start) * MICROS_PER_UNIT,
                "cname": colour,
                "args": trace_args(plan.problem(), kind, work),
            }));
            for op in t.task.ops() {
                if let Some(slot) = plan.op_slot(op) {
                    where_run[slot] = (r, t.start, t.end);
                }
            }
        }
    }
    let mut id = 0u64;
    for (r, tasks) in simulation.timeline().iter().enumerate() {
        for t in tasks {
            let ops = t.task.ops();
            for op in &ops {
                for dep in predecessors(plan.problem(), *op) {
                    let Some(slot) = plan.op_slot(dep) else {
                        continue;
                    };
                    let (from, _, sent) = where_run[slot];
                    if from == usize::MAX || from == r || ops.contains(&dep) {
                        continue;
                    }
                    let name = if dep.kind == OpKind::Forward {
                        "activation"
                    } else {
                        "gradient"
                    };
                    id += 1;
                    events.push(json!({
                        "name": name, "cat": "message", "ph": "s", "id": id, "pid": 0, "tid": from,
                        "ts": sent * MICROS_PER_UNIT,
                    }));
                    events.push(json!({
                        "name": name, "cat": "message", "ph": "f", "bp": "e", "id": id, "pid": 0, "tid": r,
                        "ts": t.start * MICROS_PER_UNIT,
                    }));
                }
            }
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}
