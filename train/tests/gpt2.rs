//! A checkpoint trained through a pipeline loads where GPT-2 loads: Hugging Face transformers'
//! `GPT2LMHeadModel` computed the loss of `fixtures/gpt2/model.safetensors` (trained 30 steps
//! through `zero_bubble(f1b(gpipe))` on 2 ranks) on `eval.txt` (`tools/hf_eval.py`, fixture
//! `transformers_eval.json`); our evaluation of the same checkpoint must agree within 1e-4.

mod common;

use pipeweave_kernels::GptConfig;
use pipeweave_train::data::BatchShape;
use pipeweave_train::{Corpus, TrainSettings, Trainer};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gpt2")
        .join(name)
}

#[test]
fn our_eval_loss_equals_transformers_gpt2_on_the_same_checkpoint() {
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("transformers_eval.json")).unwrap())
            .unwrap();
    let text = std::fs::read(fixture("eval.txt")).unwrap();
    let (ranks, microbatches) = (2, 4);
    let plan = common::plan("f1b(gpipe)", ranks, microbatches);
    let config = GptConfig::new(2, 32, 2, 32).unwrap();
    let shape = BatchShape::new(32, 2, microbatches as usize).unwrap();
    let settings = TrainSettings {
        eval_sequences: 1,
        ..TrainSettings::new(config, shape)
    };
    let corpus = Corpus::from_text("eval.txt", String::from_utf8(text.clone()).unwrap());
    let mut trainer = Trainer::new(&plan, &corpus, settings).unwrap();
    trainer.load_weights(&fixture("model.safetensors")).unwrap();
    let (loss, tokens) = trainer.loss_and_tokens_on(&text).unwrap();
    let reference = expected["eval_loss"].as_f64().unwrap();
    assert_eq!(tokens as u64, expected["tokens"].as_u64().unwrap());
    assert!(
        (loss - reference).abs() / reference < 1e-4,
        "ours {loss}, transformers {reference}"
    );
}
