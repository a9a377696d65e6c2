//! Variable-length microbatches (`train_gpt --variable-length`): sequences cut at document
//! boundaries, each microbatch as long as its longest sequence, the loss Megatron's per-token
//! mean over the global batch; with deterministic accumulation every schedule and rank count
//! gives the single rank's losses bit for bit, per-step plans (one cost per microbatch)
//! included.

mod common;

use pipeweave_core::simulate;
use pipeweave_kernels::GptConfig;
use pipeweave_train::data::{BatchShape, Loader};
use pipeweave_train::{Corpus, LrSchedule, TrainSettings, Trainer, PAD_ID};
use pipeweave_transforms::schedules::microbatch_order::microbatch_order;

const MICROBATCHES: u32 = 8;
const SEQ_LEN: usize = 24;

/// Documents of 5 to 60 bytes separated by blank lines.
fn corpus() -> Corpus {
    let text: Vec<String> = (0..300)
        .map(|i| {
            let words = 1 + (i * 7919) % 12;
            (0..words)
                .map(|w| format!("w{}", (i + w) % 97))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    Corpus::from_text("documents.txt", text.join("\n\n"))
}

fn settings(steps: u64) -> TrainSettings {
    let config = GptConfig::new(4, 16, 2, SEQ_LEN).unwrap();
    let shape = BatchShape::new(SEQ_LEN, 2, MICROBATCHES as usize).unwrap();
    TrainSettings {
        lr: LrSchedule::new(1e-2, 1e-3, 1, steps).unwrap(),
        seed: 3,
        deterministic: true,
        eval_sequences: 8,
        variable_length: true,
        ..TrainSettings::new(config, shape)
    }
}

/// Three steps of `expression` on `ranks`; with `per_step_plans`, each step runs the plan
/// rebuilt with one cost per microbatch (its tokens over `SEQ_LEN`), as `train_gpt` does.
fn losses(expression: &str, ranks: u32, per_step_plans: bool) -> Vec<f64> {
    let plan = common::plan(expression, ranks, MICROBATCHES);
    let mut trainer = Trainer::new(&plan, &corpus(), settings(3)).unwrap();
    (0..3)
        .map(|_| {
            if per_step_plans {
                // As train_gpt does: the data in the slots the simulator prices fastest, the
                // plan built with the costs in slot order.
                let lengths = trainer.next_microbatch_lengths().unwrap();
                let costs: Vec<f64> = lengths.iter().map(|&t| t as f64 / SEQ_LEN as f64).collect();
                let order = microbatch_order(&costs, &mut |in_slots| {
                    let plan =
                        common::plan_scaled(expression, ranks, MICROBATCHES, in_slots.to_vec());
                    simulate(&plan).unwrap().makespan()
                });
                let scales = order.iter().map(|&m| costs[m]).collect();
                trainer.set_microbatch_order(order).unwrap();
                let plan = common::plan_scaled(expression, ranks, MICROBATCHES, scales);
                trainer.set_plan(&plan).unwrap();
            }
            trainer.step().unwrap().loss
        })
        .collect()
}

#[test]
fn microbatches_are_as_long_as_their_longest_sequence() {
    let corpus = corpus();
    let shape = BatchShape::new(SEQ_LEN, 2, MICROBATCHES as usize).unwrap();
    let mut loader =
        Loader::variable(corpus.bytes().to_vec(), corpus.documents(), shape, 3).unwrap();
    let batch = loader.batch_for_step(0).unwrap();
    let lengths = batch.microbatch_lengths();
    assert!(
        lengths.iter().all(|&t| (1..=SEQ_LEN).contains(&t)),
        "{lengths:?}"
    );
    assert!(lengths.iter().any(|&t| t < SEQ_LEN), "{lengths:?}");
    for (input, target) in batch.inputs.iter().zip(&batch.targets) {
        let t = input.len() / 2;
        for row in target.chunks(t) {
            // Padding only after the sequence, and the longest sequence needs none.
            let real = row.iter().take_while(|&&id| id != PAD_ID).count();
            assert!(row[real..].iter().all(|&id| id == PAD_ID));
            assert!(real >= 1);
        }
        assert!(target.chunks(t).any(|row| row[t - 1] != PAD_ID));
        // No sequence crosses a blank line (a document boundary).
        for row in input.chunks(t) {
            let text: Vec<u8> = row.iter().map(|&b| b as u8).collect();
            assert!(!text.windows(2).any(|w| w == b"\n\n"), "{text:?}");
        }
    }
}

#[test]
fn every_schedule_and_rank_count_gives_the_single_rank_bits() {
    let reference = losses("gpipe", 1, false);
    assert!(reference.iter().all(|l| l.is_finite() && *l > 0.0));
    let cases = [
        ("f1b(gpipe)", 2),
        ("zero_bubble(f1b(gpipe))", 2),
        ("zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))", 2),
        ("zero_bubble(dual(f1b(gpipe)))", 4),
        ("vpp(f1b(gpipe), chunks=2)", 4),
        ("f1b(gpipe)", 4),
    ];
    for (expression, ranks) in cases {
        for per_step_plans in [false, true] {
            let got = losses(expression, ranks, per_step_plans);
            assert_eq!(
                got, reference,
                "{expression} on {ranks} ranks, per-step plans {per_step_plans}"
            );
        }
    }
}

#[test]
fn any_slot_order_gives_the_same_bits() {
    let reference = losses("f1b(gpipe)", 2, false);
    let plan = common::plan("f1b(gpipe)", 2, MICROBATCHES);
    let mut trainer = Trainer::new(&plan, &corpus(), settings(3)).unwrap();
    let reversed: Vec<usize> = (0..MICROBATCHES as usize).rev().collect();
    trainer.set_microbatch_order(reversed).unwrap();
    let got: Vec<f64> = (0..3).map(|_| trainer.step().unwrap().loss).collect();
    assert_eq!(got, reference);
    let err = trainer
        .set_microbatch_order(vec![0, 0, 1, 2, 3, 4, 5, 6])
        .unwrap_err();
    assert!(err.to_string().contains("permutation"), "{err}");
}

#[test]
fn a_step_plan_of_another_problem_is_refused() {
    let plan = common::plan("f1b(gpipe)", 2, MICROBATCHES);
    let mut trainer = Trainer::new(&plan, &corpus(), settings(1)).unwrap();
    let other = common::plan("f1b(gpipe)", 4, MICROBATCHES);
    let err = trainer.set_plan(&other).unwrap_err();
    assert!(
        err.to_string().contains("must keep the run's problem"),
        "{err}"
    );
}
