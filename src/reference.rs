//! Reading the reference schedule files of `../shared/reference` (their format is described in its
//! README): sizes, placement, optional routes and tied stages, and per-rank orders in PyTorch's
//! action notation.

use crate::error::Error;
use pipeweave_core::{Plan, ProblemSpec, RouteSpec, StageCosts, Task};
use serde::Deserialize;

#[derive(Deserialize)]
struct ReferenceFile {
    ranks: u32,
    microbatches: u32,
    stage_to_rank: Vec<u32>,
    #[serde(default)]
    routes: Vec<(u32, u32, Vec<u32>)>,
    #[serde(default)]
    tied_stages: Vec<Vec<u32>>,
    order: Vec<Vec<String>>,
}

/// Builds the (unverified) plan of a reference file; costs are a rank's share, split among the
/// stages it holds.
pub fn read_reference(path: &str, text: &str, share: StageCosts, comm: f64) -> Result<Plan, Error> {
    let json_error = |message: String| Error::Json {
        path: path.to_string(),
        message,
    };
    let file: ReferenceFile = serde_json::from_str(text).map_err(|e| json_error(e.to_string()))?;
    let problem = ProblemSpec::builder()
        .ranks(file.ranks)
        .microbatches(file.microbatches)
        .stage_to_rank(file.stage_to_rank)
        .routes(
            file.routes
                .into_iter()
                .map(|(first, end, stages)| RouteSpec { first, end, stages })
                .collect(),
        )
        .tied_stages(file.tied_stages)
        .build()
        .validate()?;
    let orders = file
        .order
        .iter()
        .map(|row| {
            row.iter()
                .map(|a| a.parse::<Task>())
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Plan::from_rank_shares(problem, share, comm, orders)?)
}
