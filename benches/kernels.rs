//! The kernels' profile by primitive (issue 19): `cargo bench --bench kernels`.
//!
//! One rank's compute of a step on the two model sizes (the whole model on one stage:
//! every microbatch's forward, loss, input- and weight-gradient backward, one compute thread),
//! through [`TimedPrimitives`]: the step's time, the matrix products' GFLOP/s, and each primitive's
//! share of the step (what to make faster, and what was).

use candle_core::{DType, Device, Tensor};
use pipeweave_kernels::flops::stage_flops;
use pipeweave_kernels::{
    CpuPrimitives, CrossEntropy, GptConfig, Primitives, StageLayout, StageModel, TimedPrimitives,
};
use std::sync::Arc;
use std::time::Instant;

/// (layers, width, heads, seq_len, microbatches, sequences per microbatch).
const SIZES: [(usize, usize, usize, usize, usize, usize); 2] =
    [(4, 192, 4, 64, 16, 4), (4, 512, 8, 128, 8, 4)];

fn main() {
    std::env::set_var("RAYON_NUM_THREADS", "1");
    for (layers, width, heads, seq, microbatches, sequences) in SIZES {
        let config = GptConfig::new(layers, width, heads, seq).expect("config");
        let timed = Arc::new(TimedPrimitives::new(CpuPrimitives::new()));
        let ops: Arc<dyn Primitives> = timed.clone();
        let model = StageModel::with_primitives(
            config,
            StageLayout::whole_model(&config),
            1,
            DType::F32,
            ops,
        )
        .expect("model");
        let ids: Vec<u32> = (0..sequences * seq).map(|i| (i * 7 % 256) as u32).collect();
        let input = Tensor::from_vec(ids.clone(), (sequences, seq), &Device::Cpu).expect("ids");
        let targets = Tensor::from_vec(ids, (sequences, seq), &Device::Cpu).expect("targets");
        let loss = CrossEntropy::new(None);
        let step = || {
            for _ in 0..microbatches {
                let (logits, saved) = model.forward(&input).expect("forward");
                let out = loss
                    .loss_and_grad(model.primitives(), &logits, &targets, 1.0)
                    .expect("loss");
                let (_, pending) = model
                    .backward_input(saved, &out.grad_logits)
                    .expect("backward");
                model.backward_weight(pending).expect("weights");
            }
        };
        step();
        let _ = timed.take();
        let repeats: u32 = 3;
        let start = Instant::now();
        for _ in 0..repeats {
            step();
        }
        let seconds = start.elapsed().as_secs_f64() / f64::from(repeats);
        let profile = timed.take();
        let flops = stage_flops(&config, &StageLayout::whole_model(&config), sequences, seq);
        let step_flops = (flops.forward + flops.backward_input + flops.backward_weight) as f64
            * microbatches as f64;
        let products: f64 = profile
            .iter()
            .filter(|(op, _)| op.starts_with("matmul"))
            .map(|(_, (t, _))| t.as_secs_f64())
            .sum::<f64>()
            / f64::from(repeats);
        println!(
            "{layers} blocks, width {width}, {heads} heads, seq {seq}, {microbatches}x{sequences}: \
             {seconds:.3} s per step ({:.0} tokens/s); matrix products {:.1} GFLOP/s over their own time",
            (microbatches * sequences * seq) as f64 / seconds,
            step_flops / products / 1e9
        );
        let mut rows: Vec<(&str, f64, u64)> = profile
            .iter()
            .map(|(op, (t, n))| {
                (
                    *op,
                    t.as_secs_f64() / f64::from(repeats),
                    n / u64::from(repeats),
                )
            })
            .collect();
        rows.sort_by(|a, b| b.1.total_cmp(&a.1));
        for (op, t, n) in rows {
            println!(
                "  {op:<28} {:>8.1} ms {:>5.1}% {n:>6} calls",
                t * 1e3,
                100.0 * t / seconds
            );
        }
    }
}
