//! Training throughput through the pipeline against one rank (issue 8's figures).
//!
//! `cargo bench --bench train`: the same model (4 blocks, width 192, 4 heads, 64-byte sequences,
//! 2 sequences per microbatch) and batch (16 microbatches) trained
//! - on one rank with one compute thread (`gpipe` on 1 rank), and
//! - as pp2 with one compute thread per rank (`f1b(gpipe)` on 2 ranks),
//!
//! reporting the throughput ratio (the 1F1B bubble at P=2, M=16 is 1/17, so 1.88 is the ceiling on
//! two cores), the measured step time over the simulator's prediction from the measured op costs,
//! and the kernels' GFLOP/s (matrix-product FLOPs of a step per second of compute) against candle's
//! own matmul on this machine. Ratios within one run, since the machine is noisy.

use candle_core::{Device, Tensor};
use pipeweave::{build_plan, PipelineConfig};
use pipeweave_kernels::flops::stage_flops;
use pipeweave_kernels::{GptConfig, StageLayout};
use pipeweave_train::data::BatchShape;
use pipeweave_train::{step_timeline, Corpus, TrainSettings, Trainer};
use std::time::Instant;

const STEPS: u64 = 4;
const MICROBATCHES: u32 = 16;
const SEQ_LEN: usize = 64;
const SEQUENCES: usize = 2;

fn settings(config: GptConfig) -> TrainSettings {
    let shape = BatchShape::new(SEQ_LEN, SEQUENCES, MICROBATCHES as usize).expect("valid shape");
    TrainSettings {
        eval_sequences: 1,
        ..TrainSettings::new(config, shape)
    }
}

/// Seconds per step (after one warm-up step) and the last step's timeline ratio.
fn run(expression: &str, ranks: u32, config: GptConfig, corpus: &Corpus) -> (f64, f64) {
    let plan = build_plan(
        expression,
        &PipelineConfig::new(ranks, MICROBATCHES).expect("sizes"),
    )
    .expect("the bench's plans build");
    let mut trainer = Trainer::new(&plan, corpus, settings(config)).expect("trainer");
    trainer.step().expect("warm-up step");
    let start = Instant::now();
    for _ in 0..STEPS {
        trainer.step().expect("step");
    }
    let per_step = start.elapsed().as_secs_f64() / STEPS as f64;
    let timeline = step_timeline(&plan, trainer.last_measured(), expression).expect("timeline");
    (
        per_step,
        timeline.measured_seconds / timeline.simulated_seconds,
    )
}

/// GFLOP/s of candle's matmul on the shape of the MLP's first product.
fn candle_matmul_gflops(config: &GptConfig) -> f64 {
    let (m, k, n) = (SEQUENCES * SEQ_LEN, config.d_model(), config.mlp_hidden());
    let a = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu).expect("tensor");
    let b = Tensor::randn(0f32, 1.0, (k, n), &Device::Cpu).expect("tensor");
    let _ = a.matmul(&b).expect("matmul");
    let repeats = 200;
    let start = Instant::now();
    for _ in 0..repeats {
        let _ = a.matmul(&b).expect("matmul");
    }
    2.0 * (m * k * n) as f64 * repeats as f64 / start.elapsed().as_secs_f64() / 1e9
}

fn main() {
    pipeweave_train::allocator::keep_freed_memory();
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let config = GptConfig::new(4, 192, 4, SEQ_LEN).expect("config");
    let corpus = Corpus::default_sources().expect("the checkout's sources");
    let (single, _) = run("gpipe", 1, config, &corpus);
    let (pp2, timeline_ratio) = run("f1b(gpipe)", 2, config, &corpus);
    let flops = stage_flops(
        &config,
        &StageLayout::whole_model(&config),
        SEQUENCES,
        SEQ_LEN,
    );
    let step_flops =
        (flops.forward + flops.backward_input + flops.backward_weight) as f64 * MICROBATCHES as f64;
    let kernels = step_flops / single / 1e9;
    let candle = candle_matmul_gflops(&config);
    println!(
        "model: 4 blocks, width 192, 16 microbatches of 2 x 64 bytes; one compute thread per rank"
    );
    println!("one rank:  {:.3} s/step", single);
    println!("pp2 (1F1B): {:.3} s/step", pp2);
    println!(
        "throughput ratio pp2 / one rank: {:.2} (ceiling 1.88)",
        single / pp2
    );
    println!(
        "pp2 measured step / simulated from measured op costs: {:.3}",
        timeline_ratio
    );
    println!("kernels: {kernels:.2} GFLOP/s per thread (matrix products of a step on one rank); candle matmul {candle:.2} GFLOP/s ({:.0}%)", 100.0 * kernels / candle);
}
