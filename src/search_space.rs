//! The space `tune` and `tune --frontier` search, in one place: which families of schedules
//! there are ([`Family`]) and which expressions each contributes at a configuration's sizes,
//! costs and memory limit. The fixed candidates ([`candidate_expressions`]: gpipe, 1F1B,
//! interleaving, ZB-H1/H2, `auto`, V-Half, V-Min, DualPipe, sequence splits), `auto`'s ladder on
//! the families of [`LADDER_FAMILIES`], the bases a residency pass fits to a limit
//! ([`LIMIT_BASES`]) and PipeOffload's building blocks ([`chunk_offload_expressions`]). The
//! residency stage's expressions, which depend on what the first stage found, are
//! [`crate::residency_search`]'s; the engine that builds and ranks them all is
//! [`crate::tune::tune_with`], driven by [`crate::frontier::frontier`].
//!
//! The candidates (fixed): `gpipe`; `f1b(gpipe)`; `vpp(f1b(gpipe), chunks=C)` for C = 2..4 and the
//! V layout; `zero_bubble` with `h1`, `h2` and `auto` on 1F1B, on interleaving (2 and 3 chunks,
//! the V layout) and, with `auto` at twice the 1F1B memory when the limit allows, on 1F1B; `auto`
//! on 4- and 8-chunk interleaving (at the limit where one is given); on problems of at most 300
//! ops, `policy=optimal` on 1F1B with a node budget; V-Half and V-Min (`policy=v_half`,
//! `policy=v_min`) on the V layout; `dual` and `zero_bubble(dual(..))` on 1F1B and 2-chunk
//! interleaving; with a profile's sequence, Seq1F1B's sequence splits.

use crate::config::PipelineConfig;
use pipeweave_core::TOLERANCE;
use std::fmt;

/// The family a searched expression belongs to: what the frontier's picture colours it by and
/// what its report calls it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// A schedule with one peak of its own (every candidate of [`candidate_expressions`], and
    /// PipeOffload's blocks without offload).
    Fixed,
    /// `zero_bubble(INNER, policy=auto, memory=r)` on one of [`LADDER_FAMILIES`], at a rung `r`.
    Ladder(&'static str),
    /// `recompute(BASE, memory=r)`: fits a base to a limit by recomputing activations.
    Recompute,
    /// `offload(BASE, memory=r)`: fits a base to a limit by moving activations to the host.
    Offload,
    /// `offload(BLOCK, chunks=K)`: PipeOffload's building block with whole chunks offloaded.
    ChunkOffload,
}

impl Family {
    /// Whether its plans move activations (recompute, offload, chunk offload): the frontier's
    /// residency points.
    pub fn moves_activations(self) -> bool {
        matches!(
            self,
            Family::Recompute | Family::Offload | Family::ChunkOffload
        )
    }

    /// The pass name of a residency family (`recompute`, `offload`); None for the others.
    pub fn residency_pass(self) -> Option<&'static str> {
        match self {
            Family::Recompute => Some("recompute"),
            Family::Offload => Some("offload"),
            _ => None,
        }
    }

    /// What the report calls the family of `expression`: the expression itself for a fixed
    /// schedule, `auto's ladder on INNER` for the ladder, the pass for the residency families.
    pub fn label(self, expression: &str) -> String {
        match self {
            Family::Fixed => expression.to_string(),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Family::Fixed => f.write_str("fixed schedules"),
            Family::Ladder(inner) => write!(f, "auto's ladder on {inner}"),
            Family::Recompute => f.write_str("recompute"),
            Family::Offload => f.write_str("offload"),
            Family::ChunkOffload => f.write_str("chunk offload"),
        }
    }
}

/// The most ops (F, I and W) a problem may have for `tune` to try `policy=optimal` on it.
pub const OPTIMAL_CANDIDATE_OPS: u32 = 300;

/// The node budget of `tune`'s `policy=optimal` candidate (deterministic: a time budget would
/// make the ranking depend on the machine).
pub const OPTIMAL_CANDIDATE_NODES: u32 = 200_000;

/// Every expression `tune` tries for `ranks` x `microbatches`, in tie-breaking order.
pub fn candidate_expressions(
    ranks: u32,
    microbatches: u32,
    memory_limit: Option<f64>,
    sequence: Option<u32>,
) -> Vec<String> {
    let mut out: Vec<String> = vec!["gpipe".into(), "f1b(gpipe)".into()];
    for chunks in 2..=4 {
        out.push(format!("vpp(f1b(gpipe), chunks={chunks})"));
    }
    out.push("vpp(f1b(gpipe), chunks=2, layout=v)".into());
    for policy in ["h1", "h2", "auto"] {
        out.push(format!("zero_bubble(f1b(gpipe), policy={policy})"));
    }
    let doubled = 2.0 * f64::from(ranks);
    if memory_limit.is_none_or(|l| l >= doubled) {
        out.push(format!(
            "zero_bubble(f1b(gpipe), policy=auto, memory={doubled})"
        ));
    }
    for inner in [
        "vpp(f1b(gpipe), chunks=2)",
        "vpp(f1b(gpipe), chunks=3)",
        "vpp(f1b(gpipe), chunks=2, layout=v)",
    ] {
        out.push(format!("zero_bubble({inner})"));
    }
    // The exact search where the problem is small.
    if ranks.saturating_mul(microbatches).saturating_mul(3) <= OPTIMAL_CANDIDATE_OPS {
        let memory = memory_limit.map_or(String::new(), |l| format!(", memory={l}"));
        out.push(format!(
            "zero_bubble(f1b(gpipe), policy=optimal{memory}, nodes={OPTIMAL_CANDIDATE_NODES})"
        ));
    }
    // Finer interleaving fills the pipeline faster (3M + (P - 1) / C at unit costs, which `auto`
    // reaches on 4 and 8 chunks), at the limit where one is given.
    for chunks in [4, 8] {
        let inner = format!("vpp(f1b(gpipe), chunks={chunks})");
        out.push(match memory_limit {
            Some(limit) => format!("zero_bubble({inner}, policy=auto, memory={limit})"),
            None => format!("zero_bubble({inner})"),
        });
    }
    for policy in ["v_half", "v_min"] {
        out.push(format!(
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy={policy})"
        ));
    }
    for inner in ["f1b(gpipe)", "vpp(f1b(gpipe), chunks=2)"] {
        out.push(format!("dual({inner})"));
        out.push(format!("zero_bubble(dual({inner}))"));
    }
    out.extend(seq_split_expressions(memory_limit, sequence));
    out
}

/// Sequence-split candidates (Seq1F1B), where the model has a sequence of `tokens` tokens to
/// split (a profile's `seq_len`; none without: abstract costs know no attention and no
/// per-chunk overhead, so splitting would always look free): 1F1B and ZB-V over 2, 4 and 8
/// chunks balanced by cost, and at a limit the zero-bubble search over 4 chunks within it.
pub fn seq_split_expressions(memory_limit: Option<f64>, tokens: Option<u32>) -> Vec<String> {
    let Some(tokens) = tokens else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for chunks in [2, 4, 8].into_iter().filter(|&k| k <= tokens) {
        out.push(format!(
            "seq_split(f1b(gpipe), chunks={chunks}, split=cost)"
        ));
    }
    if tokens >= 4 {
        out.push(
            "seq_split(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), chunks=4, split=cost)"
                .into(),
        );
        if let Some(limit) = memory_limit {
            out.push(format!(
                "seq_split(zero_bubble(f1b(gpipe)), chunks=4, split=cost, memory={limit})"
            ));
        }
    }
    out
}

/// Schedules a search adds beside its list only where they could beat the best of it: the
/// expressions of one placement, evaluated unless the placement's lower bound
/// ([`pipeweave_core::lower_bound`], which holds at every memory limit) shows that none of them
/// can be faster than the best found ([`crate::tune::tune_challenged`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Challengers {
    /// The placement they share, as an expression cheap to build (no schedule search).
    pub placement: String,
    /// The schedules of that placement.
    pub expressions: Vec<String>,
}

/// The inner plans on which a search with a memory limit runs `zero_bubble`'s `auto` at that
/// limit (its ladder, its default policy, or both): the search without a limit runs them with
/// every microbatch held ([`unlimited_challengers`]).
pub const LIMITED_AUTO_INNERS: [&str; 6] = [
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=3)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "vpp(f1b(gpipe), chunks=4)",
    "vpp(f1b(gpipe), chunks=8)",
];

/// The plans `dual` rewrites in the search: under a declared limit its counter-flow search holds
/// up to that limit, so the search without one gives it every microbatch (`dual(.., memory=N)`).
pub const DUAL_INNERS: [&str; 2] = ["f1b(gpipe)", "vpp(f1b(gpipe), chunks=2)"];

/// What the search without a memory limit adds to [`candidate_expressions`] so that it is never
/// slower than the search at any limit (`tune --memory-limit`, the frontier's): `auto` on each of
/// [`LIMITED_AUTO_INNERS`] at `ceiling` (every microbatch held: no limit searches more rungs),
/// `dual` on each of [`DUAL_INNERS`] with `ceiling` its budget (alone, with DeepSeek's split
/// backwards and with `auto`), the residency stage's bases of [`LIMIT_BASES`] the list lacks, and
/// PipeOffload's blocks without offload ([`chunk_offload_expressions`]; offloading whole chunks
/// only adds transfers to a block's order). Each group is a placement's: see [`Challengers`].
pub fn unlimited_challengers(ranks: u32, microbatches: u32, ceiling: f64) -> Vec<Challengers> {
    let listed = candidate_expressions(ranks, microbatches, None, None);
    let mut out: Vec<Challengers> = LIMITED_AUTO_INNERS
        .iter()
        .map(|inner| Challengers {
            placement: (*inner).to_string(),
            expressions: vec![ladder_expression(inner, ceiling)],
        })
        .collect();
    for inner in DUAL_INNERS {
        let dual = format!("dual({inner}, memory={ceiling})");
        out.push(Challengers {
            placement: format!("dual({inner})"),
            expressions: vec![
                dual.clone(),
                format!("zero_bubble({dual})"),
                ladder_expression(&dual, ceiling),
            ],
        });
    }
    for base in LIMIT_BASES {
        let group = match out.iter_mut().find(|g| g.placement == base) {
            Some(group) => group,
            None => {
                out.push(Challengers {
                    placement: base.to_string(),
                    expressions: Vec::new(),
                });
                out.last_mut().expect("a group was just pushed")
            }
        };
        if !listed.iter().any(|e| e == base) {
            group.expressions.push(base.to_string());
        }
    }
    for chunks in CHUNK_OFFLOAD_CHUNKS {
        let placement = interleaved(chunks);
        let blocks = chunk_offload_groups(ranks, microbatches)
            .into_iter()
            .map(|group| chunk_offload_block(chunks, group));
        match out.iter_mut().find(|g| g.placement == placement) {
            Some(known) => known.expressions.extend(blocks),
            None => out.push(Challengers {
                placement,
                expressions: blocks.collect(),
            }),
        }
    }
    out
}

/// The inner plans whose `zero_bubble(..., policy=auto, memory=r)` runs on the ladder.
pub const LADDER_FAMILIES: [&str; 3] = [
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
];

/// The ladder's limits for `ranks` ranks and one microbatch's activations `total`, up to `cap`.
pub fn ladder(ranks: u32, total: f64, cap: Option<f64>) -> Vec<f64> {
    let step = total / 2.0;
    let top = 2.0 * f64::from(ranks) * total;
    let top = cap.map_or(top, |c| c.min(top));
    (1..)
        .map(|k| f64::from(k) * step)
        .take_while(|r| *r <= top + TOLERANCE)
        .collect()
}

fn ladder_expression(inner: &str, limit: f64) -> String {
    format!("zero_bubble({inner}, policy=auto, memory={limit})")
}

/// Every expression of the search, with its family, in tie-breaking order; the ladder stops at
/// the config's memory limit.
pub fn frontier_expressions(config: &PipelineConfig) -> Vec<(String, Family)> {
    let cap = config.memory_limit();
    let mut out: Vec<(String, Family)> = candidate_expressions(
        config.ranks(),
        config.microbatches(),
        cap,
        config.sequence(),
    )
    .into_iter()
    .map(|e| (e, Family::Fixed))
    .collect();
    for limit in ladder(config.ranks(), config.memory().total(), cap) {
        for inner in LADDER_FAMILIES {
            out.push((ladder_expression(inner, limit), Family::Ladder(inner)));
        }
    }
    out
}

/// The passes of the residency stage, which fit a plan to a limit by moving its activations.
pub const RESIDENCY_PASSES: [Family; 2] = [Family::Recompute, Family::Offload];

/// The schedules the frontier's picture names beside their dots (expression, name).
pub const NAMED_SCHEDULES: [(&str, &str); 7] = [
    ("gpipe", "GPipe"),
    ("f1b(gpipe)", "1F1B"),
    ("zero_bubble(f1b(gpipe), policy=h1)", "ZB-H1"),
    ("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", "ZB-V"),
    (
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=v_half)",
        "V-Half",
    ),
    (
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v), policy=v_min)",
        "V-Min",
    ),
    ("zero_bubble(dual(f1b(gpipe)))", "DualPipe"),
];

/// The base below the knees whose backwards are whole (its activations can all move).
pub const WHOLE_BACKWARDS_BASE: &str = LIMIT_BASES[0];

/// The bases the residency stage also fits to a user's limit itself: whole-backward schedules
/// (every activation can move) from 1F1B to 8-chunk interleaving, whose peaks lie above the
/// limit, so the kept frontier within it never names them. PipeOffload's low-memory points are
/// offloaded interleavings of this kind; more chunks hold less per microbatch in flight (at
/// P = 8, M = 32, a transfer a quarter of a forward: 8 chunks reach a quarter unit at 103.2).
pub const LIMIT_BASES: [&str; 8] = [
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=3)",
    "vpp(f1b(gpipe), chunks=4)",
    "vpp(f1b(gpipe), chunks=5)",
    "vpp(f1b(gpipe), chunks=6)",
    "vpp(f1b(gpipe), chunks=7)",
    "vpp(f1b(gpipe), chunks=8)",
];

/// The chunk counts of PipeOffload's building block the residency stage offloads whole chunks
/// of (`offload(..., chunks=K)`), as their sweep does: more chunks hold less per microbatch.
pub const CHUNK_OFFLOAD_CHUNKS: std::ops::RangeInclusive<u32> = 2..=8;

/// PipeOffload's own points: `offload(zero_bubble(vpp(f1b(gpipe), chunks=C, group=G,
/// order=block), policy=in_place), chunks=K)` (their group building block, its backwards split
/// in place, its first `K` chunks offloaded in slots of the link) for every `C` of
/// [`CHUNK_OFFLOAD_CHUNKS`], each group `G` of [`chunk_offload_groups`] and `K` from 1 to `C` (the family `offload`), and each block without offload (`K = 0`, a fixed schedule).
/// Their peaks follow from `K` and the link's speed, not from a limit, so the frontier keeps
/// those that fit.
pub fn chunk_offload_expressions(ranks: u32, microbatches: u32) -> Vec<(String, Family)> {
    let mut out = Vec::new();
    for c in CHUNK_OFFLOAD_CHUNKS {
        for g in chunk_offload_groups(ranks, microbatches) {
            let base = chunk_offload_block(c, g);
            out.push((base.clone(), Family::Fixed));
            for k in 1..=c {
                out.push((format!("offload({base}, chunks={k})"), Family::ChunkOffload));
            }
        }
    }
    out
}

/// PipeOffload's building block of `chunks` chunks in groups of `group` microbatches, its
/// backwards split in place.
fn chunk_offload_block(chunks: u32, group: u32) -> String {
    format!("zero_bubble(vpp(f1b(gpipe), chunks={chunks}, group={group}, order=block), policy=in_place)")
}

/// The interleaved placement of `chunks` chunks per rank (1F1B's for one).
fn interleaved(chunks: u32) -> String {
    if chunks <= 1 {
        "f1b(gpipe)".to_string()
    } else {
        format!("vpp(f1b(gpipe), chunks={chunks})")
    }
}

/// The groups of PipeOffload's building block the residency stage tries: those their README
/// recommends (`ceil(P/2)` to `P`) and the powers of two below (their slow-link points use
/// groups of 1, 2 and 4), at most `microbatches`.
pub fn chunk_offload_groups(ranks: u32, microbatches: u32) -> Vec<u32> {
    let half = ranks.div_ceil(2);
    let below = std::iter::successors(Some(1u32), |g| g.checked_mul(2)).take_while(|&g| g < half);
    below
        .chain(half..=ranks)
        .filter(|&g| g <= microbatches)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ladder_steps_by_half_a_microbatch_up_to_twice_1f1b() {
        assert_eq!(
            ladder(2, 1.0, None),
            [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
        );
        assert_eq!(ladder(2, 1.0, Some(1.2)), [0.5, 1.0]);
    }

    #[test]
    fn families_are_labelled_as_the_report_names_them() {
        assert_eq!(Family::Fixed.label("f1b(gpipe)"), "f1b(gpipe)");
        assert_eq!(
            Family::Ladder(LADDER_FAMILIES[0]).label("x"),
            "auto's ladder on f1b(gpipe)"
        );
        assert_eq!(Family::Recompute.label("x"), "recompute");
        assert_eq!(Family::ChunkOffload.label("x"), "chunk offload");
        assert!(Family::Offload.moves_activations() && !Family::Ladder("x").moves_activations());
        assert_eq!(Family::Offload.residency_pass(), Some("offload"));
        assert_eq!(Family::Fixed.residency_pass(), None);
    }

    #[test]
    fn the_frontier_lists_fixed_candidates_then_the_ladder() {
        let config = PipelineConfig::new(2, 4).unwrap();
        let listed = frontier_expressions(&config);
        assert_eq!(listed[0], ("gpipe".to_string(), Family::Fixed));
        let ladder_jobs = listed
            .iter()
            .filter(|(_, f)| matches!(f, Family::Ladder(_)));
        // Eight rungs (half a microbatch up to 4) on each of the three families.
        assert_eq!(ladder_jobs.count(), 8 * LADDER_FAMILIES.len());
        let blocks = chunk_offload_expressions(2, 4);
        assert!(blocks
            .iter()
            .any(|(e, f)| *f == Family::ChunkOffload && e.ends_with("chunks=2)")));
    }
}
