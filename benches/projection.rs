//! Benchmark of projection and the communication checker at 64 ranks, 2 chunks, 1024
//! microbatches (`vpp(f1b(gpipe), chunks=2)`, about 0.5 M instructions), separately from building
//! the plan. Target: under 0.2 s for projection + check.
//!
//! Run: `cargo bench --bench projection`.

use pipeweave::core_ir::{check_programs, project, ProjectionOptions, RecvPolicy};
use pipeweave::{build_plan, PipelineConfig};
use std::time::{Duration, Instant};

fn main() {
    let config = PipelineConfig::new(64, 1024).expect("benchmark sizes are valid");
    let plan = build_plan("vpp(f1b(gpipe), chunks=2)", &config).expect("the plan verifies");
    for recv in [RecvPolicy::Early, RecvPolicy::JustInTime] {
        let mut best = (Duration::from_secs(3600), Duration::from_secs(3600), 0usize);
        for _ in 0..3 {
            let start = Instant::now();
            let programs = project(
                &plan,
                ProjectionOptions {
                    recv,
                    forward_only: false,
                },
            )
            .expect("projection succeeds");
            let projected = start.elapsed();
            let start = Instant::now();
            check_programs(plan.problem(), &programs).expect("the programs check");
            let checked = start.elapsed();
            if projected + checked < best.0 + best.1 {
                best = (projected, checked, programs.instruction_count());
            }
        }
        println!(
            "{recv:?}: {} instructions; projection {:.1} ms + check {:.1} ms = {:.1} ms",
            best.2,
            best.0.as_secs_f64() * 1e3,
            best.1.as_secs_f64() * 1e3,
            (best.0 + best.1).as_secs_f64() * 1e3
        );
    }
}
