//! Benchmarks of the zero-bubble passes:
//! - `auto` on every row of the Zero Bubble paper's table at both memory limits (ZB-1p and ZB-2p
//!   settings), total time (target: well under 1 s);
//! - the client's whole composition `zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))` at 64 ranks and
//!   1024 microbatches (build, every pass, verification after each, simulation).
//!
//! Run: `cargo bench --bench zero_bubble` (needs ../shared/reference beside the checkout).

use pipeweave::paper_table::read_table;
use pipeweave::{build_plan, simulate, PipelineConfig, StageCostsSpec, StageMemorySpec};
use std::time::{Duration, Instant};

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(f());
            start.elapsed()
        })
        .min()
        .expect("at least one run")
}

fn main() {
    let path = std::env::var("PIPEWEAVE_PAPER_TABLE")
        .unwrap_or_else(|_| "../shared/reference/zb_paper_table.json".to_string());
    let table = read_table(&path).expect("the paper table is readable");
    let configs: Vec<(PipelineConfig, u32)> = table
        .rows
        .iter()
        .map(|row| {
            let costs = StageCostsSpec::builder()
                .forward(row.t_f)
                .input_grad(row.t_b)
                .weight_grad(row.t_w)
                .build()
                .validate()
                .expect("paper costs are valid");
            let memory = StageMemorySpec::builder()
                .total(1.0)
                .weight_grad(row.weight_grad_fraction())
                .build()
                .validate()
                .expect("paper memory is valid");
            let config = PipelineConfig::new(row.p, row.m)
                .expect("paper sizes are valid")
                .with_costs(costs, row.t_comm)
                .expect("paper costs are valid")
                .with_memory(memory);
            (config, row.p)
        })
        .collect();
    let auto_all = best_of(3, || {
        for (config, p) in &configs {
            for limit in [*p, 2 * *p] {
                let expr = format!("zero_bubble(f1b(gpipe), policy=auto, memory={limit})");
                build_plan(&expr, config).expect("auto schedules every paper row");
            }
        }
    });
    let baseline_all = best_of(3, || {
        for (config, _) in &configs {
            build_plan("f1b(gpipe)", config).expect("1F1B builds");
        }
    });
    println!(
        "auto on {} paper rows x 2 limits: {:.1} ms in total (building their 1F1B inputs alone: {:.1} ms)",
        configs.len(),
        auto_all.as_secs_f64() * 1e3,
        baseline_all.as_secs_f64() * 1e3
    );

    let config = PipelineConfig::new(64, 1024).expect("benchmark sizes are valid");
    let expr = "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))";
    let mut ops = 0;
    let full = best_of(3, || {
        let plan = build_plan(expr, &config).expect("the composition verifies");
        ops = plan.problem().work_count() * 3;
        simulate(&plan)
            .expect("a verified plan simulates")
            .makespan()
    });
    println!(
        "{expr} at 64 ranks, 1024 microbatches ({ops} ops): {:.1} ms (build, 5 passes, verify after each, simulate)",
        full.as_secs_f64() * 1e3
    );
}
