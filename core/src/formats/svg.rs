//! An SVG timeline like the papers' figures: ranks as rows, time as columns, one box per task
//! coloured by kind (F, B, I, W, overlapped F&B, R recompute) with its microbatch number, later
//! model chunks hatched, a legend, and the makespan and bubble rate in the title. A plan that
//! offloads draws each rank's host-link transfers (offload, reload) in a thin lane under its row.

use crate::analysis::replay::TimedTask;
use crate::analysis::simulate::Simulation;
use crate::formats::svg_markup::escape;
use crate::ir::op::TaskKind;
use crate::ir::plan::Plan;
use crate::ir::problem::microbatch_label;
use crate::tolerance::TOLERANCE;
use std::fmt::Write;

const ROW_HEIGHT: f64 = 30.0;
const LEFT: f64 = 70.0;
const TOP: f64 = 48.0;
const MAX_WIDTH: f64 = 1600.0;
const MIN_UNIT: f64 = 8.0;

fn colour(kind: TaskKind) -> &'static str {
    match kind {
        TaskKind::Forward => "#4e79a7",
        TaskKind::Backward => "#59a14f",
        TaskKind::InputGrad => "#8cd17d",
        TaskKind::WeightGrad => "#f1ce63",
        TaskKind::Overlapped => "#b07aa1",
        TaskKind::Recompute => "#9c755f",
        TaskKind::Offload => "#e15759",
        TaskKind::Reload => "#76b7b2",
    }
}

fn label(kind: TaskKind) -> &'static str {
    match kind {
        TaskKind::Forward => "F forward",
        TaskKind::Backward => "B full backward",
        TaskKind::InputGrad => "I input-gradient backward",
        TaskKind::WeightGrad => "W weight-gradient backward",
        TaskKind::Overlapped => "F&B overlapped forward and backward",
        TaskKind::Recompute => "R, RW recompute (RW: for the weight gradient)",
        TaskKind::Offload => "offload to host",
        TaskKind::Reload => "reload from host",
    }
}

/// Height of the lane of a rank's host-link transfers (when the plan offloads).
const LINK_LANE: f64 = 7.0;

/// The SVG document of `simulation` (a simulation of `plan`), titled `title`.
pub fn timeline_svg(plan: &Plan, simulation: &Simulation, title: &str) -> String {
    let frame = Frame::of(simulation, plan.problem().seq_chunks());
    let mut out = String::new();
    header(&mut out, &frame, simulation, title);
    for (r, tasks) in simulation.timeline().iter().enumerate() {
        let first_local = plan
            .problem()
            .stage_to_rank()
            .iter()
            .position(|x| x.index() == r);
        rank_row(&mut out, &frame, r, tasks, first_local);
    }
    time_axis(&mut out, &frame);
    legend(&mut out, &frame, plan);
    out.push_str("</svg>\n");
    out
}

/// The picture's geometry: time scale and the positions that depend on it.
struct Frame {
    makespan: f64,
    scale: f64,
    ranks: usize,
    width: f64,
    legend_top: f64,
    height: f64,
    /// Height of a compute box (less than a row's when the row holds a link lane).
    box_height: f64,
    /// Sequence chunks per sample group (labels read `group.chunk` where above 1).
    seq_chunks: u32,
}

impl Frame {
    fn of(simulation: &Simulation, seq_chunks: u32) -> Frame {
        let transfers = simulation
            .timeline()
            .iter()
            .flatten()
            .any(|t| t.task.on_link());
        let makespan = simulation.makespan().max(1e-9);
        let shortest = simulation
            .timeline()
            .iter()
            .flatten()
            .map(|t| t.end - t.start)
            .filter(|d| *d > 1e-12)
            .fold(f64::INFINITY, f64::min);
        let shortest = if shortest.is_finite() { shortest } else { 1.0 };
        // About 30 px for the shortest task, within MAX_WIDTH unless that leaves it under MIN_UNIT.
        let scale = (30.0 / shortest)
            .min(MAX_WIDTH / makespan)
            .max(MIN_UNIT / shortest);
        let ranks = simulation.timeline().len();
        let legend_top = TOP + ranks as f64 * ROW_HEIGHT + 30.0;
        Frame {
            makespan,
            scale,
            ranks,
            width: LEFT + makespan * scale + 20.0,
            legend_top,
            height: legend_top + 40.0,
            box_height: ROW_HEIGHT - 4.0 - if transfers { LINK_LANE + 1.0 } else { 0.0 },
            seq_chunks,
        }
    }
}

/// The opening tag, the hatch pattern, the background and the title.
fn header(out: &mut String, frame: &Frame, simulation: &Simulation, title: &str) {
    let (width, height) = (frame.width, frame.height);
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="Helvetica, Arial, sans-serif">"#
    );
    let _ = writeln!(
        out,
        r#"<defs><pattern id="later-chunk" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="2.5" height="6" fill="white" fill-opacity="0.45"/></pattern></defs>"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{} — makespan {:.3}, bubble {:.1}%</text>"#,
        escape(title),
        simulation.makespan(),
        simulation.bubble_rate() * 100.0
    );
}

/// One rank's label, lane and tasks; tasks of a later local stage are hatched.
fn rank_row(
    out: &mut String,
    frame: &Frame,
    r: usize,
    tasks: &[TimedTask],
    first_local: Option<usize>,
) {
    let y = TOP + r as f64 * ROW_HEIGHT;
    let _ = writeln!(
        out,
        r#"<text x="{:.0}" y="{:.1}" font-size="13" text-anchor="end">rank {r}</text>"#,
        LEFT - 8.0,
        y + ROW_HEIGHT / 2.0 + 4.0
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#f4f4f4"/>"##,
        frame.makespan * frame.scale,
        ROW_HEIGHT - 4.0
    );
    for t in tasks {
        task_box(
            out,
            frame,
            y,
            t,
            first_local != Some(t.task.work().stage.index()),
        );
    }
}

/// One task: a coloured box with its tooltip, hatched for a later chunk, labelled when wide enough.
fn task_box(out: &mut String, frame: &Frame, y: f64, t: &TimedTask, later_chunk: bool) {
    let x = LEFT + t.start * frame.scale;
    let w = ((t.end - t.start) * frame.scale).max(0.5);
    let kind = t.task.kind();
    if t.task.on_link() {
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{:.1}" width="{w:.1}" height="{LINK_LANE:.1}" fill="{}" stroke="white" stroke-width="0.5"><title>{} [{:.3}, {:.3}]</title></rect>"#,
            y + frame.box_height + 1.0,
            colour(kind),
            escape(&t.task.to_string()),
            t.start,
            t.end
        );
        return;
    }
    let _ = writeln!(
        out,
        r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{:.1}" fill="{}" stroke="white" stroke-width="1"><title>{} [{:.3}, {:.3}]</title></rect>"#,
        frame.box_height,
        colour(kind),
        escape(&t.task.to_string()),
        t.start,
        t.end
    );
    if later_chunk {
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{w:.1}" height="{:.1}" fill="url(#later-chunk)" stroke="white" stroke-width="1"/>"#,
            frame.box_height
        );
    }
    if w >= 12.0 {
        let ink = if matches!(kind, TaskKind::WeightGrad | TaskKind::InputGrad) {
            "#222"
        } else {
            "white"
        };
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="11" text-anchor="middle" fill="{ink}">{}</text>"#,
            x + w / 2.0,
            y + frame.box_height / 2.0 + 4.0,
            microbatch_label(frame.seq_chunks, t.task.work().microbatch)
        );
    }
}

/// Ticks and their times under the rows.
fn time_axis(out: &mut String, frame: &Frame) {
    let axis_y = TOP + frame.ranks as f64 * ROW_HEIGHT + 4.0;
    let step = nice_step(frame.makespan);
    let mut tick = 0.0;
    while tick <= frame.makespan + TOLERANCE {
        let x = LEFT + tick * frame.scale;
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{axis_y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#888"/>"##,
            axis_y + 5.0
        );
        let _ = writeln!(
            out,
            r##"<text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle" fill="#555">{}</text>"##,
            axis_y + 16.0,
            trim(tick)
        );
        tick += step;
    }
}

/// The colour of every kind of task (the residency kinds where the plan has them), and what
/// hatching and numbers mean.
fn legend(out: &mut String, frame: &Frame, plan: &Plan) {
    let legend_top = frame.legend_top;
    let residency = plan.facts().residency;
    let mut kinds = vec![
        TaskKind::Forward,
        TaskKind::Backward,
        TaskKind::InputGrad,
        TaskKind::WeightGrad,
        TaskKind::Overlapped,
    ];
    if residency.recomputed {
        kinds.push(TaskKind::Recompute);
    }
    if residency.offloaded {
        kinds.extend([TaskKind::Offload, TaskKind::Reload]);
    }
    let mut x = LEFT;
    for kind in kinds {
        let _ = writeln!(
            out,
            r#"<rect x="{x:.1}" y="{legend_top:.1}" width="14" height="14" fill="{}"/>"#,
            colour(kind)
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" font-size="12">{}</text>"#,
            x + 19.0,
            legend_top + 11.5,
            escape(label(kind))
        );
        x += 19.0 + 7.2 * label(kind).len() as f64 + 18.0;
    }
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="12" fill="#555">hatched: a rank's later model chunks (virtual stages); numbers are microbatches (group.chunk where sequences are split)</text>"##,
        LEFT,
        legend_top + 32.0
    );
}

fn nice_step(span: f64) -> f64 {
    let raw = span / 10.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if raw <= m * magnitude {
            return m * magnitude;
        }
    }
    10.0 * magnitude
}

fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}
