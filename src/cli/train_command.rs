//! `pipeweave train` (contract: ../shared/TRAIN.md): the trainer of `pipeweave_train::command`
//! with this crate's plans. `examples/train_gpt.rs` calls [`run`] too, so both take the same
//! options and print the same lines.
//!
//! The trainer's library sits below this crate; what it cannot do itself, building the plans
//! from an expression, a cost profile and a memory limit, is [`Costing`], its [`Planner`] here.

use crate::cli::parse_memory_limit;
use crate::compile::build_plan;
use crate::config::PipelineConfig;
use crate::error::Error;
use crate::variable_length::{plan_for_lengths, LengthCost};
use pipeweave_core::{Plan, Profile};
use pipeweave_train::command::{Failure, Planner, StepPlan};
use pipeweave_train::GptProfileModel;
use std::io::Write;

pub use pipeweave_train::command::{Backend, TrainOptions};

/// Trains as `options` say; returns the exit status (TRAIN.md: 0, 2 for bad input, 1 for a failed
/// run), the failure's line written to `stderr`.
pub fn run(options: &TrainOptions, stderr: &mut dyn Write) -> u8 {
    // Freed activations stay in the heap for the next microbatch (no page faults per op).
    pipeweave_train::allocator::keep_freed_memory();
    match pipeweave_train::command::run(options, |threads| Costing::of(options, threads)) {
        Ok(()) => 0,
        Err(failure) => {
            let _ = writeln!(stderr, "error: {}", failure.line());
            failure.status()
        }
    }
}

fn failure(e: Error) -> Failure {
    Failure::of(e.kind(), e.to_string())
}

/// What the run's plans are built from, read once: the sizes, costs, memory and limit (unit
/// costs, or with `--cost-profile` the profile's for the run's cut, as `pipeweave plan --profile
/// --layers-per-stage` costs it; `--memory-limit`) and how `--variable-length` prices a
/// microbatch (the profile's per-token model, or linear in the tokens).
struct Costing {
    schedule: String,
    config: PipelineConfig,
    length: LengthCost,
}

impl Planner for Costing {
    fn plan(&self) -> Result<Plan, Failure> {
        build_plan(&self.schedule, &self.config).map_err(failure)
    }

    fn plan_for_lengths(&self, lengths: &[usize]) -> Result<StepPlan, Failure> {
        let planned = plan_for_lengths(&self.schedule, &self.config, lengths, &self.length)
            .map_err(failure)?;
        Ok(StepPlan {
            order: planned.order,
            plan: planned.plan,
        })
    }
}

impl Costing {
    /// Reads `--cost-profile` (of this run's model) and notes where it was measured with other
    /// compute threads (`threads` here) or another microbatch size.
    fn of(options: &TrainOptions, threads: usize) -> Result<Costing, Failure> {
        let bad = |e: Error| Failure::bad(e.to_string());
        let config = PipelineConfig::new(options.ranks, options.microbatches).map_err(bad)?;
        let limit = |bytes_per_unit| {
            parse_memory_limit(options.memory_limit.as_deref(), bytes_per_unit).map_err(bad)
        };
        let schedule = options.schedule.clone();
        let Some((profile, gpt)) = cost_profile(options)? else {
            return Ok(Costing {
                schedule,
                config: config.with_memory_limit(limit(None)?),
                length: LengthCost::Linear {
                    full: options.seq_len,
                },
            });
        };
        // The plan keeps the profile's seconds; say so where they were measured otherwise.
        if (profile.threads_per_rank, gpt.microbatch_size) != (threads, options.microbatch_size) {
            eprintln!(
                "note: the cost profile was measured with {} compute threads per rank and \
                 microbatches of {}; this run has {threads} and {} (the plan keeps its costs)",
                profile.threads_per_rank, gpt.microbatch_size, options.microbatch_size
            );
        }
        let shares = match &options.layers_per_stage {
            Some(counts) if counts.len() != options.ranks as usize => {
                return Err(Failure::bad(format!(
                    "--cost-profile costs one share per rank: give --layers-per-stage one count \
                     per rank ({} here, not {})",
                    options.ranks,
                    counts.len()
                )))
            }
            other => other.as_deref(),
        };
        let (config, cut) = config.with_profile(&profile, shares).map_err(bad)?;
        Ok(Costing {
            schedule,
            config: config.with_memory_limit(limit(Some(cut.bytes_per_unit))?),
            length: LengthCost::Profiled(Box::new(profile)),
        })
    }
}

/// `--cost-profile`, read and checked to be of this run's model, with the model it describes.
fn cost_profile(options: &TrainOptions) -> Result<Option<(Profile, GptProfileModel)>, Failure> {
    let Some(path) = &options.cost_profile else {
        return Ok(None);
    };
    let bad = |e: &dyn std::fmt::Display| Failure::bad(format!("{}: {e}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(&e))?;
    let profile = Profile::from_json(&text).map_err(|e| bad(&e))?;
    let m = GptProfileModel::of(&profile).ok_or_else(|| {
        bad(&format!(
            "a profile of another model (not one of this trainer's GPT: its model needs the \
             name `{}` or none, `blocks`, `d_model`, `heads`, `vocab`, `seq_len` and \
             `microbatch_size`, and one free layer per block, as `--profile` writes)",
            GptProfileModel::NAME
        ))
    })?;
    let run = (
        options.layers,
        options.d_model,
        options.heads,
        options.seq_len,
    );
    if (m.blocks, m.d_model, m.heads, m.seq_len) != run {
        return Err(bad(&format!(
            "a profile of another model ({} blocks, width {}, {} heads, seq {}; this run: {}, {}, {}, {})",
            m.blocks, m.d_model, m.heads, m.seq_len, run.0, run.1, run.2, run.3
        )));
    }
    let experts = options.experts.unwrap_or(0);
    let top_k = options.top_k.unwrap_or(experts.min(2));
    if (m.experts, m.top_k) != (experts, top_k) {
        return Err(bad(&format!(
            "a profile of another model ({} experts, top-k {}; this run: {experts}, {top_k})",
            m.experts, m.top_k
        )));
    }
    Ok(Some((profile, m)))
}
