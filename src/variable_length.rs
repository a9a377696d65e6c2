//! Plans for variable-length microbatches: one cost per microbatch from its tokens, the data put
//! into the slots the simulator prices fastest, and the schedule built with those costs
//! ([`plan_for_lengths`]; `train_gpt --variable-length` runs it before every step).

use crate::compile::build_plan;
use crate::config::PipelineConfig;
use crate::error::Error;
use pipeweave_core::{simulate, Plan, Profile};
use pipeweave_transforms::schedules::microbatch_order::microbatch_order;

/// A step's plan and the data order it assumes: slot `s` takes data microbatch `order[s]`.
#[derive(Clone, Debug)]
pub struct LengthPlan {
    /// Slot `s` takes data microbatch `order[s]` (of every data-parallel replica).
    pub order: Vec<usize>,
    /// Each slot's cost factor (its microbatch's tokens over the full length).
    pub scales: Vec<f64>,
    /// The schedule built with those costs.
    pub plan: Plan,
}

/// How a microbatch's cost grows with its tokens per sequence, relative to the full length.
#[derive(Clone, Debug)]
pub enum LengthCost {
    /// `tokens / full` (the matrix products, most of a step, are linear in the tokens).
    Linear {
        /// The full length.
        full: usize,
    },
    /// A profile's per-token model ([`Profile::length_scale`]), boxed (a profile is large
    /// beside the other case).
    Profiled(Box<Profile>),
}

impl LengthCost {
    /// The cost factor of sequences of `tokens` tokens (an error for a profile that gives no
    /// sequence length).
    pub fn scale(&self, tokens: usize) -> Result<f64, Error> {
        Ok(match self {
            LengthCost::Linear { full } => tokens as f64 / (*full).max(1) as f64,
            LengthCost::Profiled(profile) => profile.length_scale(tokens)?,
        })
    }
}

/// The plan of `expression` on `config`'s sizes for microbatches of `lengths` tokens per
/// sequence (data-parallel replicas' worth, replica-major; a slot costs the most any replica's
/// microbatch of that index has), each costing what `cost` says: the slot order the simulator
/// prices fastest ([`microbatch_order`]: the cheapest where the fill and the drain wait), then
/// the schedule built with the costs in that order.
pub fn plan_for_lengths(
    expression: &str,
    config: &PipelineConfig,
    lengths: &[usize],
    cost: &LengthCost,
) -> Result<LengthPlan, Error> {
    let per_replica = config.microbatches() as usize;
    if per_replica == 0 || lengths.is_empty() || lengths.len() % per_replica != 0 {
        return Err(Error::Option {
            option: "microbatch lengths",
            message: format!(
                "{} lengths for {per_replica} microbatches per replica",
                lengths.len()
            ),
        });
    }
    let costs: Vec<f64> = (0..per_replica)
        .map(|m| {
            let longest = lengths.iter().skip(m).step_by(per_replica).max();
            Ok(cost.scale(*longest.unwrap_or(&0))?.max(1e-9))
        })
        .collect::<Result<_, Error>>()?;
    let build = |scales: &[f64]| -> Result<Plan, Error> {
        build_plan(
            expression,
            &config.clone().with_microbatch_scales(scales.to_vec())?,
        )
    };
    let mut failure = None;
    let order = microbatch_order(&costs, &mut |in_slots| match build(in_slots)
        .and_then(|plan| Ok(simulate(&plan)?))
    {
        Ok(simulation) => simulation.makespan(),
        Err(e) => {
            failure.get_or_insert(e);
            f64::INFINITY
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let scales: Vec<f64> = order.iter().map(|&m| costs[m]).collect();
    let plan = build(&scales)?;
    Ok(LengthPlan {
        order,
        scales,
        plan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_microbatches_go_where_the_pipeline_waits() {
        let config = PipelineConfig::new(4, 6).unwrap();
        let lengths = [64, 64, 8, 64, 16, 64];
        let linear = LengthCost::Linear { full: 64 };
        let planned = plan_for_lengths("f1b(gpipe)", &config, &lengths, &linear).unwrap();
        assert_eq!(planned.order[0], 2, "{:?}", planned.order);
        let uniform = simulate(&build_plan("f1b(gpipe)", &config).unwrap()).unwrap();
        let in_order = config
            .clone()
            .with_microbatch_scales(lengths.iter().map(|&t| t as f64 / 64.0).collect())
            .unwrap();
        let data_order = simulate(&build_plan("f1b(gpipe)", &in_order).unwrap()).unwrap();
        let chosen = simulate(&planned.plan).unwrap();
        assert!(
            chosen.makespan() < data_order.makespan(),
            "{} vs {}",
            chosen.makespan(),
            data_order.makespan()
        );
        assert!(chosen.makespan() < uniform.makespan());
        assert!(plan_for_lengths("f1b(gpipe)", &config, &[64; 5], &linear).is_err());
    }
}
