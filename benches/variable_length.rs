//! Variable-length microbatches: plans with one cost per microbatch against one plan with
//! uniform costs, measured in one run (issue 20).
//!
//! `cargo bench --bench variable_length`: a GPT of 4 blocks, width 192, trained on the
//! blank-line-separated blocks of this checkout's README.md (a document each) cut into
//! sequences of up to 256 bytes, 8 microbatches of 2 sequences on 2 ranks, one compute thread
//! per rank. Per schedule, rounds alternate between the per-step plan (`plan_for_lengths`: one
//! cost per microbatch, the cheapest microbatches where the fill and the drain wait, the
//! schedule rebuilt with those costs) and the uniform-cost plan in data order; each round runs
//! 2 warm-up steps and 12 measured ones. Printed: the summed pipeline time (first op start to
//! last op end) and step time of each, and their ratio.

use pipeweave::variable_length::{plan_for_lengths, LengthCost};
use pipeweave::{build_plan, PipelineConfig};
use pipeweave_train::{pipeline_overhead, Corpus, TrainSettings, Trainer};

mod common;

use common::BenchRun;

const RUN: BenchRun = BenchRun {
    ranks: 2,
    microbatches: 8,
    seq_len: 256,
    sequences: 2,
    warm_up: 2,
    steps: 12,
};
const ROUNDS: usize = 3;

fn settings() -> TrainSettings {
    TrainSettings {
        deterministic: true,
        variable_length: true,
        ..RUN.settings(RUN.model(4))
    }
}

/// Summed pipeline seconds and step seconds of the measured steps.
fn run(expression: &str, per_microbatch: bool, corpus: &Corpus) -> (f64, f64) {
    let config = PipelineConfig::new(RUN.ranks, RUN.microbatches).expect("sizes");
    let mut plan = build_plan(expression, &config).expect("the plan builds");
    let mut trainer = Trainer::new(&plan, corpus, settings()).expect("a trainer");
    let (mut pipeline, mut steps) = (0.0, 0.0);
    for i in RUN.all_steps() {
        if per_microbatch {
            let lengths = trainer.next_microbatch_lengths().expect("lengths");
            let cost = LengthCost::Linear { full: RUN.seq_len };
            let planned = plan_for_lengths(expression, &config, &lengths, &cost).expect("a plan");
            trainer
                .set_microbatch_order(planned.order)
                .expect("an order");
            if planned.plan.orders() != plan.orders() {
                trainer.set_plan(&planned.plan).expect("the step's plan");
            }
            plan = planned.plan;
        }
        let log = trainer.step().expect("a step");
        if RUN.measured(i) {
            let overhead = pipeline_overhead(&plan, trainer.last_measured()).expect("replay");
            pipeline += overhead.measured_seconds;
            steps += log.seconds;
        }
    }
    (pipeline, steps)
}

fn main() {
    pipeweave_train::allocator::keep_freed_memory();
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let readme = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
    let corpus = Corpus::from_path(readme).expect("the checkout's README");
    println!(
        "variable-length microbatches ({} documents of README.md, up to {} bytes), {} microbatches of {} on {} ranks, {} steps x {ROUNDS} rounds:",
        corpus.documents().len(),
        RUN.seq_len,
        RUN.microbatches,
        RUN.sequences,
        RUN.ranks,
        RUN.steps
    );
    println!(
        "{:<52} {:>16} {:>16} {:>8} {:>16} {:>16} {:>8}",
        "schedule", "pipeline: costs", "uniform", "ratio", "step: costs", "uniform", "ratio"
    );
    for expression in [
        "f1b(gpipe)",
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
    ] {
        let (mut costed, mut uniform) = ((0.0, 0.0), (0.0, 0.0));
        for _ in 0..ROUNDS {
            let a = run(expression, true, &corpus);
            let b = run(expression, false, &corpus);
            costed = (costed.0 + a.0, costed.1 + a.1);
            uniform = (uniform.0 + b.0, uniform.1 + b.1);
        }
        println!(
            "{expression:<52} {:>15.3}s {:>15.3}s {:>8.3} {:>15.3}s {:>15.3}s {:>8.3}",
            costed.0,
            uniform.0,
            costed.0 / uniform.0,
            costed.1,
            uniform.1,
            costed.1 / uniform.1
        );
    }
}
