//! Our training against PyTorch's own pipelining on the same model, side by side in one run
//! (issue 19): `cargo bench --bench versus_pytorch`.
//!
//! Two model sizes (4 blocks of width 192 with 4 heads, 64-byte sequences, 16 microbatches of 4;
//! 4 blocks of width 512 with 8 heads, 128-byte sequences, 8 microbatches of 4), each trained
//! - by us: `gpipe` on one rank and `f1b(gpipe)` on two, one compute thread per rank, AdamW;
//! - by PyTorch: `tools/pytorch_speed.py` (Hugging Face `GPT2Block`s, `Schedule1F1B` over gloo,
//!   one process per stage with one thread each, AdamW).
//!
//! Each side runs in a process of its own and reports its tokens per second (the median step after
//! two warm-up steps) and its peak resident memory (ours: the process's high-water mark; PyTorch:
//! the sum of its processes' peaks). The table gives both, the ratios, and our pp2 over our one
//! rank. PyTorch comes from a venv (`PIPEWEAVE_TORCH_VENV`, default `.venv-bench-torch`, made
//! with pip when missing); without torch the PyTorch columns say so and the bench still reports
//! ours.

use pipeweave::{build_plan, PipelineConfig};
use pipeweave_kernels::GptConfig;
use pipeweave_train::data::BatchShape;
use pipeweave_train::{Corpus, LrSchedule, TrainSettings, Trainer};
use std::process::Command;
use std::time::Duration;

const STEPS: usize = 6;
const WARM_UP: usize = 2;

/// One model size of the comparison.
#[derive(Clone, Copy)]
struct Size {
    layers: usize,
    width: usize,
    heads: usize,
    seq_len: usize,
    microbatches: u32,
    microbatch_size: usize,
}

const SIZES: [Size; 2] = [
    Size {
        layers: 4,
        width: 192,
        heads: 4,
        seq_len: 64,
        microbatches: 16,
        microbatch_size: 4,
    },
    Size {
        layers: 4,
        width: 512,
        heads: 8,
        seq_len: 128,
        microbatches: 8,
        microbatch_size: 4,
    },
];

/// What one side measured.
#[derive(Clone, Copy, Debug)]
struct Measured {
    tokens_per_second: f64,
    peak_rss_bytes: f64,
}

/// Our side, in this process: trains `size` on `ranks` ranks and prints one JSON line.
fn ours(size: Size, ranks: u32) {
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let config =
        GptConfig::new(size.layers, size.width, size.heads, size.seq_len).expect("the sizes");
    let expression = if ranks == 1 { "gpipe" } else { "f1b(gpipe)" };
    let plan = build_plan(
        expression,
        &PipelineConfig::new(ranks, size.microbatches).expect("sizes"),
    )
    .expect("the bench's plans build");
    let settings = TrainSettings {
        config,
        shape: BatchShape::new(
            size.seq_len,
            size.microbatch_size,
            size.microbatches as usize,
        )
        .expect("valid shape"),
        lr: LrSchedule::constant(1e-3).expect("valid learning rate"),
        max_grad_norm: 1.0,
        seed: 1,
        deterministic: false,
        recompute: false,
        dtype: candle_core::DType::F32,
        eval_sequences: 1,
        fingerprint: "bench".to_string(),
        receive_timeout: Duration::from_secs(600),
        replicas: 1,
        injections: Vec::new(),
    };
    let corpus = Corpus::default_sources().expect("the checkout's sources");
    let mut trainer = Trainer::new(&plan, &corpus, settings).expect("trainer");
    let mut seconds = Vec::new();
    let mut tokens = 0;
    for _ in 0..STEPS {
        let log = trainer.step().expect("step");
        seconds.push(log.seconds);
        tokens = size.microbatches as usize * size.microbatch_size * size.seq_len;
    }
    let mut measured = seconds[WARM_UP..].to_vec();
    measured.sort_by(f64::total_cmp);
    let median = measured[measured.len() / 2];
    println!(
        "{{\"tokens_per_second\": {}, \"peak_rss_bytes\": {}}}",
        tokens as f64 / median,
        peak_rss_bytes()
    );
}

/// This process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Reads the one JSON line a side printed.
fn parse(stdout: &[u8]) -> Option<Measured> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{'))?;
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    Some(Measured {
        tokens_per_second: value["tokens_per_second"].as_f64()?,
        peak_rss_bytes: value["peak_rss_bytes"].as_f64()?,
    })
}

/// Our side in a child process of this bench (the size at `index` of [`SIZES`]).
fn run_ours(index: usize, ranks: u32) -> Measured {
    let out = Command::new(std::env::current_exe().expect("this bench"))
        .env("PIPEWEAVE_VERSUS_CHILD", format!("{index}:{ranks}"))
        .output()
        .expect("the bench runs itself");
    parse(&out.stdout).unwrap_or_else(|| {
        panic!(
            "our side gave no figures: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The venv's Python with torch and transformers, made when missing; None when that fails.
fn torch_python() -> Option<String> {
    let venv = std::env::var("PIPEWEAVE_TORCH_VENV").unwrap_or_else(|_| ".venv-bench-torch".into());
    let python = format!("{venv}/bin/python");
    let works = |python: &str| {
        Command::new(python)
            .args(["-c", "import torch, transformers"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if works(&python) {
        return Some(python);
    }
    eprintln!("making {venv} with torch and transformers (pip, a few minutes)...");
    let made = Command::new("python3")
        .args(["-m", "venv", &venv])
        .status()
        .is_ok_and(|s| s.success())
        && Command::new(format!("{venv}/bin/pip"))
            .args([
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "torch",
                "transformers",
                "numpy",
            ])
            .status()
            .is_ok_and(|s| s.success());
    (made && works(&python)).then_some(python)
}

/// PyTorch's side; None when it fails (its reason on stderr).
fn run_pytorch(python: &str, size: Size, ranks: u32) -> Option<Measured> {
    let out = Command::new(python)
        .arg("tools/pytorch_speed.py")
        .args(["--ranks", &ranks.to_string()])
        .args(["--layers", &size.layers.to_string()])
        .args(["--d-model", &size.width.to_string()])
        .args(["--heads", &size.heads.to_string()])
        .args(["--seq-len", &size.seq_len.to_string()])
        .args(["--microbatches", &size.microbatches.to_string()])
        .args(["--microbatch-size", &size.microbatch_size.to_string()])
        .args(["--steps", &STEPS.to_string()])
        .output()
        .ok()?;
    let measured = parse(&out.stdout);
    if measured.is_none() {
        eprintln!(
            "PyTorch's side failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    measured
}

fn main() {
    if let Ok(child) = std::env::var("PIPEWEAVE_VERSUS_CHILD") {
        let (index, ranks) = child.split_once(':').expect("index:ranks");
        ours(
            SIZES[index.parse::<usize>().expect("an index")],
            ranks.parse().expect("a rank count"),
        );
        return;
    }
    let python = torch_python();
    if python.is_none() {
        println!("torch is missing (and the venv could not be made): PyTorch's columns are empty");
    }
    println!(
        "tokens/s, one compute thread per rank; peak RSS in MB (ours: one process; PyTorch: the sum of its processes)"
    );
    println!(
        "{:<34} {:>10} {:>10} {:>6} {:>10} {:>10} {:>6} {:>8} {:>14} {:>14}",
        "model",
        "ours 1",
        "torch 1",
        "ratio",
        "ours pp2",
        "torch pp2",
        "ratio",
        "pp2/1",
        "RSS ours 1/2",
        "RSS torch 1/2"
    );
    for (index, size) in SIZES.iter().enumerate() {
        let ours_1 = run_ours(index, 1);
        let ours_2 = run_ours(index, 2);
        let torch_1 = python.as_deref().and_then(|p| run_pytorch(p, *size, 1));
        let torch_2 = python.as_deref().and_then(|p| run_pytorch(p, *size, 2));
        let ratio = |ours: Measured, theirs: Option<Measured>| {
            theirs.map_or("-".to_string(), |t| {
                format!("{:.2}", ours.tokens_per_second / t.tokens_per_second)
            })
        };
        let tps = |m: Option<Measured>| {
            m.map_or("-".to_string(), |m| format!("{:.0}", m.tokens_per_second))
        };
        let mb = |m: Option<Measured>| {
            m.map_or("-".to_string(), |m| {
                format!("{:.0}", m.peak_rss_bytes / 1e6)
            })
        };
        println!(
            "{:<34} {:>10.0} {:>10} {:>6} {:>10.0} {:>10} {:>6} {:>8.2} {:>14} {:>14}",
            format!(
                "{} blocks, width {}, {} heads, seq {}, {}x{}",
                size.layers,
                size.width,
                size.heads,
                size.seq_len,
                size.microbatches,
                size.microbatch_size
            ),
            ours_1.tokens_per_second,
            tps(torch_1),
            ratio(ours_1, torch_1),
            ours_2.tokens_per_second,
            tps(torch_2),
            ratio(ours_2, torch_2),
            ours_2.tokens_per_second / ours_1.tokens_per_second,
            format!("{}/{}", mb(Some(ours_1)), mb(Some(ours_2))),
            format!("{}/{}", mb(torch_1), mb(torch_2)),
        );
    }
}
