//! How the memory passes scale with the ranks (issue 45, item 7): `pipeweave plan 'recompute(B,
//! memory=N)' -p 1000 -m 24` and the same with `offload`, as a user runs them (a process: build,
//! every pass verified, simulate, project, check, report), beside `pipeweave plan 'B'` for the plan
//! `B` they start from; the best of a few runs and the ratio to `B`'s. Target: every ratio under
//! 10. The passes re-time only what each rank's relief reaches
//! ([`pipeweave::core_ir::analysis::retime`]); when every step replayed the whole plan, 1F1B's
//! `recompute` took 15 s and its `offload` 79 s against 0.07 s for the plan, on two cores.
//! The in-process build alone (`build_plan`) is printed beside each for reference.
//!
//! Run: `cargo bench --bench memory_passes` (`PIPEWEAVE_BENCH_RUNS=N` for N runs per case,
//! default 3; `PIPEWEAVE_BENCH_RANKS=P` for another rank count).

use pipeweave::{build_plan, PipelineConfig};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The plans the passes start from, each with the limit its passes fit.
const CASES: [(&str, &str); 3] = [
    ("f1b(gpipe)", "memory=5"),
    ("vpp(f1b(gpipe), chunks=2)", "memory=5"),
    ("zero_bubble(f1b(gpipe), policy=h1)", "memory=5"),
];

/// Microbatches.
const MICROBATCHES: u32 = 24;

fn main() {
    let env = |name: &str, default: u32| {
        std::env::var(name)
            .ok()
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(default)
    };
    let runs = env("PIPEWEAVE_BENCH_RUNS", 3);
    let ranks = env("PIPEWEAVE_BENCH_RANKS", 1000);
    let config = PipelineConfig::new(ranks, MICROBATCHES).expect("a valid size");
    let best = |run: &dyn Fn()| -> f64 {
        (0..runs)
            .map(|_| {
                let start = Instant::now();
                run();
                start.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let command = |expression: &str| {
        best(&|| {
            let status = Command::new(env!("CARGO_BIN_EXE_pipeweave"))
                .args(["plan", expression, "-p"])
                .arg(ranks.to_string())
                .args(["-m", &MICROBATCHES.to_string()])
                .stdout(Stdio::null())
                .status()
                .expect("the pipeweave binary runs");
            assert!(status.success(), "pipeweave plan '{expression}' failed");
        })
    };
    let built = |expression: &str| {
        best(&|| {
            let plan = build_plan(expression, &config).expect("the pipeline verifies");
            std::hint::black_box(plan);
        })
    };
    println!(
        "pipeweave plan EXPR -p {ranks} -m {MICROBATCHES}, a process (best of {runs}); build_plan \
         alone in process"
    );
    for (base, limit) in CASES {
        let plain = command(base);
        println!("  {base:<56} {plain:>7.3} s   build {:>7.3} s", built(base));
        for pass in ["recompute", "offload"] {
            let expression = format!("{pass}({base}, {limit})");
            let seconds = command(&expression);
            println!(
                "  {expression:<56} {seconds:>7.3} s   build {:>7.3} s   {:>5.1}x the plan's \
                 command (target < 10x)",
                built(&expression),
                seconds / plain
            );
        }
    }
}
