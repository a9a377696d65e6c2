//! PipeOffload's building block against sail-sg's own generator: on every size of
//! `tests/fixtures/group_block_sailsg.json` (made by `tools/group_block_sailsg.py` from their
//! `group_interleaved_1f1b.py`), `vpp(f1b(gpipe), chunks=C, group=g, order=block)` runs their
//! order op for op (their W right after its B being our full backward), and with its backwards
//! split (`zero_bubble(...)`) it is no slower than their schedule at unit costs; split in place
//! (`policy=in_place`) it is their F, B, W order op for op.

mod common;

use common::*;
use pipeweave::{build_plan, PipelineConfig};
use pipeweave_core::{simulate, TOLERANCE};

/// One size of the fixture where their block exists.
struct Size {
    ranks: u32,
    microbatches: u32,
    chunks: u32,
    group: u32,
    /// Their schedule's length in slots of a chunk's F, B or W.
    slots: u32,
    /// Their per-rank orders in action notation.
    orders: Vec<Vec<String>>,
}

fn sizes() -> Vec<Size> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/group_block_sailsg.json"
    );
    let file = read_json(path);
    let sizes: Vec<Size> = file
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["exists"].as_bool() == Some(true))
        .map(|s| Size {
            ranks: field(s, "ranks"),
            microbatches: field(s, "microbatches"),
            chunks: field(s, "chunks"),
            group: field(s, "group"),
            slots: field(s, "slots"),
            orders: reference_orders(&serde_json::json!({ "order": s["orders"] })),
        })
        .collect();
    assert!(sizes.len() >= 100, "expected the fixture's sizes");
    sizes
}

#[test]
fn the_block_is_sail_sgs_order_op_for_op() {
    for s in sizes() {
        let (c, g) = (s.chunks, s.group);
        let expression = format!("vpp(f1b(gpipe), chunks={c}, group={g}, order=block)");
        let config = PipelineConfig::new(s.ranks, s.microbatches).unwrap();
        let plan = build_plan(&expression, &config).unwrap_or_else(|e| panic!("{expression}: {e}"));
        let at = format!("{expression} at P={} M={}", s.ranks, s.microbatches);
        assert_eq!(plan_orders(&plan), s.orders, "{at}");
    }
}

#[test]
fn split_it_is_no_slower_than_theirs() {
    for s in sizes() {
        let (c, g) = (s.chunks, s.group);
        let theirs = f64::from(s.slots) / f64::from(c);
        let expression =
            format!("zero_bubble(vpp(f1b(gpipe), chunks={c}, group={g}, order=block))");
        let config = PipelineConfig::new(s.ranks, s.microbatches).unwrap();
        let plan = build_plan(&expression, &config).unwrap_or_else(|e| panic!("{expression}: {e}"));
        let ours = simulate(&plan).unwrap().makespan();
        assert!(
            ours <= theirs + TOLERANCE,
            "{expression} at P={} M={}: {ours} against their {theirs}",
            s.ranks,
            s.microbatches
        );
    }
}

#[test]
fn split_in_place_it_runs_their_f_b_w_and_is_no_slower() {
    for s in sizes().into_iter().step_by(7) {
        let (c, g) = (s.chunks, s.group);
        let theirs = f64::from(s.slots) / f64::from(c);
        let expression = format!(
            "zero_bubble(vpp(f1b(gpipe), chunks={c}, group={g}, order=block), policy=in_place)"
        );
        let config = PipelineConfig::new(s.ranks, s.microbatches).unwrap();
        let plan = build_plan(&expression, &config).unwrap_or_else(|e| panic!("{expression}: {e}"));
        let at = format!("{expression} at P={} M={}", s.ranks, s.microbatches);
        // Their B, W pairs (read as I, W) op for op.
        assert_eq!(plan_orders(&plan), s.orders, "{at}");
        let ours = simulate(&plan).unwrap().makespan();
        assert!(
            ours <= theirs + TOLERANCE,
            "{at}: {ours} against their {theirs}"
        );
    }
}

#[test]
fn bad_block_arguments_name_the_rule() {
    let config = PipelineConfig::new(4, 8).unwrap();
    for (expression, rule) in [
        (
            "vpp(f1b(gpipe), chunks=2, layout=v, order=block)",
            "order = block needs layout = standard",
        ),
        (
            "vpp(f1b(gpipe), chunks=3, group=9, order=block)",
            "group <= microbatches",
        ),
        (
            "vpp(f1b(gpipe), chunks=3, group=2, order=megatron)",
            "ranks <= group <= microbatches",
        ),
        (
            "vpp(f1b(gpipe), chunks=3, order=fast)",
            "expected `auto`, `megatron` or `block`",
        ),
        (
            "vpp(gpipe, chunks=3, order=block)",
            "order = block needs a one-forward-one-backward",
        ),
    ] {
        let error = build_plan(expression, &config).unwrap_err().to_string();
        assert!(error.contains(rule), "{expression}: {error}");
    }
    // A group below the ranks is the block under the default order, not a refusal.
    let plan = build_plan("vpp(f1b(gpipe), chunks=3, group=2)", &config).unwrap();
    let block = build_plan("vpp(f1b(gpipe), chunks=3, group=2, order=block)", &config).unwrap();
    assert_eq!(plan.orders(), block.orders());
}
