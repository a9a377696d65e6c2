//! What `plan`, `check` and `tune` are asked for, as values: the options the CLI parses and the
//! keyword arguments Python passes, turned into a [`PipelineConfig`] (and a profile's cut) by one
//! set of rules, so both front ends give the same figures and the same error lines.
//!
//! The request holds typed values (costs, memory, a [`MemoryLimit`], [`ProfileOptions`]); the
//! front ends read their own syntax into them (the CLI's `--costs F=1,I=1,comm=0.1` through
//! `crate::cli`'s parsers, which name the option in their errors).

use crate::config::PipelineConfig;
use crate::error::Error;
use crate::frontier::{frontier, Frontier};
use crate::memory_limit::MemoryLimit;
use crate::profile_costing::{read_profile, ProfileOptions};
use crate::reference::read_reference;
use crate::report::tidy;
use crate::search_space::{candidate_expressions, unlimited_challengers};
use crate::tune::{candidate_cuts, tune_challenged, tune_cuts, TuneReport};
use pipeweave_core::formats::csv::import_csv;
use pipeweave_core::{CutCosts, Plan, Profile, ProgramSet, StageCosts, StageMemory};
use pipeweave_transforms::Registry;

/// Where a profile comes from: a file (`--profile FILE.json`) or one already loaded (Python's
/// `pipeweave.Profile`).
#[derive(Clone, Debug, Default)]
pub enum ProfileSource {
    /// No profile: typed costs.
    #[default]
    None,
    /// A file to read.
    File(String),
    /// A profile in memory (boxed: a profile is large beside the other cases).
    Loaded(Box<Profile>),
}

/// The sizes, costs, memory and profile of one configuration: everything `plan` and `tune` share.
#[derive(Clone, Debug)]
pub struct ConfigRequest {
    /// Pipeline ranks.
    pub ranks: u32,
    /// Microbatches.
    pub microbatches: u32,
    /// Every rank's share's costs (replaced by a profile's).
    pub costs: StageCosts,
    /// The latency of one transfer between ranks.
    pub comm: f64,
    /// One microbatch's activation memory on a rank's share (replaced by a profile's).
    pub activation_memory: StageMemory,
    /// The per-rank limit: units, or bytes with a profile.
    pub memory_limit: Option<MemoryLimit>,
    /// Measured costs.
    pub profile: ProfileSource,
    /// How the profile costs the configuration (cut, tokens, cores).
    pub profile_options: ProfileOptions,
    /// `--ranks-per-link`: consecutive ranks on one host link (1: a link per rank).
    pub ranks_per_link: u32,
}

impl ConfigRequest {
    /// Unit costs, one unit of activations per microbatch, no limit, no profile.
    pub fn new(ranks: u32, microbatches: u32) -> ConfigRequest {
        ConfigRequest {
            ranks,
            microbatches,
            costs: StageCosts::default(),
            comm: 0.0,
            activation_memory: StageMemory::default(),
            memory_limit: None,
            profile: ProfileSource::None,
            profile_options: ProfileOptions::default(),
            ranks_per_link: 1,
        }
    }

    /// The profile, read where it is a file.
    pub fn profile(&self) -> Result<Option<Profile>, Error> {
        let profile = match &self.profile {
            ProfileSource::None => return Ok(None),
            ProfileSource::Loaded(p) => Profile::clone(p),
            ProfileSource::File(path) => read_profile(path)?,
        };
        // A profile's layers are measured, all-to-alls included where they have any: an
        // all-to-all cost on top names experts its model does not have.
        if self.costs.a2a() > 0.0 {
            return Err(Error::Option {
                option: "--costs",
                message: format!(
                    "a2a = {} is an all-to-all cost, but the profiled model has no experts",
                    pipeweave_core::show_number(self.costs.a2a())
                ),
            });
        }
        Ok(Some(profile))
    }

    /// The configuration before any profile or limit: sizes, typed costs and memory.
    fn base(&self) -> Result<PipelineConfig, Error> {
        PipelineConfig::new(self.ranks, self.microbatches)?
            .with_costs(self.costs, self.comm)?
            .with_memory(self.activation_memory)
            .with_ranks_per_link(self.ranks_per_link)
    }

    /// The configuration `plan` builds on: typed costs, or the profile's cut (then returned too),
    /// and the memory limit (bytes converted by the cut's unit).
    pub fn config(&self) -> Result<(PipelineConfig, Option<CutCosts>), Error> {
        let base = self.base()?;
        let (config, cut) = match self.profile()? {
            None => (base, None),
            Some(profile) => {
                let (config, cut) = self.profile_options.costed(base, &profile)?;
                (config, Some(cut))
            }
        };
        let limit = self.limit_in_units(cut.as_ref().map(|c| c.bytes_per_unit))?;
        Ok((config.with_memory_limit(limit), cut))
    }

    /// The ranked schedules (`tune`): with a profile, over the candidate cuts too (or the one
    /// `--layers-per-stage` gives). `progress` is called with the count of schedules built.
    /// An empty ranking is an error naming the limit.
    pub fn tune(&self, progress: &(dyn Fn(usize) + Sync)) -> Result<TuneReport, Error> {
        let base = self.base()?;
        let report = match self.profile()? {
            None => {
                let limit = self.limit_in_units(None)?;
                self.search(&base.with_memory_limit(limit), limit, progress)
            }
            Some(p) => {
                let cuts = match &self.profile_options.layers_per_stage {
                    Some(cut) => vec![cut.clone()],
                    None => candidate_cuts(p.free_layers(), self.ranks as usize, &p.pinned(), 64),
                };
                let options = &self.profile_options;
                let base = options.with_cores(options.with_tokens(base, &p)?, &p)?;
                tune_cuts(&base, &p, &cuts, &mut |config, cut| {
                    let limit = self.limit_in_units(Some(cut.bytes_per_unit))?;
                    Ok(self.search(&config.clone().with_memory_limit(limit), limit, progress))
                })?
            }
        };
        if report.candidates.is_empty() {
            return Err(Error::Option {
                option: "--memory-limit",
                message: format!(
                    "no schedule fits in {} per rank ({} tried)",
                    match &self.memory_limit {
                        None => "unlimited activations".to_string(),
                        Some(MemoryLimit::Units(units)) => pipeweave_core::show_number(*units),
                        Some(MemoryLimit::Bytes { written, .. }) => written.clone(),
                    },
                    report.evaluated
                ),
            });
        }
        Ok(report)
    }

    /// The limit in units (bytes converted by a cut's `bytes_per_unit`), or none.
    fn limit_in_units(&self, bytes_per_unit: Option<f64>) -> Result<Option<f64>, Error> {
        self.memory_limit
            .as_ref()
            .map(|limit| limit.in_units(bytes_per_unit))
            .transpose()
    }

    /// With a limit, the frontier's search (`auto` at every rung of its ladder up to the limit,
    /// then recompute and offload); without, every candidate expression and, where their
    /// placement could beat the best of those, `auto` with every microbatch held and the bases
    /// and blocks the limited search also tries ([`unlimited_challengers`]): never slower than
    /// the search at any limit.
    fn search(
        &self,
        config: &PipelineConfig,
        limit: Option<f64>,
        progress: &(dyn Fn(usize) + Sync),
    ) -> TuneReport {
        match limit {
            Some(_) => frontier(config, progress).ranked(),
            None => {
                // No rank holds more than every microbatch's activations: `auto` there searches
                // every limit's rungs.
                let ceiling = f64::from(self.microbatches) * config.memory().total();
                tune_challenged(
                    &Registry::builtin(),
                    config,
                    &candidate_expressions(self.ranks, self.microbatches, None, config.sequence()),
                    &unlimited_challengers(self.ranks, self.microbatches, tidy(ceiling)),
                    progress,
                )
            }
        }
    }

    /// The memory/time frontier (`tune --frontier`) of one cut: the given one or the even one.
    /// An empty frontier is an error naming the limit.
    pub fn frontier(&self, progress: &(dyn Fn(usize) + Sync)) -> Result<Frontier, Error> {
        let (config, _) = self.config()?;
        let found = frontier(&config, progress);
        if found.frontier.is_empty() {
            return Err(Error::Option {
                option: "--memory-limit",
                message: format!(
                    "no schedule fits in {} activations per rank ({} tried)",
                    config.memory_limit().unwrap_or(f64::INFINITY),
                    found.expressions
                ),
            });
        }
        Ok(found)
    }
}

/// A schedule file read as `check` reads it: a PyTorch CSV (compute-only or lowered, then with
/// its programs) or a reference JSON file, costed by `costs` and the latency `comm`.
pub fn import_schedule(
    path: &str,
    costs: StageCosts,
    comm: f64,
) -> Result<(Plan, Option<ProgramSet>), Error> {
    let text = crate::files::read_text(path)?;
    if path.ends_with(".json") {
        Ok((read_reference(path, &text, costs, comm)?, None))
    } else {
        let imported = import_csv(&text, costs, comm)?;
        Ok((imported.plan, imported.programs))
    }
}
