//! Sequence-split plans (`seq_split`, Seq1F1B) trained through the GPT: with deterministic
//! accumulation every schedule and rank count at one split gives the same losses bit for bit;
//! against the unsplit run they agree to 1e-6 relative (not bit for bit: a chunk's attention
//! products have other shapes, and the gradients of its keys and values are summed chunk by
//! chunk); the measured activation bytes fall within what the plan predicts; variable-length
//! microbatches split at their own length; bad input is refused.

mod common;
mod tiny_gpt;

use candle_core::DType;
use common::plan;
use pipeweave_core::{peak_per_rank, RecvPolicy};
use pipeweave_kernels::GptConfig;
use pipeweave_train::data::BatchShape;
use pipeweave_train::{Corpus, GptModel, LrSchedule, StepRunner, TrainSettings, Trainer};

const MICROBATCHES: u32 = 8;
const SEQ_LEN: usize = 16;

fn corpus() -> Corpus {
    let text: String = (0..400)
        .map(|i| {
            format!(
                "fn f_{i}(x: u32) -> u32 {{ x.rotate_left({}) ^ {i} }}\n",
                i % 31
            )
        })
        .collect();
    Corpus::from_text("synthetic.rs", text)
}

fn settings(variable_length: bool) -> TrainSettings {
    let config = GptConfig::new(4, 16, 2, SEQ_LEN).unwrap();
    let shape = BatchShape::new(SEQ_LEN, 2, MICROBATCHES as usize).unwrap();
    TrainSettings {
        lr: LrSchedule::new(1e-2, 1e-3, 1, 3).unwrap(),
        seed: 9,
        deterministic: true,
        eval_sequences: 8,
        variable_length,
        ..TrainSettings::new(config, shape)
    }
}

/// Three steps' losses and the held-out loss of `expression` on `ranks` ranks.
fn losses(expression: &str, ranks: u32, variable_length: bool) -> (Vec<f64>, f64) {
    let plan = plan(expression, ranks, MICROBATCHES);
    let mut trainer = Trainer::new(&plan, &corpus(), settings(variable_length))
        .unwrap_or_else(|e| panic!("{expression} on {ranks}: {e}"));
    let steps = (0..3).map(|_| trainer.step().unwrap().loss).collect();
    (steps, trainer.evaluate().unwrap())
}

/// The splits into 4 chunks the issue names, and their compositions.
const SPLIT: &[&str] = &[
    "seq_split(f1b(gpipe), chunks=4)",
    "seq_split(zero_bubble(f1b(gpipe)), chunks=4)",
    "zero_bubble(seq_split(f1b(gpipe), chunks=4))",
    "seq_split(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), chunks=4)",
    "seq_split(vpp(f1b(gpipe), chunks=2), chunks=4)",
    "recompute(seq_split(f1b(gpipe), chunks=4), memory=1, weight_grads=keep)",
    "offload(seq_split(f1b(gpipe), chunks=4), memory=1)",
];

fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs()
}

#[test]
fn one_split_gives_the_same_bits_everywhere_and_the_unsplit_losses_to_1e_6() {
    let (reference, reference_eval) = losses("seq_split(gpipe, chunks=4)", 1, false);
    for &expression in SPLIT {
        for ranks in [1, 2, 4] {
            if ranks == 1 && expression.contains("layout=v") {
                continue;
            }
            let (got, eval) = losses(expression, ranks, false);
            assert_eq!(got, reference, "{expression} on {ranks} ranks");
            assert_eq!(eval.to_bits(), reference_eval.to_bits(), "{expression}");
        }
    }
    let (whole, whole_eval) = losses("f1b(gpipe)", 2, false);
    for (a, b) in reference.iter().zip(&whole) {
        assert!(relative(*a, *b) < 1e-6, "split {a} vs whole {b}");
    }
    assert!(relative(reference_eval, whole_eval) < 1e-6);
    // A split by cost cuts elsewhere: other bits, the same losses to rounding.
    let (by_cost, _) = losses("seq_split(f1b(gpipe), chunks=3, split=cost)", 2, false);
    for (a, b) in by_cost.iter().zip(&whole) {
        assert!(relative(*a, *b) < 1e-6, "cost split {a} vs whole {b}");
    }
}

#[test]
fn variable_length_microbatches_split_at_their_own_length() {
    let (whole, _) = losses("f1b(gpipe)", 2, true);
    let (split, _) = losses("seq_split(f1b(gpipe), chunks=2)", 2, true);
    let (again, _) = losses("zero_bubble(seq_split(f1b(gpipe), chunks=2))", 4, true);
    assert_eq!(split, again);
    for (a, b) in split.iter().zip(&whole) {
        assert!(relative(*a, *b) < 1e-6, "split {a} vs whole {b}");
    }
}

/// One deterministic step of `expression` on 4 ranks of the tiny GPT: each rank's measured
/// peak of live activation bytes.
fn measured_peaks(expression: &str) -> Vec<usize> {
    let plan = plan(expression, 4, MICROBATCHES);
    let runner = StepRunner::new(&plan, RecvPolicy::Early, false).unwrap();
    let model = GptModel::new(
        &tiny_gpt::config(),
        plan.problem(),
        7,
        DType::F32,
        false,
        true,
    )
    .unwrap();
    let batch = tiny_gpt::batch(MICROBATCHES as usize, 11);
    model.step(&runner, &batch).unwrap().peak_activation_bytes
}

#[test]
fn measured_activation_bytes_fall_within_the_prediction() {
    let predicted = |e: &str| -> Vec<f64> {
        let peaks = peak_per_rank(&plan(e, 4, MICROBATCHES));
        peaks.iter().map(|p| p.peak).collect()
    };
    let whole = "f1b(gpipe)";
    let (before, p_before) = (measured_peaks(whole), predicted(whole));
    for split in [
        "seq_split(f1b(gpipe), chunks=2)",
        "seq_split(f1b(gpipe), chunks=4)",
    ] {
        let (after, p_after) = (measured_peaks(split), predicted(split));
        for r in 0..4 {
            let measured = after[r] as f64 / before[r] as f64;
            let planned = p_after[r] / p_before[r];
            // Within the prediction: a chunk's attention weights (its queries by the keys up to
            // its end) are at most its tokens' share of the whole sequence's, which the plan
            // counts.
            assert!(
                measured <= planned + 1e-9,
                "{split}, rank {r}: measured {} -> {} bytes ({measured:.3}), planned {planned:.3}",
                before[r],
                after[r]
            );
        }
        assert!(after[0] < before[0], "{split}: the first rank holds less");
    }
}

#[test]
fn more_chunks_than_tokens_are_refused() {
    let plan = plan("seq_split(f1b(gpipe), chunks=32)", 2, MICROBATCHES);
    let err = Trainer::new(&plan, &corpus(), settings(false))
        .err()
        .unwrap();
    assert!(err.is_bad_input(), "{err}");
    assert!(
        err.to_string()
            .contains("more than the sequence's 16 tokens"),
        "{err}"
    );
}
