//! Our training against PyTorch's own pipelining on the same model, side by side in one run
//! (issue 19): `cargo bench --bench versus_pytorch`.
//!
//! Two model sizes (4 blocks of width 192 with 4 heads, 64-byte sequences, 16 microbatches of 4;
//! 4 blocks of width 512 with 8 heads, 128-byte sequences, 8 microbatches of 4), each trained
//! - by us: `f1b(gpipe)` on one rank (each forward followed by its backward, as PyTorch's
//!   `Schedule1F1B` does with one stage), and on two ranks with two schedules, 1F1B
//!   (`f1b(gpipe)`) and zero-bubble V (`zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))`);
//!   one compute thread per rank, AdamW;
//! - by PyTorch: `tools/pytorch_speed.py` (Hugging Face `GPT2Block`s over gloo, one process per
//!   rank with one thread each, AdamW) with the same schedules: `Schedule1F1B` on one and two
//!   ranks, `ScheduleZBVZeroBubble` on two.
//!
//! 1F1B cannot reach twice one rank's speed: with `M` microbatches on 2 ranks its bubble bounds
//! the gain by `2M / (M + 1)` (1.88 at 16 microbatches, 1.78 at 8); zero-bubble V fills the
//! bubble with deferred weight gradients.
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
use pipeweave_train::{Corpus, TrainSettings, Trainer};
use std::process::Command;
use std::time::Duration;

const STEPS: usize = 8;
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

/// A pipeline schedule of the comparison: ours and PyTorch's name for it.
#[derive(Clone, Copy)]
struct Schedule {
    /// The row's label.
    label: &'static str,
    /// Our schedule expression.
    ours: &'static str,
    /// `tools/pytorch_speed.py --schedule`.
    torch: &'static str,
}

const SCHEDULES: [Schedule; 2] = [
    Schedule {
        label: "1F1B",
        ours: "f1b(gpipe)",
        torch: "1f1b",
    },
    Schedule {
        label: "ZB-V",
        ours: "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
        torch: "zbv",
    },
];

/// Our side, in this process: trains `size` on `ranks` ranks with `expression` and prints one
/// JSON line.
fn ours(size: Size, ranks: u32, expression: &str) {
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let config =
        GptConfig::new(size.layers, size.width, size.heads, size.seq_len).expect("the sizes");
    let plan = build_plan(
        expression,
        &PipelineConfig::new(ranks, size.microbatches).expect("sizes"),
    )
    .expect("the bench's plans build");
    let shape = BatchShape::new(
        size.seq_len,
        size.microbatch_size,
        size.microbatches as usize,
    )
    .expect("valid shape");
    // TrainSettings::new's short run (a constant 1e-3, seed 1, f32, sums as they arrive), with
    // one held-out sequence and a long timeout.
    let settings = TrainSettings {
        eval_sequences: 1,
        fingerprint: "bench".to_string(),
        receive_timeout: Duration::from_secs(600),
        ..TrainSettings::new(config, shape)
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

/// Our side in a child process of this bench (the size at `index` of [`SIZES`], the schedule at
/// `schedule` of [`SCHEDULES`]).
fn run_ours(index: usize, ranks: u32, schedule: usize) -> Measured {
    let out = Command::new(std::env::current_exe().expect("this bench"))
        .env(
            "PIPEWEAVE_VERSUS_CHILD",
            format!("{index}:{ranks}:{schedule}"),
        )
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
fn run_pytorch(python: &str, size: Size, ranks: u32, schedule: &str) -> Option<Measured> {
    let out = Command::new(python)
        .arg("tools/pytorch_speed.py")
        .args(["--ranks", &ranks.to_string()])
        .args(["--schedule", schedule])
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
    pipeweave_train::allocator::keep_freed_memory();
    if let Ok(child) = std::env::var("PIPEWEAVE_VERSUS_CHILD") {
        let fields: Vec<usize> = child
            .split(':')
            .map(|f| f.parse().expect("index:ranks:schedule"))
            .collect();
        let ranks = u32::try_from(fields[1]).expect("a rank count");
        ours(SIZES[fields[0]], ranks, SCHEDULES[fields[2]].ours);
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
        "{:<44} {:<5} {:>8} {:>8} {:>6} {:>9} {:>9} {:>6} {:>6} {:>10} {:>11}",
        "model",
        "pp2",
        "ours 1",
        "torch 1",
        "ratio",
        "ours pp2",
        "torch pp2",
        "ratio",
        "pp2/1",
        "RSS ours",
        "RSS torch"
    );
    let ratio = |ours: Measured, theirs: Option<Measured>| {
        theirs.map_or("-".to_string(), |t| {
            format!("{:.2}", ours.tokens_per_second / t.tokens_per_second)
        })
    };
    let tps =
        |m: Option<Measured>| m.map_or("-".to_string(), |m| format!("{:.0}", m.tokens_per_second));
    let mb = |m: Option<Measured>| {
        m.map_or("-".to_string(), |m| {
            format!("{:.0}", m.peak_rss_bytes / 1e6)
        })
    };
    for (index, size) in SIZES.iter().enumerate() {
        // One rank: 1F1B for both rows.
        let ours_1 = run_ours(index, 1, 0);
        let torch_1 = python
            .as_deref()
            .and_then(|p| run_pytorch(p, *size, 1, "1f1b"));
        for (k, schedule) in SCHEDULES.iter().enumerate() {
            let ours_2 = run_ours(index, 2, k);
            let torch_2 = python
                .as_deref()
                .and_then(|p| run_pytorch(p, *size, 2, schedule.torch));
            println!(
                "{:<44} {:<5} {:>8.0} {:>8} {:>6} {:>9.0} {:>9} {:>6} {:>6.2} {:>10} {:>11}",
                format!(
                    "{} blocks, width {}, {} heads, seq {}, {}x{}",
                    size.layers,
                    size.width,
                    size.heads,
                    size.seq_len,
                    size.microbatches,
                    size.microbatch_size
                ),
                schedule.label,
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
}
