//! Importing a schedule file: the problem its rows imply (placement, microbatches, routes; see
//! the module doc of [`super`]) and the plan of its compute actions, with the programs of a
//! lowered file (`lower.rs`).

use super::lower::lower_rows;
use super::parse::parse_rows;
use super::Action;
use crate::error::CoreError;
use crate::ir::cost::StageCosts;
use crate::ir::op::Task;
use crate::ir::plan::Plan;
use crate::ir::problem::{Problem, ProblemSpec, RouteSpec};
use crate::spmd::program::ProgramSet;
use std::collections::BTreeMap;

/// What an import produced.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The compute plan (not yet verified).
    pub plan: Plan,
    /// The programs, when the file was lowered.
    pub programs: Option<ProgramSet>,
}

/// Builds the problem of an imported schedule (the rules of the module doc of [`super`]).
fn infer_problem(rows: &[Vec<Action>]) -> Result<Problem, CoreError> {
    let mut owner: BTreeMap<u32, (usize, usize)> = BTreeMap::new();
    let mut touched: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (rank, row) in rows.iter().enumerate() {
        for (position, action) in row.iter().enumerate() {
            let Action::Compute(task) = action else {
                continue;
            };
            for op in task.ops() {
                let entry = owner.entry(op.stage.get()).or_insert((rank, position));
                if entry.0 != rank {
                    return Err(CoreError::Import(format!(
                        "stage {} appears on rank {} (line {}) and on rank {rank} (line {})",
                        op.stage,
                        entry.0,
                        entry.0 + 1,
                        rank + 1
                    )));
                }
                touched
                    .entry(op.microbatch.get())
                    .or_default()
                    .push(op.stage.get());
            }
        }
    }
    let Some((&last_stage, _)) = owner.last_key_value() else {
        return Err(CoreError::Import(
            "the file holds no compute action".to_string(),
        ));
    };
    let stages = u64::from(last_stage) + 1;
    if stages > u64::from(crate::ir::problem::MAX_STAGES) {
        return Err(CoreError::SizeOutOfRange {
            what: "stages",
            value: i128::from(stages),
            constraint: format!("must be at most {}", crate::ir::problem::MAX_STAGES),
        });
    }
    if let Some(missing) = (0..=last_stage).find(|s| !owner.contains_key(s)) {
        return Err(CoreError::Import(format!(
            "stage {missing} appears in no row (stages 0..={last_stage} are used)"
        )));
    }
    let microbatches = touched
        .last_key_value()
        .map_or(0, |(&m, _)| u64::from(m) + 1);
    if microbatches > u64::from(crate::ir::problem::MAX_MICROBATCHES) {
        return Err(CoreError::SizeOutOfRange {
            what: "microbatches",
            value: i128::from(microbatches),
            constraint: format!("must be at most {}", crate::ir::problem::MAX_MICROBATCHES),
        });
    }
    if let Some(missing) = (0..microbatches as u32).find(|m| !touched.contains_key(m)) {
        return Err(CoreError::Import(format!(
            "microbatch {missing} appears in no action (microbatches 0..{microbatches} are used)"
        )));
    }
    let sets: Vec<Vec<u32>> = (0..microbatches as u32)
        .map(|m| {
            let mut set = touched.remove(&m).unwrap_or_default();
            set.sort_unstable();
            set.dedup();
            set
        })
        .collect();
    // A strict subset of another microbatch's stages is an incomplete microbatch, not a route.
    let mut distinct: Vec<&Vec<u32>> = sets.iter().collect();
    distinct.sort();
    distinct.dedup();
    let widen = |set: &Vec<u32>| -> Vec<u32> {
        distinct
            .iter()
            .filter(|other| {
                other.len() > set.len() && set.iter().all(|s| other.binary_search(s).is_ok())
            })
            .max_by_key(|other| other.len())
            .map_or_else(|| set.clone(), |o| (*o).clone())
    };
    let mut routes: Vec<RouteSpec> = Vec::new();
    for (m, set) in sets.iter().enumerate() {
        let stages = widen(set);
        match routes.last_mut() {
            Some(route) if route.stages == stages => route.end = m as u32 + 1,
            _ => routes.push(RouteSpec {
                first: m as u32,
                end: m as u32 + 1,
                stages,
            }),
        }
    }
    let placement: Vec<u32> = owner.values().map(|&(rank, _)| rank as u32).collect();
    let ranks = rows.len() as u32;
    ProblemSpec::builder()
        .ranks(ranks)
        .microbatches(microbatches as u32)
        .stage_to_rank(placement)
        .routes(routes)
        .build()
        .validate()
}

/// Imports a schedule CSV. `share_costs` are the costs of a rank's whole share (divided among the
/// stages a rank holds), `comm` the cross-rank latency.
pub fn import_csv(text: &str, share_costs: StageCosts, comm: f64) -> Result<Imported, CoreError> {
    let rows = parse_rows(text)?;
    let problem = infer_problem(&rows)?;
    let orders: Vec<Vec<Task>> = rows
        .iter()
        .map(|row| {
            row.iter()
                .filter_map(|a| match a {
                    Action::Compute(t) => Some(*t),
                    Action::Comm { .. } | Action::Param { .. } => None,
                })
                .collect()
        })
        .collect();
    let lowered = rows
        .iter()
        .flatten()
        .any(|a| matches!(a, Action::Comm { .. }));
    let programs = if lowered {
        Some(lower_rows(&problem, &rows)?)
    } else {
        None
    };
    let plan = Plan::from_rank_shares(problem, share_costs, comm, orders)?;
    Ok(Imported { plan, programs })
}
