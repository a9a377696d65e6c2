//! A run's steps and what it writes: the progress bar, `--log`, the summary, `--curve`,
//! `--timeline`, `--profile`, `--save`; with `--variable-length`, a plan per step.

use super::{Failure, Planner, Run, TrainOptions};
use crate::checkpoint::config_path;
use crate::{pipeline_overhead, step_timeline, LossCurve, Progress, StepLog, Trainer};
use pipeweave_core::Plan;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `path` could not be written (bad input: the user's path).
fn unwritable(path: &Path, e: std::io::Error) -> Failure {
    Failure::bad(format!("{}: {e}", path.display()))
}

/// The steps up to `--stop-after` or `--steps`, then the summary and the files asked for.
pub(super) fn train(run: &Run<'_>, trainer: &mut Trainer) -> Result<(), Failure> {
    let Run {
        options,
        planner,
        plan,
        corpus,
    } = *run;
    let writer = trainer.is_writer();
    let mut log = match &options.log {
        Some(path) if writer => Some(std::fs::File::create(path).map_err(|e| unwritable(path, e))?),
        _ => None,
    };
    let end = options
        .stop_after
        .map_or(options.steps, |k| k.min(options.steps));
    let progress = if writer {
        Progress::start(end)
    } else {
        Progress::with_visibility(end, false)
    };
    let mut train_curve = Vec::new();
    let mut eval_curve = Vec::new();
    let mut first: Option<StepLog> = None;
    let mut last = Vec::new();
    let first_step = trainer.steps_done();
    let mut current = plan.clone();
    let (mut replanned, mut reordered) = (0usize, 0usize);
    while trainer.steps_done() < end {
        if let Some(next) = step_plan(options, planner, &current, trainer, &mut reordered)? {
            trainer.set_plan(&next)?;
            current = next;
            replanned += 1;
        }
        let step = trainer.step()?;
        progress.update(
            step.step,
            step.loss,
            step.tokens as f64 / step.seconds.max(1e-9),
        );
        if let Some(file) = log.as_mut() {
            let line = serde_json::json!({
                "step": step.step,
                "loss": step.loss,
                "tokens": step.tokens,
                "seconds": step.seconds,
                "lr": step.lr,
                "grad_norm": step.grad_norm,
            });
            writeln!(file, "{line}").map_err(|e| Failure::bad(format!("--log: {e}")))?;
        }
        train_curve.push((step.step, step.loss));
        if step.step % options.eval_every.max(1) == 0 || step.step == end {
            eval_curve.push((step.step, trainer.evaluate()?));
        }
        last.push(step.loss);
        first.get_or_insert(step);
    }
    let tail = &last[last.len().saturating_sub(10)..];
    let mean_tail = tail.iter().sum::<f64>() / tail.len().max(1) as f64;
    let summary = match (first, eval_curve.last()) {
        (Some(first), Some((_, eval))) => format!(
            "{} steps of {} on {} ranks{}{} ({} bytes of {}): loss {:.4} -> {:.4} (mean of the last {}), held-out {:.4}",
            end,
            options.schedule,
            options.ranks,
            if options.dp > 1 { format!(" x {} replicas", options.dp) } else { String::new() },
            match options.expert_parallel {
                Some(x) if x > 1 => format!(" x {x} expert ranks"),
                _ => String::new(),
            },
            corpus.bytes().len(),
            corpus.origin().display(),
            first.loss,
            mean_tail,
            tail.len(),
            eval
        ),
        _ => format!("nothing to do: the run is already at step {}", trainer.steps_done()),
    };
    if let Some(path) = &options.save {
        // Collective under MPI: every process takes part, world rank 0 writes.
        trainer.save(path)?;
    }
    if !writer {
        return Ok(());
    }
    progress.finish(&summary);
    if !trainer.peak_activation_bytes().is_empty() {
        eprintln!(
            "peak live activation bytes per rank (last step, measured): {:?}",
            trainer.peak_activation_bytes()
        );
    }
    if trainer.peak_host_bytes().iter().any(|&b| b > 0) {
        eprintln!(
            "peak offloaded bytes in host memory per rank (last step, measured): {:?}",
            trainer.peak_host_bytes()
        );
    }
    if let Some(path) = &options.curve {
        let svg = LossCurve::new(
            format!("{} — {}", options.schedule, corpus.origin().display()),
            train_curve,
            eval_curve,
        )
        .to_svg();
        std::fs::write(path, svg).map_err(|e| unwritable(path, e))?;
    }
    if !trainer.last_measured().is_empty() {
        let overhead = pipeline_overhead(&current, trainer.last_measured())?;
        eprintln!(
            "pipeline overhead (last step): measured {:.4} s, replayed from its measured op times {:.4} s (ratio {:.3})",
            overhead.measured_seconds,
            overhead.replayed_seconds,
            overhead.ratio()
        );
    }
    if options.variable_length && !options.uniform_plan {
        eprintln!(
            "variable-length plans (one cost per microbatch): {reordered} of {} steps put the cheapest microbatches where the fill and the drain wait, {replanned} changed the schedule's orders",
            end.saturating_sub(first_step)
        );
    }
    if let Some(prefix) = &options.timeline {
        write_timeline(prefix, &current, trainer, &options.schedule)?;
    }
    if let Some(path) = &options.profile {
        write_profile(trainer, path)?;
    }
    if let Some(path) = &options.save {
        eprintln!(
            "saved {} (config {})",
            path.display(),
            config_path(path).display()
        );
    }
    Ok(())
}

/// With `--variable-length` (and not `--uniform-plan`), the next step's plan from its
/// microbatches' lengths ([`Planner::plan_for_lengths`]), its data order set on the trainer;
/// `None` when the orders stay those of `current`.
fn step_plan(
    options: &TrainOptions,
    planner: &dyn Planner,
    current: &Plan,
    trainer: &mut Trainer,
    reordered: &mut usize,
) -> Result<Option<Plan>, Failure> {
    if !options.variable_length || options.uniform_plan {
        return Ok(None);
    }
    let lengths = trainer.next_microbatch_lengths()?;
    let planned = planner.plan_for_lengths(&lengths)?;
    if planned.order.iter().enumerate().any(|(slot, &m)| slot != m) {
        *reordered += 1;
    }
    trainer.set_microbatch_order(planned.order)?;
    let next = planned.plan;
    Ok((next.orders() != current.orders()).then_some(next))
}

/// Measures every layer of the run's model on this thread, with the run's compute threads, and
/// scales the layers' times to the op times the run's last step measured at each stage.
fn write_profile(trainer: &Trainer, path: &Path) -> Result<(), Failure> {
    let profile = trainer.profile(5)?;
    std::fs::write(path, profile.to_json() + "\n").map_err(|e| unwritable(path, e))?;
    let total =
        |f: fn(&pipeweave_core::LayerProfile) -> f64| -> f64 { profile.layers.iter().map(f).sum() };
    eprintln!(
        "wrote the profile {} ({} layers; the whole model per microbatch: F {:.4} s, I {:.4} s, W {:.4} s; one send {:.6} s)",
        path.display(),
        profile.layers.len(),
        total(|l| l.forward),
        total(|l| l.input_grad),
        total(|l| l.weight_grad),
        profile.send.seconds
    );
    Ok(())
}

/// The last step's measured timeline beside the simulator's prediction from measured op costs.
fn write_timeline(
    prefix: &Path,
    plan: &Plan,
    trainer: &Trainer,
    title: &str,
) -> Result<(), Failure> {
    if trainer.last_measured().is_empty() {
        return Ok(());
    }
    let timeline = step_timeline(plan, trainer.last_measured(), title)?;
    let file = |suffix: &str| {
        let mut name = prefix.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    for (suffix, contents) in [
        (".measured.svg", &timeline.measured_svg),
        (".simulated.svg", &timeline.simulated_svg),
        (".trace.json", &timeline.trace),
    ] {
        let path = file(suffix);
        std::fs::write(&path, contents).map_err(|e| unwritable(&path, e))?;
    }
    eprintln!(
        "wrote {}.measured.svg, .simulated.svg and .trace.json",
        prefix.display()
    );
    Ok(())
}
