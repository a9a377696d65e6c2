//! The problem a schedule solves: ranks, microbatches, stages placed on ranks, routes, tied stages.
//!
//! A [`ProblemSpec`] is what a user writes (with its typed builder); [`ProblemSpec::validate`] turns
//! it into a [`Problem`], which cannot be inconsistent: every stage sits on an existing rank, every
//! rank holds a stage, routes cover the microbatches `0..M` exactly once with distinct, in-range
//! stages, and every stage is on some route. Without explicit routes, every microbatch flows through
//! stages `0..S` in order.
//!
//! A route is the ordered list of stages a microbatch's forward passes through; its backward runs the
//! route in reverse. DualPipe, for example, sends half of the microbatches through mirrored replicas
//! of the stages (`tied_stages` says which stages share weights).

use crate::error::CoreError;
use crate::ir::ids::{MicrobatchId, RankId, StageId};
use typed_builder::TypedBuilder;

/// Largest rank count a problem may have.
pub const MAX_RANKS: u32 = 4096;
/// Largest microbatch count a problem may have.
pub const MAX_MICROBATCHES: u32 = 1 << 20;
/// Largest stage count a problem may have.
pub const MAX_STAGES: u32 = 1 << 16;
/// Largest number of (stage, microbatch) pairs, i.e. a third of the ops, a problem may have.
pub const MAX_STAGE_MICROBATCH_PAIRS: u64 = 1 << 24;

/// Marks "stage not on this route" in a route's position table.
const ABSENT: u32 = u32::MAX;

/// A route as a user writes it: microbatches `first..end` flow through `stages` in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteSpec {
    /// First microbatch of the range.
    pub first: u32,
    /// One past the last microbatch of the range.
    pub end: u32,
    /// The stages in flow order.
    pub stages: Vec<u32>,
}

/// What a user writes to describe a problem; validated by [`ProblemSpec::validate`].
#[derive(Clone, Debug, TypedBuilder)]
pub struct ProblemSpec {
    /// Number of pipeline ranks.
    ranks: u32,
    /// Number of microbatches in one training step.
    microbatches: u32,
    /// Stage index -> rank. Default: one stage per rank, stage `s` on rank `s`.
    #[builder(default, setter(strip_option))]
    stage_to_rank: Option<Vec<u32>>,
    /// Routes; default: every microbatch through stages `0..S`.
    #[builder(default)]
    routes: Vec<RouteSpec>,
    /// Groups of stages that share one set of weights.
    #[builder(default)]
    tied_stages: Vec<Vec<u32>>,
    /// Sequence chunks per sample group (Seq1F1B): with `k > 1`, each run of `k` consecutive
    /// microbatches is one group's sequence cut into `k` chunks in order, and chunk `c` depends
    /// on the chunks before it on every stage (see [`crate::ir::deps`]). Default 1: no split.
    #[builder(default = 1)]
    seq_chunks: u32,
    /// Where the chunks end, as fractions of the sequence: `seq_chunks + 1` increasing values
    /// from 0 to 1 (a [`crate::ir::sequence::SequenceCut`]'s); empty: equal parts.
    #[builder(default)]
    seq_bounds: Vec<f64>,
}

/// One validated route.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    first: MicrobatchId,
    end: MicrobatchId,
    stages: Vec<StageId>,
    /// Stage index -> position on this route, or `ABSENT`.
    position: Vec<u32>,
}

impl Route {
    /// First microbatch on this route.
    pub fn first(&self) -> MicrobatchId {
        self.first
    }
    /// One past the last microbatch on this route.
    pub fn end(&self) -> MicrobatchId {
        self.end
    }
    /// Stages in flow order.
    pub fn stages(&self) -> &[StageId] {
        &self.stages
    }
    /// Whether `stage` is on this route.
    pub fn contains(&self, stage: StageId) -> bool {
        self.position
            .get(stage.index())
            .is_some_and(|&p| p != ABSENT)
    }
    /// The stage after `stage` on this route (None at the route's end or if absent).
    pub fn next(&self, stage: StageId) -> Option<StageId> {
        let pos = *self.position.get(stage.index())?;
        if pos == ABSENT {
            return None;
        }
        self.stages.get(pos as usize + 1).copied()
    }
    /// The stage before `stage` on this route (None at the route's start or if absent).
    pub fn prev(&self, stage: StageId) -> Option<StageId> {
        let pos = *self.position.get(stage.index())?;
        if pos == ABSENT || pos == 0 {
            return None;
        }
        self.stages.get(pos as usize - 1).copied()
    }
    /// The last stage of the route, where the loss is computed.
    pub fn last(&self) -> StageId {
        *self
            .stages
            .last()
            .expect("validated routes are never empty")
    }
}

/// A validated problem description. Fields are private; it can only come from
/// [`ProblemSpec::validate`], so every instance is consistent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    ranks: u32,
    microbatches: u32,
    stage_to_rank: Vec<RankId>,
    routes: Vec<Route>,
    /// Whether the routes were given explicitly (affects serialisation only).
    explicit_routes: bool,
    tied_stages: Vec<Vec<StageId>>,
    /// Microbatch -> index into `routes`.
    route_of: Vec<u32>,
    /// Sequence chunks per sample group (1: none).
    seq_chunks: u32,
    /// The chunks' boundaries as fractions of the sequence, by their bits (compared and hashed
    /// as data).
    seq_bounds: Vec<u64>,
}

fn check_size(what: &'static str, value: u64, max: u64) -> Result<(), CoreError> {
    checked_size(what, i128::from(value), max).map(|_| ())
}

/// A count a user gives (`ranks`, `microbatches`, ...) as a `u32`, or the error naming it and its
/// range `1..=max`: the one range check of the command line, Python and the problem alike.
pub fn checked_size(what: &'static str, value: i128, max: u64) -> Result<u32, CoreError> {
    match u32::try_from(value) {
        Ok(count) if count >= 1 && u64::from(count) <= max => Ok(count),
        _ => Err(CoreError::SizeOutOfRange {
            what,
            value,
            constraint: format!("must be between 1 and {max}"),
        }),
    }
}

impl ProblemSpec {
    /// DeepSeek's DualPipe layout on `ranks` ranks: stage `i` on rank `i` and its mirror `P + i`
    /// (tied to it) on rank `P - 1 - i`; the first `M / 2` microbatches flow through stages
    /// `0..P`, the others through `P..2P`.
    pub fn dualpipe(ranks: u32, microbatches: u32) -> ProblemSpec {
        let half = microbatches / 2;
        let placement = (0..ranks)
            .chain((0..ranks).map(|i| ranks - 1 - i))
            .collect();
        ProblemSpec::builder()
            .ranks(ranks)
            .microbatches(microbatches)
            .stage_to_rank(placement)
            .routes(vec![
                RouteSpec {
                    first: 0,
                    end: half,
                    stages: (0..ranks).collect(),
                },
                RouteSpec {
                    first: half,
                    end: microbatches,
                    stages: (ranks..2 * ranks).collect(),
                },
            ])
            .tied_stages((0..ranks).map(|i| vec![i, ranks + i]).collect())
            .build()
    }

    /// Checks every rule in the module doc and builds the [`Problem`].
    pub fn validate(self) -> Result<Problem, CoreError> {
        check_size("ranks", self.ranks.into(), MAX_RANKS.into())?;
        check_size(
            "microbatches",
            self.microbatches.into(),
            MAX_MICROBATCHES.into(),
        )?;
        let placement = self
            .stage_to_rank
            .unwrap_or_else(|| (0..self.ranks).collect());
        check_size("stages", placement.len() as u64, MAX_STAGES.into())?;
        let pairs = placement.len() as u64 * u64::from(self.microbatches);
        if pairs > MAX_STAGE_MICROBATCH_PAIRS {
            return Err(CoreError::SizeOutOfRange {
                what: "stages x microbatches",
                value: i128::from(pairs),
                constraint: format!("must be at most {MAX_STAGE_MICROBATCH_PAIRS}"),
            });
        }
        let stage_count = placement.len();
        let mut holds_stage = vec![false; self.ranks as usize];
        for (stage, &rank) in placement.iter().enumerate() {
            if rank >= self.ranks {
                return Err(CoreError::InvalidProblem(format!(
                    "stage {stage} is placed on rank {rank}, but there are only {} ranks",
                    self.ranks
                )));
            }
            holds_stage[rank as usize] = true;
        }
        if let Some(idle) = holds_stage.iter().position(|&h| !h) {
            return Err(CoreError::InvalidProblem(format!(
                "rank {idle} holds no stage; every rank must hold at least one"
            )));
        }
        let explicit_routes = !self.routes.is_empty();
        let route_specs = if explicit_routes {
            self.routes
        } else {
            vec![RouteSpec {
                first: 0,
                end: self.microbatches,
                stages: (0..stage_count as u32).collect(),
            }]
        };
        let (routes, route_of) = validate_routes(route_specs, stage_count, self.microbatches)?;
        let tied_stages = validate_tied(self.tied_stages, stage_count)?;
        check_seq_chunks(self.seq_chunks, self.microbatches, &routes)?;
        let seq_bounds = check_seq_bounds(self.seq_chunks, self.seq_bounds)?;
        Ok(Problem {
            ranks: self.ranks,
            microbatches: self.microbatches,
            stage_to_rank: placement.into_iter().map(RankId::new).collect(),
            routes,
            explicit_routes,
            tied_stages,
            route_of,
            seq_chunks: self.seq_chunks,
            seq_bounds: seq_bounds.into_iter().map(f64::to_bits).collect(),
        })
    }
}

/// How pictures and traces name `microbatch` of a problem with `seq_chunks` chunks per sample
/// group: its number, or its group and chunk (`3.1`).
pub fn microbatch_label(seq_chunks: u32, microbatch: MicrobatchId) -> String {
    if seq_chunks > 1 {
        let m = microbatch.get();
        format!("{}.{}", m / seq_chunks, m % seq_chunks)
    } else {
        microbatch.get().to_string()
    }
}

/// The chunks' boundaries: `chunks + 1` increasing fractions from 0 to 1, equal parts where
/// none are given.
fn check_seq_bounds(chunks: u32, bounds: Vec<f64>) -> Result<Vec<f64>, CoreError> {
    if bounds.is_empty() {
        let k = f64::from(chunks.max(1));
        return Ok((0..=chunks).map(|c| f64::from(c) / k).collect());
    }
    let increasing = bounds.windows(2).all(|w| w[0] < w[1]);
    if bounds.len() != chunks as usize + 1
        || bounds.first() != Some(&0.0)
        || bounds.last() != Some(&1.0)
        || !increasing
    {
        return Err(CoreError::InvalidProblem(format!(
            "seq_bounds {bounds:?} must be {} increasing fractions from 0 to 1, one more than \
             the {chunks} sequence chunks",
            chunks + 1
        )));
    }
    Ok(bounds)
}

/// Holds sequence chunks to their problem: at least one per group, the microbatches whole
/// groups, and every group's chunks on one route (a route starts at a group's first chunk).
fn check_seq_chunks(chunks: u32, microbatches: u32, routes: &[Route]) -> Result<(), CoreError> {
    if chunks == 0 || chunks > crate::ir::sequence::MAX_SEQ_CHUNKS {
        return Err(CoreError::InvalidProblem(format!(
            "seq_chunks = {chunks}; a sequence is cut into 1 to {} chunks",
            crate::ir::sequence::MAX_SEQ_CHUNKS
        )));
    }
    if microbatches % chunks != 0 {
        return Err(CoreError::InvalidProblem(format!(
            "{microbatches} microbatches are not whole groups of {chunks} sequence chunks"
        )));
    }
    if let Some((index, route)) = routes
        .iter()
        .enumerate()
        .find(|(_, r)| r.first.get() % chunks != 0)
    {
        return Err(CoreError::InvalidProblem(format!(
            "route {index} starts at microbatch {}, inside a group of {chunks} sequence chunks",
            route.first.get()
        )));
    }
    Ok(())
}

fn validate_routes(
    specs: Vec<RouteSpec>,
    stage_count: usize,
    microbatches: u32,
) -> Result<(Vec<Route>, Vec<u32>), CoreError> {
    let mut route_of = vec![u32::MAX; microbatches as usize];
    let mut stage_used = vec![false; stage_count];
    let mut routes = Vec::with_capacity(specs.len());
    for (index, spec) in specs.into_iter().enumerate() {
        if spec.first >= spec.end || spec.end > microbatches {
            return Err(CoreError::InvalidProblem(format!(
                "route {index} covers microbatches {}..{}, which is empty or beyond the {microbatches} microbatches",
                spec.first, spec.end
            )));
        }
        if spec.stages.is_empty() {
            return Err(CoreError::InvalidProblem(format!(
                "route {index} has no stages"
            )));
        }
        let mut position = vec![ABSENT; stage_count];
        for (pos, &stage) in spec.stages.iter().enumerate() {
            let slot = position.get_mut(stage as usize).ok_or_else(|| {
                CoreError::InvalidProblem(format!(
                    "route {index} names stage {stage}, but there are only {stage_count} stages"
                ))
            })?;
            if *slot != ABSENT {
                return Err(CoreError::InvalidProblem(format!(
                    "route {index} passes stage {stage} twice"
                )));
            }
            *slot = pos as u32;
            stage_used[stage as usize] = true;
        }
        for mb in spec.first..spec.end {
            let entry = &mut route_of[mb as usize];
            if *entry != u32::MAX {
                return Err(CoreError::InvalidProblem(format!(
                    "microbatch {mb} is on routes {} and {index}",
                    *entry
                )));
            }
            *entry = index as u32;
        }
        routes.push(Route {
            first: MicrobatchId::new(spec.first),
            end: MicrobatchId::new(spec.end),
            stages: spec.stages.into_iter().map(StageId::new).collect(),
            position,
        });
    }
    if let Some(mb) = route_of.iter().position(|&r| r == u32::MAX) {
        return Err(CoreError::InvalidProblem(format!(
            "microbatch {mb} is on no route"
        )));
    }
    if let Some(stage) = stage_used.iter().position(|&u| !u) {
        return Err(CoreError::InvalidProblem(format!(
            "stage {stage} is on no route"
        )));
    }
    Ok((routes, route_of))
}

fn validate_tied(
    groups: Vec<Vec<u32>>,
    stage_count: usize,
) -> Result<Vec<Vec<StageId>>, CoreError> {
    let mut seen = vec![false; stage_count];
    let mut out = Vec::with_capacity(groups.len());
    for (index, group) in groups.into_iter().enumerate() {
        if group.len() < 2 {
            return Err(CoreError::InvalidProblem(format!(
                "tied group {index} has {} stage(s); a group ties at least two",
                group.len()
            )));
        }
        for &stage in &group {
            let slot = seen.get_mut(stage as usize).ok_or_else(|| {
                CoreError::InvalidProblem(format!(
                    "tied group {index} names stage {stage}, but there are only {stage_count} stages"
                ))
            })?;
            if *slot {
                return Err(CoreError::InvalidProblem(format!(
                    "stage {stage} is in more than one tied group"
                )));
            }
            *slot = true;
        }
        out.push(group.into_iter().map(StageId::new).collect());
    }
    Ok(out)
}

impl Problem {
    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }
    /// Number of microbatches.
    pub fn microbatches(&self) -> u32 {
        self.microbatches
    }
    /// Number of (global) stages.
    pub fn stages(&self) -> u32 {
        self.stage_to_rank.len() as u32
    }
    /// Stage -> rank placement.
    pub fn stage_to_rank(&self) -> &[RankId] {
        &self.stage_to_rank
    }
    /// The rank that owns `stage`, or None when the stage is out of range.
    pub fn rank_of(&self, stage: StageId) -> Option<RankId> {
        self.stage_to_rank.get(stage.index()).copied()
    }
    /// The stages a rank holds, in increasing stage order.
    pub fn stages_of(&self, rank: RankId) -> Vec<StageId> {
        self.stage_to_rank
            .iter()
            .enumerate()
            .filter(|(_, &r)| r == rank)
            .map(|(s, _)| StageId::new(s as u32))
            .collect()
    }
    /// All routes.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }
    /// Whether the routes were given explicitly rather than defaulted.
    pub fn has_explicit_routes(&self) -> bool {
        self.explicit_routes
    }
    /// The route of a microbatch, or None when it is out of range.
    pub fn route_of(&self, microbatch: MicrobatchId) -> Option<&Route> {
        let index = *self.route_of.get(microbatch.index())?;
        self.routes.get(index as usize)
    }
    /// Sequence chunks per sample group: 1 without a split (see [`ProblemSpec`]'s field).
    pub fn seq_chunks(&self) -> u32 {
        self.seq_chunks
    }
    /// Whether the microbatches are sequence chunks of fewer sample groups.
    pub fn is_seq_split(&self) -> bool {
        self.seq_chunks > 1
    }
    /// Where the sequence chunks end, as fractions of the sequence (`seq_chunks + 1` values from
    /// 0 to 1).
    pub fn seq_bounds(&self) -> Vec<f64> {
        self.seq_bounds.iter().map(|b| f64::from_bits(*b)).collect()
    }
    /// The chunks' boundaries on a sequence of `tokens` tokens: whole tokens, at least one per
    /// chunk (an error where the sequence has fewer tokens than chunks).
    pub fn seq_token_bounds(&self, tokens: u32) -> Result<Vec<u32>, CoreError> {
        crate::ir::sequence::SequenceCut::on_tokens(&self.seq_bounds(), tokens)
    }
    /// The sample groups (microbatches before a sequence split): `microbatches / seq_chunks`.
    pub fn sample_groups(&self) -> u32 {
        self.microbatches / self.seq_chunks
    }
    /// `microbatch`'s sample group and its chunk in that group's sequence.
    pub fn seq_chunk_of(&self, microbatch: MicrobatchId) -> (u32, u32) {
        (
            microbatch.get() / self.seq_chunks,
            microbatch.get() % self.seq_chunks,
        )
    }
    /// How reports count the microbatches: `8 microbatches`, or with sequence chunks
    /// `4 microbatches in 2 sequence chunks each`.
    pub fn describe_microbatches(&self) -> String {
        if self.is_seq_split() {
            format!(
                "{} microbatches in {} sequence chunks each",
                self.sample_groups(),
                self.seq_chunks
            )
        } else {
            format!("{} microbatches", self.microbatches)
        }
    }
    /// How pictures and traces name `microbatch`: its number, or with sequence chunks its
    /// sample group and chunk (`3.1`: chunk 1 of group 3).
    pub fn microbatch_label(&self, microbatch: MicrobatchId) -> String {
        microbatch_label(self.seq_chunks, microbatch)
    }
    /// Tied stage groups.
    pub fn tied_stages(&self) -> &[Vec<StageId>] {
        &self.tied_stages
    }
    /// Whether the (stage, microbatch) pair exists: both in range and the stage on the route.
    pub fn has_work(&self, stage: StageId, microbatch: MicrobatchId) -> bool {
        self.route_of(microbatch)
            .is_some_and(|route| route.contains(stage))
    }
    /// Number of (stage, microbatch) pairs that exist.
    pub fn work_count(&self) -> usize {
        self.routes
            .iter()
            .map(|r| (r.end.get() - r.first.get()) as usize * r.stages.len())
            .sum()
    }
    /// Whether this is the plain layout: one stage per rank, stage `s` on rank `s`, one route
    /// through all stages in order.
    pub fn is_linear(&self) -> bool {
        self.stage_to_rank.len() == self.ranks as usize
            && self
                .stage_to_rank
                .iter()
                .enumerate()
                .all(|(s, r)| r.index() == s)
            && self.routes.len() == 1
            && self.tied_stages.is_empty()
            && self.routes[0]
                .stages
                .iter()
                .enumerate()
                .all(|(i, s)| s.index() == i)
    }
    /// The route specs this problem was built from (for serialisation and rebuilding).
    pub fn route_specs(&self) -> Vec<RouteSpec> {
        self.routes
            .iter()
            .map(|r| RouteSpec {
                first: r.first.get(),
                end: r.end.get(),
                stages: r.stages.iter().map(|s| s.get()).collect(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(ranks: u32, microbatches: u32) -> Result<Problem, CoreError> {
        ProblemSpec::builder()
            .ranks(ranks)
            .microbatches(microbatches)
            .build()
            .validate()
    }

    /// Why `spec` is refused.
    fn refusal(spec: ProblemSpec) -> String {
        spec.validate().unwrap_err().to_string()
    }

    /// Two ranks and `microbatches` microbatches, stage `s` on rank `stage_to_rank[s]`.
    fn placed(microbatches: u32, stage_to_rank: Vec<u32>) -> ProblemSpec {
        ProblemSpec::builder()
            .ranks(2)
            .microbatches(microbatches)
            .stage_to_rank(stage_to_rank)
            .build()
    }

    /// Two ranks and `microbatches` microbatches on one route: `0..end` through `stages`.
    fn routed(microbatches: u32, end: u32, stages: Vec<u32>) -> ProblemSpec {
        ProblemSpec::builder()
            .ranks(2)
            .microbatches(microbatches)
            .routes(vec![RouteSpec {
                first: 0,
                end,
                stages,
            }])
            .build()
    }

    #[test]
    fn default_problem_is_linear() {
        let p = linear(4, 8).unwrap();
        assert!(p.is_linear());
        assert_eq!(p.stages(), 4);
        assert_eq!(p.work_count(), 32);
        let route = p.route_of(MicrobatchId::new(3)).unwrap();
        assert_eq!(route.next(StageId::new(1)), Some(StageId::new(2)));
        assert_eq!(route.prev(StageId::new(0)), None);
        assert_eq!(route.last(), StageId::new(3));
    }

    #[test]
    fn zero_and_absurd_sizes_are_rejected() {
        for (ranks, mbs, what) in [(0, 4, "ranks"), (4, 0, "microbatches"), (5000, 4, "ranks")] {
            match linear(ranks, mbs) {
                Err(CoreError::SizeOutOfRange { what: w, .. }) => assert_eq!(w, what),
                other => panic!("expected a size error for {what}, got {other:?}"),
            }
        }
        let err = linear(4096, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("stages x microbatches"), "{err}");
    }

    #[test]
    fn placement_errors_name_the_stage_and_rank() {
        assert_eq!(
            refusal(placed(2, vec![0, 2])),
            "invalid problem: stage 1 is placed on rank 2, but there are only 2 ranks"
        );
        let err = refusal(placed(2, vec![0, 0]));
        assert!(err.contains("rank 1 holds no stage"), "{err}");
    }

    #[test]
    fn dualpipe_routes_validate_and_bad_routes_do_not() {
        let ok = ProblemSpec::dualpipe(2, 4).validate().unwrap();
        assert_eq!(ok.tied_stages().len(), 2);
        assert!(!ok.has_work(StageId::new(2), MicrobatchId::new(0)));
        assert!(ok.has_work(StageId::new(2), MicrobatchId::new(3)));
        assert_eq!(ok.work_count(), 8);
        assert!(!ok.is_linear());

        let tied = ProblemSpec::builder()
            .ranks(2)
            .microbatches(1)
            .tied_stages(vec![vec![0]])
            .build();
        for (spec, why) in [
            (routed(4, 3, vec![0, 1]), "microbatch 3 is on no route"),
            (routed(1, 1, vec![0, 1, 0]), "passes stage 0 twice"),
            (tied, "ties at least two"),
        ] {
            let err = refusal(spec);
            assert!(err.contains(why), "{err}");
        }
    }
}
