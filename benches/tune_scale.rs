//! How `pipeweave tune` scales: the whole search of `tune -p P -m M` as the command runs it
//! ([`ConfigRequest::tune`]: every candidate expression built, simulated and ranked on every
//! core, then the challengers whose placement could still win, a cold search cache each run) at
//! 16 x 64, 32 x 128 and 64 x 256, unit costs; the median of a few runs, in seconds. Target:
//! 64 x 256 under 10 s on two cores (about 50 s before the ladder's rungs shared their work,
//! [`pipeweave::transforms::schedules::memo`], 12-14 s before its climb stopped at an unbeatable
//! top rung).
//!
//! Run: `cargo bench --bench tune_scale` (`PIPEWEAVE_TUNE_RUNS=N` for N runs per size, default 3).

use pipeweave::ConfigRequest;
use std::time::Instant;

fn main() {
    let runs: usize = std::env::var("PIPEWEAVE_TUNE_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(3);
    for (ranks, microbatches) in [(16, 64), (32, 128), (64, 256)] {
        let request = ConfigRequest::new(ranks, microbatches);
        let mut evaluated = 0;
        let mut seconds: Vec<f64> = (0..runs)
            .map(|_| {
                let start = Instant::now();
                let report = request.tune(&|_| {}).expect("unit costs always tune");
                evaluated = report.evaluated;
                std::hint::black_box(report);
                start.elapsed().as_secs_f64()
            })
            .collect();
        seconds.sort_by(f64::total_cmp);
        println!(
            "tune -p {ranks} -m {microbatches}: {:.3} s (median of {runs}; {evaluated} schedules built)",
            seconds[runs / 2],
        );
    }
}
