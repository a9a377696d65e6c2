//! A text grid of a simulated plan: one row per rank, one column per time quantum.
//!
//! Each task shows its kind and microbatch in the cell where it starts (`F3`, `I3`, `W3`, `B3`;
//! with sequence chunks its group and chunk, `F3.1`;
//! `X3` for an overlapped forward+backward, labelled by its forward's microbatch, `R3` for a
//! recompute, `RW3` for a recompute for the weight gradient); the cells it continues over show `~`, idle cells `.`. A rank whose plan offloads gets
//! a second row, `link`, with its transfers (`O3` offload, `L3` reload). A rank's first local stage is written in capitals, its
//! other stages (model chunks) in lower case, so interleaved schedules read like the papers' figures.
//! The quantum is the shortest task duration, widened so the grid has at most [`MAX_COLUMNS`] columns;
//! a grid so widened that tasks share a cell says how many it does not show.

use crate::analysis::simulate::Simulation;
use crate::ir::ids::push_decimal;
use crate::ir::op::{Task, TaskKind};
use crate::ir::plan::Plan;
use crate::ir::problem::Problem;
use crate::tolerance::TOLERANCE;
use std::fmt::Write;

/// Widest grid drawn; longer schedules are drawn with a coarser quantum.
pub const MAX_COLUMNS: usize = 160;

/// A task's label: its kind's letter (capital on the rank's first local stage) and microbatch
/// (with sequence chunks, its group and chunk: `F3.1`).
fn label(problem: &Problem, first_local: Option<usize>, task: &Task) -> String {
    let work = task.work();
    let letter = match task.kind() {
        TaskKind::Forward => 'F',
        TaskKind::InputGrad => 'I',
        TaskKind::WeightGrad => 'W',
        TaskKind::Backward => 'B',
        TaskKind::Overlapped => 'X',
        TaskKind::Recompute => 'R',
        TaskKind::Offload => 'O',
        TaskKind::Reload => 'L',
    };
    let letter = if first_local == Some(work.stage.index()) {
        letter
    } else {
        letter.to_ascii_lowercase()
    };
    let mut out = Vec::with_capacity(8);
    out.push(letter as u8);
    if matches!(task, Task::RecomputeWeightGrad(_)) {
        out.push(if letter.is_ascii_uppercase() {
            b'W'
        } else {
            b'w'
        });
    }
    if problem.is_seq_split() {
        out.extend_from_slice(problem.microbatch_label(work.microbatch).as_bytes());
    } else {
        push_decimal(&mut out, work.microbatch.get());
    }
    String::from_utf8(out).expect("a label is ASCII")
}

/// The length of a task's label, without writing it.
fn label_len(problem: &Problem, task: &Task) -> usize {
    let digits = |n: u32| n.checked_ilog10().map_or(1, |d| d as usize + 1);
    let microbatch = task.work().microbatch;
    let letters = 1 + usize::from(matches!(task, Task::RecomputeWeightGrad(_)));
    let number = if problem.is_seq_split() {
        let (group, chunk) = problem.seq_chunk_of(microbatch);
        digits(group) + 1 + digits(chunk)
    } else {
        digits(microbatch.get())
    };
    letters + number
}

/// What a cell of a rank's row shows: idle, or the task (its index in the rank's timeline)
/// starting or continuing there. A later task drawn over a cell replaces an earlier one.
#[derive(Clone, Copy, PartialEq)]
enum Cell {
    Idle,
    Starts(usize),
    Continues,
}

/// Renders the grid of `simulation` (a simulation of `plan`).
pub fn render_grid(plan: &Plan, simulation: &Simulation) -> String {
    let timeline = simulation.timeline();
    let makespan = simulation.makespan();
    let shortest = timeline
        .iter()
        .flatten()
        .map(|t| t.end - t.start)
        .filter(|d| *d > 1e-12)
        .fold(f64::INFINITY, f64::min);
    if !shortest.is_finite() || makespan <= 0.0 {
        return String::from("(empty schedule)\n");
    }
    let mut quantum = shortest;
    if makespan / quantum > MAX_COLUMNS as f64 {
        quantum = makespan / MAX_COLUMNS as f64;
    }
    let columns = ((makespan / quantum) - TOLERANCE).ceil().max(1.0) as usize;
    let width = timeline
        .iter()
        .flatten()
        .map(|t| label_len(plan.problem(), &t.task))
        .max()
        .unwrap_or(1);
    let mut out = String::new();
    let mut row = vec![Cell::Idle; columns];
    // Tasks drawn (their start in a cell of their own) and in all.
    let (mut drawn, mut total) = (0, 0);
    let offloads = plan.facts().residency.offloaded;
    for (r, tasks) in timeline.iter().enumerate() {
        let first_local = plan
            .problem()
            .stage_to_rank()
            .iter()
            .position(|rank| rank.index() == r);
        for link in [false, true] {
            if link && !offloads {
                continue;
            }
            row.fill(Cell::Idle);
            for (i, t) in tasks.iter().enumerate() {
                if t.task.on_link() != link {
                    continue;
                }
                let first = ((t.start / quantum) + TOLERANCE).floor() as usize;
                let last = (((t.end / quantum) - TOLERANCE).ceil() as usize).max(first + 1);
                for (c, cell) in row
                    .iter_mut()
                    .enumerate()
                    .take(last.min(columns))
                    .skip(first)
                {
                    *cell = if c == first {
                        Cell::Starts(i)
                    } else {
                        Cell::Continues
                    };
                }
            }
            if link {
                let _ = write!(out, "   link |");
            } else {
                let _ = write!(out, "rank {r:>2} |");
            }
            drawn += row.iter().filter(|c| matches!(c, Cell::Starts(_))).count();
            total += tasks.iter().filter(|t| t.task.on_link() == link).count();
            for cell in &row {
                let text = match *cell {
                    Cell::Idle => ".".to_string(),
                    Cell::Starts(i) => label(plan.problem(), first_local, &tasks[i].task),
                    Cell::Continues => "~".to_string(),
                };
                let _ = write!(out, " {text:<width$}");
            }
            out.push('\n');
        }
    }
    if drawn < total {
        let _ = writeln!(
            out,
            "(a sample: each column spans {quantum:.3}, longer than the shortest task, \
             {shortest:.3}; a cell shows the last task that starts in it, so {} of the {total} \
             tasks are not shown)",
            total - drawn
        );
    }
    out
}
