//! Benchmark of the whole pipeline `vpp(f1b(gpipe), chunks=2)` at 32 ranks: build the plan, run
//! every pass with verification after each, and simulate; at 256, 1024 and 4096 microbatches so the
//! growth can be read as a ratio within one run (these machines are noisy; compare ratios).
//!
//! Run: `cargo bench --bench pipeline` (target: under 0.1 s at 1024 microbatches, 131,072 ops).

use pipeweave::{build_plan, simulate, PipelineConfig};
use std::time::{Duration, Instant};

fn run_once(ranks: u32, microbatches: u32) -> (Duration, usize) {
    let start = Instant::now();
    let config = PipelineConfig::new(ranks, microbatches).expect("benchmark sizes are valid");
    let plan = build_plan("vpp(f1b(gpipe), chunks=2)", &config).expect("the pipeline verifies");
    let sim = simulate(&plan).expect("a verified plan simulates");
    std::hint::black_box(sim.makespan());
    let ops = plan.problem().work_count() * 3;
    (start.elapsed(), ops)
}

fn best_of(runs: usize, ranks: u32, microbatches: u32) -> (Duration, usize) {
    (0..runs)
        .map(|_| run_once(ranks, microbatches))
        .min_by_key(|(d, _)| *d)
        .expect("at least one run")
}

fn main() {
    let ranks = 32;
    println!(
        "vpp(f1b(gpipe), chunks=2), {ranks} ranks: build + passes + verify after each + simulate"
    );
    println!(
        "{:>12} {:>10} {:>12} {:>14} {:>10}",
        "microbatches", "ops", "best (ms)", "ns per op", "vs 1024"
    );
    let sizes = [256u32, 1024, 4096];
    let results: Vec<(u32, Duration, usize)> = sizes
        .iter()
        .map(|&m| {
            let (d, ops) = best_of(5, ranks, m);
            (m, d, ops)
        })
        .collect();
    let base = results
        .iter()
        .find(|(m, _, _)| *m == 1024)
        .map(|(_, d, _)| d.as_secs_f64())
        .expect("1024 is measured");
    for (m, d, ops) in &results {
        println!(
            "{m:>12} {ops:>10} {:>12.2} {:>14.1} {:>10.2}",
            d.as_secs_f64() * 1e3,
            d.as_secs_f64() * 1e9 / *ops as f64,
            d.as_secs_f64() / base
        );
    }
}
