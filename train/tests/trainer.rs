//! The training loop: three steps through every schedule equal a single rank's (bit for bit with
//! deterministic accumulation), a stopped and resumed run equals an uninterrupted one, the model
//! learns, and bad input is refused with a typed error.

mod common;

use pipeweave_core::Plan;
use pipeweave_kernels::GptConfig;
use pipeweave_train::data::BatchShape;
use pipeweave_train::{Corpus, LrSchedule, TrainError, TrainSettings, Trainer};

const MICROBATCHES: u32 = 8;

fn plan(expression: &str, ranks: u32) -> Plan {
    common::plan(expression, ranks, MICROBATCHES)
}

fn corpus() -> Corpus {
    let text: String = (0..400)
        .map(|i| {
            format!(
                "fn step_{i}(x: u32) -> u32 {{ x.wrapping_mul({}) ^ {i} }}\n",
                i * 7 + 3
            )
        })
        .collect();
    Corpus::from_text("synthetic.rs", text)
}

fn settings(deterministic: bool, recompute: bool, steps: u64) -> TrainSettings {
    let config = GptConfig::new(4, 16, 2, 16).unwrap();
    let shape = BatchShape::new(16, 2, MICROBATCHES as usize).unwrap();
    TrainSettings {
        lr: LrSchedule::new(1e-2, 1e-3, 1, steps).unwrap(),
        seed: 5,
        deterministic,
        recompute,
        eval_sequences: 8,
        fingerprint: "test".to_string(),
        ..TrainSettings::new(config, shape)
    }
}

fn losses(expression: &str, ranks: u32, deterministic: bool, recompute: bool) -> (Vec<f64>, f64) {
    let mut trainer = Trainer::new(
        &plan(expression, ranks),
        &corpus(),
        settings(deterministic, recompute, 3),
    )
    .unwrap();
    let losses = (0..3).map(|_| trainer.step().unwrap().loss).collect();
    (losses, trainer.evaluate().unwrap())
}

#[test]
fn three_steps_through_every_schedule_equal_a_single_rank() {
    let (reference, reference_eval) = losses("gpipe", 1, true, false);
    let (loose, _) = losses("gpipe", 1, false, false);
    for &expression in common::SCHEDULES {
        let (exact, eval) = losses(expression, 4, true, true);
        assert_eq!(exact, reference, "{expression}");
        assert_eq!(eval.to_bits(), reference_eval.to_bits(), "{expression}");
        let (close, _) = losses(expression, 4, false, false);
        for (a, b) in close.iter().zip(&loose) {
            assert!((a - b).abs() / b < 1e-5, "{expression}: {a} vs {b}");
        }
    }
}

#[test]
fn a_stopped_and_resumed_run_equals_an_uninterrupted_one() {
    let dir = std::env::temp_dir().join(format!("pipeweave-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ck.safetensors");
    let p = plan("zero_bubble(f1b(gpipe))", 2);
    let mut whole = Trainer::new(&p, &corpus(), settings(true, false, 6)).unwrap();
    let expected: Vec<f64> = (0..6).map(|_| whole.step().unwrap().loss).collect();
    let mut first = Trainer::new(&p, &corpus(), settings(true, false, 6)).unwrap();
    for _ in 0..3 {
        first.step().unwrap();
    }
    first.save(&path).unwrap();
    let mut second = Trainer::new(&p, &corpus(), settings(true, false, 6)).unwrap();
    second.resume(&path).unwrap();
    assert_eq!(second.steps_done(), 3);
    let resumed: Vec<f64> = (0..3).map(|_| second.step().unwrap().loss).collect();
    assert_eq!(resumed, expected[3..]);
    let mut other = settings(true, false, 6);
    other.fingerprint = "another schedule".to_string();
    let mut third = Trainer::new(&p, &corpus(), other).unwrap();
    let err = third.resume(&path).unwrap_err();
    assert!(matches!(err, TrainError::ScheduleMismatch { .. }), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_model_learns() {
    let p = plan("f1b(gpipe)", 2);
    let mut trainer = Trainer::new(&p, &corpus(), settings(false, false, 40)).unwrap();
    let losses: Vec<f64> = (0..40).map(|_| trainer.step().unwrap().loss).collect();
    let tail = losses[30..].iter().sum::<f64>() / 10.0;
    assert!(tail <= 0.65 * losses[0], "{} -> {tail}", losses[0]);
}

#[test]
fn bad_input_is_a_typed_error() {
    let p = plan("f1b(gpipe)", 2);
    let short = Corpus::from_text("short.txt", "too short");
    let err = Trainer::new(&p, &short, settings(false, false, 3))
        .err()
        .unwrap();
    assert!(matches!(err, TrainError::DataTooShort { .. }), "{err}");
    assert!(err.is_bad_input());
    let mut wrong = settings(false, false, 3);
    wrong.shape = BatchShape::new(16, 2, 4).unwrap();
    let err = Trainer::new(&p, &corpus(), wrong).err().unwrap();
    assert!(err.to_string().contains("microbatches"), "{err}");
}

fn injected(what: pipeweave_train::Injection) -> TrainError {
    let p = plan("f1b(gpipe)", 4);
    let mut s = settings(false, false, 3);
    s.receive_timeout = std::time::Duration::from_millis(800);
    s.injections = vec![(2, 2, what)];
    let mut trainer = Trainer::new(&p, &corpus(), s).unwrap();
    trainer.step().unwrap();
    trainer.step().err().unwrap()
}

#[test]
fn a_failing_rank_stops_the_step_naming_step_rank_and_instruction() {
    let err = injected(pipeweave_train::Injection::Fail);
    let text = err.to_string();
    assert!(text.starts_with("step 2: rank 2, instruction "), "{text}");
    assert!(text.contains("injected failure (--fail)"), "{text}");
    assert!(!err.is_bad_input());
}

#[test]
fn a_stalled_rank_ends_the_step_with_who_waits_on_whom() {
    let start = std::time::Instant::now();
    let err = injected(pipeweave_train::Injection::Stall(
        std::time::Duration::from_secs(3),
    ));
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
    let text = err.to_string();
    assert!(
        text.starts_with("step 2: no progress within 0.8 s: "),
        "{text}"
    );
    assert!(text.contains("rank 3 waits at instruction"), "{text}");
    assert!(text.contains("from rank 2"), "{text}");
}

#[test]
fn two_data_parallel_replicas_of_four_microbatches_equal_one_of_eight() {
    let one = {
        let mut trainer = Trainer::new(
            &plan("zero_bubble(f1b(gpipe))", 2),
            &corpus(),
            settings(true, false, 3),
        )
        .unwrap();
        (0..3)
            .map(|_| trainer.step().unwrap().loss)
            .collect::<Vec<_>>()
    };
    let half = common::plan("zero_bubble(f1b(gpipe))", 2, 4);
    let mut s = settings(true, false, 3);
    s.replicas = 2;
    let mut trainer = Trainer::new(&half, &corpus(), s).unwrap();
    let two: Vec<f64> = (0..3).map(|_| trainer.step().unwrap().loss).collect();
    assert_eq!(one, two);
}
