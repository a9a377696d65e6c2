//! The trainer's host link against the simulator (issue 28): offload plans trained on the threads
//! backend, 2 ranks, their transfers copied by each rank's host-link worker beside its computes.
//!
//! `cargo bench --bench host_link`: for 1F1B and offload plans over 1F1B, ZB-H1 and ZB-V (a GPT
//! of 4 blocks, width 192, 64-byte sequences, 4 per microbatch, 8 microbatches), each step's
//! measured span (first op start to last op end) is set beside the simulator's replay of the
//! plan from that step's measured op durations (transfers included, on the link), as the median
//! of the steps after a warm-up; and each rank's measured peak of live device bytes, as a
//! fraction of 1F1B's, beside the plan's peak as a fraction of 1F1B's. Goal: the step within 10%
//! of the replay, and the measured fraction at most the plan's plus what the unit plans leave
//! out (outputs waiting to be sent, the inputs dropped forwards keep).

use pipeweave::{build_plan, PipelineConfig, Profile};
use pipeweave_core::peak_per_rank;
use pipeweave_train::{pipeline_overhead, Corpus, TrainSettings, Trainer};

mod common;

use common::BenchRun;

const RUN: BenchRun = BenchRun {
    ranks: 2,
    microbatches: 8,
    seq_len: 64,
    sequences: 4,
    warm_up: 2,
    steps: 7,
};
const CUT: [usize; 2] = [2, 2];

const BASELINE: &str = "f1b(gpipe)";
const OFFLOADS: &[&str] = &[
    "offload(f1b(gpipe), memory=1)",
    "offload(zero_bubble(f1b(gpipe), policy=h1), memory=1)",
    "offload(zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v)), memory=1.5)",
];

/// One plan's steps: the median of measured over replayed, the spans, and the peaks per rank.
#[derive(Clone)]
struct Measured {
    ratio: f64,
    measured: f64,
    replayed: f64,
    peaks: Vec<usize>,
}

fn settings() -> TrainSettings {
    TrainSettings {
        layers_per_stage: Some(CUT.to_vec()),
        ..RUN.settings(RUN.model(4))
    }
}

/// `expression` at unit costs, or from `profile`'s costs and bytes (then also the bytes of one
/// unit of memory).
fn plan_of(expression: &str, profile: Option<&Profile>) -> (pipeweave_core::Plan, f64) {
    let config = PipelineConfig::new(RUN.ranks, RUN.microbatches).expect("sizes");
    let (config, bytes) = match profile {
        Some(profile) => {
            let (config, cut) = config
                .with_profile(profile, Some(&CUT))
                .expect("the profile costs the cut");
            (config, cut.bytes_per_unit)
        }
        None => (config, 1.0),
    };
    let plan = build_plan(expression, &config).unwrap_or_else(|e| panic!("{expression}: {e}"));
    (plan, bytes)
}

fn train(expression: &str, corpus: &Corpus) -> (Measured, Vec<f64>) {
    train_plan(plan_of(expression, None).0, corpus)
}

fn train_plan(plan: pipeweave_core::Plan, corpus: &Corpus) -> (Measured, Vec<f64>) {
    let mut trainer = Trainer::new(&plan, corpus, settings()).expect("a trainer");
    let mut steps = Vec::new();
    let mut peaks = vec![0usize; RUN.ranks as usize];
    for i in RUN.all_steps() {
        trainer.step().expect("a step");
        if RUN.measured(i) {
            let o = pipeline_overhead(&plan, trainer.last_measured()).expect("replay");
            steps.push((o.ratio(), o.measured_seconds, o.replayed_seconds));
            for (peak, &now) in peaks.iter_mut().zip(trainer.peak_activation_bytes()) {
                *peak = (*peak).max(now);
            }
        }
    }
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (ratio, measured, replayed) = steps[steps.len() / 2];
    let planned = peak_per_rank(&plan).iter().map(|p| p.peak).collect();
    (
        Measured {
            ratio,
            measured,
            replayed,
            peaks,
        },
        planned,
    )
}

fn main() {
    pipeweave_train::allocator::keep_freed_memory();
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let corpus = Corpus::default_sources().expect("the checkout's sources");
    let (base, base_plan) = train(BASELINE, &corpus);
    println!(
        "{:<72} {:>9} {:>9} {:>7}  peak vs 1F1B per rank: measured (plan)",
        "schedule (2 ranks, 8 microbatches)", "step ms", "replay ms", "ratio"
    );
    let mut within = 0;
    for expression in std::iter::once(&BASELINE).chain(OFFLOADS) {
        let (m, plan) = if *expression == BASELINE {
            (base.clone(), base_plan.clone())
        } else {
            train(expression, &corpus)
        };
        let peaks: Vec<String> = (0..RUN.ranks as usize)
            .map(|r| {
                format!(
                    "{:.3} ({:.3})",
                    m.peaks[r] as f64 / base.peaks[r] as f64,
                    plan[r] / base_plan[r]
                )
            })
            .collect();
        println!(
            "{:<72} {:>9.2} {:>9.2} {:>7.3}  {}",
            expression,
            m.measured * 1e3,
            m.replayed * 1e3,
            m.ratio,
            peaks.join("  ")
        );
        if expression != &BASELINE && m.ratio <= 1.10 {
            within += 1;
        }
    }
    println!(
        "offload plans whose step is within 10% of the replay: {within} of {}",
        OFFLOADS.len()
    );

    // The same plans built from a profile of this model (as `train_gpt --cost-profile` builds
    // them): each rank's measured peak of live device bytes against the plan's, in bytes.
    let (plan, _) = plan_of(BASELINE, None);
    let mut trainer = Trainer::new(&plan, &corpus, settings()).expect("a trainer");
    for _ in RUN.all_steps() {
        trainer.step().expect("a step");
    }
    let profile = trainer.profile(5).expect("the profile");
    println!();
    println!(
        "{:<72}  device peak MiB per rank: measured / predicted from the profile",
        "schedule (profiled costs and bytes)"
    );
    let mut bounded = 0;
    for expression in std::iter::once(&BASELINE).chain(OFFLOADS) {
        let (plan, bytes) = plan_of(expression, Some(&profile));
        let (m, predicted) = train_plan(plan, &corpus);
        let cells: Vec<String> = (0..RUN.ranks as usize)
            .map(|r| {
                format!(
                    "{:.2} / {:.2}",
                    mib(m.peaks[r] as f64),
                    mib(predicted[r] * bytes)
                )
            })
            .collect();
        let within = (0..RUN.ranks as usize).all(|r| m.peaks[r] as f64 <= predicted[r] * bytes);
        bounded += usize::from(within);
        println!("{:<72}  {}", expression, cells.join("  "));
    }
    println!(
        "plans whose measured peak is within the prediction on every rank: {bounded} of {}",
        OFFLOADS.len() + 1
    );
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}
