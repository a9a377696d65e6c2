//! How `pipeweave tune` scales: the whole search of `tune -p P -m M` (every candidate expression
//! of [`candidate_expressions`], built, simulated and ranked on every core, a cold search cache
//! each run) at 16 x 64, 32 x 128 and 64 x 256, unit costs; the median of a few runs, in seconds.
//! Target: 64 x 256 under 10 s on two cores (about 50 s before the ladder's rungs shared their
//! work, [`pipeweave::transforms::schedules::memo`]).
//!
//! Run: `cargo bench --bench tune_scale` (`PIPEWEAVE_TUNE_RUNS=N` for N runs per size, default 3).

use pipeweave::search_space::candidate_expressions;
use pipeweave::tune::tune;
use pipeweave::PipelineConfig;
use std::time::Instant;

fn main() {
    let runs: usize = std::env::var("PIPEWEAVE_TUNE_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    for (ranks, microbatches) in [(16, 64), (32, 128), (64, 256)] {
        let config = PipelineConfig::new(ranks, microbatches).expect("a valid size");
        let expressions = candidate_expressions(ranks, microbatches, None, None);
        let mut seconds: Vec<f64> = (0..runs)
            .map(|_| {
                let start = Instant::now();
                let report = tune(&config, &expressions, &|_| {});
                std::hint::black_box(report);
                start.elapsed().as_secs_f64()
            })
            .collect();
        seconds.sort_by(f64::total_cmp);
        println!(
            "tune -p {ranks} -m {microbatches}: {:.3} s (median of {runs}; {} candidates)",
            seconds[runs / 2],
            expressions.len()
        );
    }
}
