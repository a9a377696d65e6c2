//! pipeweave against sail-sg's PipeOffload on its own grid (issue 28's must-show table): for
//! every point of PipeOffload's frontier in `tests/fixtures/pipeoffload_sailsg.json` (P 4 and 8,
//! M 2P and 4P, transfers of 0.25, 0.5, 1 and 2.24 forwards; made by
//! `tools/pipeoffload_sailsg.py` from their generator), what `tune --memory-limit` finds at that
//! point's peak: our makespan against theirs (their orders replayed under their runtime's
//! lifetime model), the ratio, and whether we reach the limit at all. Figures, not timings.
//!
//! Run: `cargo bench --bench pipeoffload` (about a minute in release).

use pipeweave::frontier::frontier;
use pipeweave::{PipelineConfig, StageCostsSpec};
use pipeweave_core::TOLERANCE;
use serde_json::Value;

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pipeoffload_sailsg.json"
    );
    let text = std::fs::read_to_string(path).expect("the PipeOffload fixture is readable");
    let fixture: Value = serde_json::from_str(&text).expect("the fixture is JSON");
    let number = |v: &Value, k: &str| v[k].as_f64().expect("a number in the fixture");
    println!(
        "{:>2} {:>3} {:>5} {:>6} {:>9} {:>9} {:>6}  ours",
        "P", "M", "T", "limit", "theirs", "ours", "ratio"
    );
    let (mut points, mut reached, mut no_slower) = (0, 0, 0);
    let mut ratios = Vec::new();
    for entry in fixture["frontier"].as_array().expect("a frontier list") {
        let (p, m, t) = (number(entry, "p"), number(entry, "m"), number(entry, "t"));
        let costs = StageCostsSpec::builder()
            .offload(t)
            .build()
            .validate()
            .expect("the grid's costs are valid");
        for point in entry["points"].as_array().expect("points") {
            let (limit, theirs) = (number(point, "peak_units"), number(point, "makespan"));
            let config = PipelineConfig::new(p as u32, m as u32)
                .and_then(|c| c.with_costs(costs, 0.0))
                .expect("the grid's sizes are valid")
                .with_memory_limit(Some(limit));
            points += 1;
            let found = frontier(&config, &|_| {}).ranked();
            let Some(best) = found.candidates.first() else {
                println!(
                    "{p:>2} {m:>3} {t:>5} {limit:>6.3} {theirs:>9.3} {:>9} {:>6}  nothing fits",
                    "-", "-"
                );
                continue;
            };
            reached += 1;
            let ratio = best.makespan / theirs;
            ratios.push(ratio);
            if best.makespan <= theirs + TOLERANCE {
                no_slower += 1;
            }
            println!(
                "{p:>2} {m:>3} {t:>5} {limit:>6.3} {theirs:>9.3} {:>9.3} {ratio:>6.3}  {}",
                best.makespan, best.expression
            );
        }
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "\n{points} points of PipeOffload's frontier: a plan within the limit at {reached}, no slower \
         at {no_slower}; median ratio {median:.3}, worst {:.3}",
        ratios.last().copied().unwrap_or(f64::NAN)
    );
}
