//! Determinism across thread counts, measured: the test binary re-runs itself as child processes
//! with `RAYON_NUM_THREADS` (and `CANDLE_NUM_THREADS`) set to 1, 2, 3 and 8; each child computes a
//! large matrix product and a whole stage step (large enough for candle and `gemm` to go
//! parallel) and prints a digest of all the bits; the digests must be equal.
//!
//! Also an ignored exploratory probe of batch-shape invariance (run with `--ignored`).

use std::process::Command;

use candle_core::{DType, Tensor};

use crate::config::GptConfig;
use crate::layers::CrossEntropy;
use crate::stage::{StageLayout, StageModel};
use crate::testing::{random, random_ids, values};

/// Set in the child processes: only then does [`digest_probe`] compute and print.
const PROBE_ENV: &str = "PIPEWEAVE_KERNELS_DIGEST_PROBE";
const DIGEST_PREFIX: &str = "DIGEST:";

/// FNV-1a over the bits of every value of every tensor.
fn digest(tensors: &[Tensor]) -> u64 {
    tensors
        .iter()
        .flat_map(values)
        .flat_map(|v| v.to_bits().to_le_bytes())
        .fold(0xCBF2_9CE4_8422_2325, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01B3)
        })
}

/// A big f32 product and the output, loss and gradients of a whole f32 stage step.
fn probe_tensors() -> Vec<Tensor> {
    let a = random(1, &[300, 500], 1.0, DType::F32);
    let b = random(2, &[500, 400], 1.0, DType::F32);
    let mut tensors = vec![a.matmul(&b).expect("shapes agree")];

    let config = GptConfig::new(2, 64, 4, 64).expect("valid config");
    let model = StageModel::new(config, StageLayout::whole_model(&config), 3, DType::F32)
        .expect("valid model");
    let ids = random_ids(4, &[4, 64], 256);
    let targets = random_ids(5, &[4, 64], 256);
    let (logits, saved) = model.forward(&ids).expect("forward");
    let loss = CrossEntropy::new(None)
        .loss_and_grad(model.primitives(), &logits, &targets, 256.0)
        .expect("loss");
    let (_, pending) = model
        .backward_input(saved, &loss.grad_logits)
        .expect("backward_input");
    tensors.extend([logits, loss.loss_sum]);
    tensors.extend(model.backward_weight(pending).expect("backward_weight"));
    tensors
}

#[test]
fn digest_probe() {
    if std::env::var_os(PROBE_ENV).is_some() {
        println!("{DIGEST_PREFIX}{:016x}", digest(&probe_tensors()));
    }
}

/// Runs [`digest_probe`] in a child process with `threads` threads; returns its digest line.
fn child_digest(threads: usize) -> String {
    let exe = std::env::current_exe().expect("the test binary has a path");
    let output = Command::new(exe)
        .args([
            "determinism::digest_probe",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(PROBE_ENV, "1")
        .env("RAYON_NUM_THREADS", threads.to_string())
        .env("CANDLE_NUM_THREADS", threads.to_string())
        .output()
        .expect("the test binary can be re-run");
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .find_map(|line| {
            line.split_once(DIGEST_PREFIX)
                .map(|(_, d)| d.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no digest from the child with {threads} threads: {stdout}"))
}

#[test]
fn stage_gradients_do_not_depend_on_thread_count() {
    let digests: Vec<(usize, String)> = [1, 2, 3, 8].map(|n| (n, child_digest(n))).into();
    println!("digests by thread count: {digests:?}");
    assert!(
        digests.iter().all(|(_, d)| *d == digests[0].1),
        "results depend on the thread count: {digests:?}"
    );
}

/// Exploratory: does row 0 of `x · W` depend on how many rows `x` has?
#[test]
#[ignore = "exploratory probe; prints its findings"]
fn batch_shape_probe() {
    for (k, n) in [(768, 768), (64, 32), (2048, 48), (3072, 768), (100, 7)] {
        let x = random(1, &[512, k], 1.0, DType::F32);
        let w = random(2, &[k, n], 1.0, DType::F32);
        let row_0 = |rows: usize| {
            let product = x
                .narrow(0, 0, rows)
                .and_then(|x| x.matmul(&w))
                .expect("shapes agree");
            values(&product.narrow(0, 0, 1).expect("row 0"))
        };
        let reference = row_0(512);
        let differing: Vec<usize> = [1, 2, 7, 16, 64, 65, 128, 256]
            .into_iter()
            .filter(|&rows| row_0(rows) != reference)
            .collect();
        println!("k {k:>4}, n {n:>3}: row counts whose row 0 differs from the 512-row product: {differing:?}");
    }
}
