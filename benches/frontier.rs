//! Benchmark of `tune --frontier` (issue 18's target: under 10 s at 16 ranks and 64
//! microbatches on a 2-core machine): the whole search in process, with unit costs and with the
//! Zero Bubble paper's costs and latency, best of 3 runs each, with the frontier's size and its
//! two ends.
//!
//! Run: `cargo bench --bench frontier`.

use pipeweave::frontier::frontier;
use pipeweave::{PipelineConfig, StageCostsSpec};
use std::time::{Duration, Instant};

fn main() {
    let paper = StageCostsSpec::builder()
        .forward(18522.0)
        .input_grad(18086.0)
        .weight_grad(9337.0)
        .build()
        .validate()
        .expect("the paper's costs are valid");
    for (label, costs, comm) in [
        (
            "unit costs",
            StageCostsSpec::builder()
                .build()
                .validate()
                .expect("unit costs"),
            0.0,
        ),
        ("paper costs, comm 601", paper, 601.0),
    ] {
        let config = PipelineConfig::new(16, 64)
            .and_then(|c| c.with_costs(costs, comm))
            .expect("the sizes are valid");
        let mut best = Duration::MAX;
        let mut found = None;
        for _ in 0..3 {
            // Cold: each `frontier` call builds its points through a registry of its own, whose
            // search cache starts empty.
            let start = Instant::now();
            let f = frontier(&config, &|_| {});
            best = best.min(start.elapsed());
            found = Some(f);
        }
        let found = found.expect("three runs");
        let (first, last) = (
            found.frontier.first().expect("a point"),
            found.frontier.last().expect("a point"),
        );
        println!(
            "tune --frontier, 16 ranks, 64 microbatches, {label}: {:.2} s (best of 3; target < 10 s), \
             {} expressions, {} points, from {} at {} to {} at {}",
            best.as_secs_f64(),
            found.expressions,
            found.frontier.len(),
            first.makespan,
            first.peak_activations,
            last.makespan,
            last.peak_activations
        );
    }
}
