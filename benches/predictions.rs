//! Predictions from one profile checked against measured steps (issue 20).
//!
//! `cargo bench --bench predictions`: one profile is measured (a GPT of 4 blocks, width 192, 4
//! heads, 64-byte sequences, 4 per microbatch, trained as `f1b(gpipe)` on 2 ranks, every layer
//! measured alone and scaled to that run's per-stage op times: what `train_gpt --profile` does).
//! Then, for other configurations (schedules, rank counts, microbatch counts, cuts), the
//! simulator's makespan from the profile (what `pipeweave plan --profile` prints) is set beside
//! the measured pipeline step (first op start to last op end, the median of the steps after a
//! warm-up, threads backend, one compute thread per rank) with the relative error, and for 4
//! ranks on fewer cores the time-shared prediction (`--cores`) beside the one-core-per-rank one;
//! then
//! `tune --profile`'s ranking (schedules and cuts together) is checked by measuring its first
//! candidates, and its choice of cut against the even cut's best: with no limit, within the
//! memory the fastest schedule needs on the even cut (so only other cuts let it fit), and below
//! every DualPipe candidate. Peak activation bytes are predicted and measured too (the measured
//! peak of a chosen plan must stay within the limit it was chosen for).

use pipeweave::frontier::frontier;
use pipeweave::search_space::candidate_expressions;
use pipeweave::tune::{candidate_cuts, tune, tune_cuts, TuneReport};
use pipeweave::{build_and_simulate, build_plan, PipelineConfig, Profile};
use pipeweave_kernels::GptConfig;
use pipeweave_train::data::BatchShape;
use pipeweave_train::{pipeline_overhead, Corpus, TrainSettings, Trainer};

const WARM_UP: usize = 2;
const STEPS: usize = 5;
const SEQ_LEN: usize = 64;
const SEQUENCES: usize = 4;

fn model(blocks: usize) -> GptConfig {
    GptConfig::new(blocks, 192, 4, SEQ_LEN).expect("the bench's model")
}

fn settings(config: GptConfig, microbatches: u32, cut: &[usize]) -> TrainSettings {
    let shape = BatchShape::new(SEQ_LEN, SEQUENCES, microbatches as usize).expect("valid shape");
    TrainSettings {
        eval_sequences: 1,
        layers_per_stage: Some(cut.to_vec()),
        ..TrainSettings::new(config, shape)
    }
}

/// What one configuration did: the median pipeline step after a warm-up, in seconds, and the
/// largest peak of live activation bytes of any rank over those steps.
struct Measured {
    seconds: f64,
    peak_bytes: f64,
}

/// Trains `expression` built from `profile`'s costs for `cut` within `limit` bytes per rank
/// (the plan the prediction simulates, as `train_gpt --cost-profile --memory-limit` builds
/// it).
#[allow(clippy::too_many_arguments)]
fn measure(
    config: GptConfig,
    profile: &Profile,
    expression: &str,
    ranks: u32,
    microbatches: u32,
    cut: &[usize],
    limit: Option<f64>,
    corpus: &Corpus,
) -> Measured {
    let (costed, units) = PipelineConfig::new(ranks, microbatches)
        .expect("sizes")
        .with_profile(profile, Some(cut))
        .expect("the profile costs the cut");
    let costed = costed.with_memory_limit(limit.map(|bytes| bytes / units.bytes_per_unit));
    let plan = build_plan(expression, &costed).expect("the bench's plans build");
    let mut trainer =
        Trainer::new(&plan, corpus, settings(config, microbatches, cut)).expect("a trainer");
    let mut steps = Vec::new();
    let mut peak = 0usize;
    for i in 0..WARM_UP + STEPS {
        trainer.step().expect("a step");
        if i >= WARM_UP {
            let overhead = pipeline_overhead(&plan, trainer.last_measured()).expect("replay");
            steps.push(overhead.measured_seconds);
            peak = peak.max(
                trainer
                    .peak_activation_bytes()
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(0),
            );
        }
    }
    steps.sort_by(f64::total_cmp);
    Measured {
        seconds: steps[steps.len() / 2],
        peak_bytes: peak as f64,
    }
}

/// The simulator's makespan and largest per-rank peak in bytes from `profile`, the ranks
/// sharing this machine's cores (as `pipeweave plan --profile --cores N`: more ranks than cores
/// time-share them).
fn predict(
    profile: &Profile,
    expression: &str,
    ranks: u32,
    microbatches: u32,
    cut: &[usize],
) -> (f64, f64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (config, costed) = PipelineConfig::new(ranks, microbatches)
        .expect("sizes")
        .with_profile(profile, Some(cut))
        .expect("the profile costs the cut");
    let config = config
        .with_shared_cores(Some(cores as f64 / profile.threads_per_rank.max(1) as f64))
        .expect("cores are positive");
    let (_, simulation) = build_and_simulate(expression, &config).expect("the plan builds");
    let peak = simulation
        .ranks()
        .iter()
        .map(|r| r.peak_activations)
        .fold(0.0, f64::max);
    (simulation.makespan(), peak * costed.bytes_per_unit)
}

/// What `train_gpt --profile` writes after a run of `f1b(gpipe)` on 2 ranks, 8 microbatches,
/// cut `cut`: every layer measured alone, scaled to the run's per-stage op times.
fn profile_of(config: GptConfig, cut: &[usize], corpus: &Corpus) -> Profile {
    let plan =
        build_plan("f1b(gpipe)", &PipelineConfig::new(2, 8).expect("sizes")).expect("f1b builds");
    let mut trainer = Trainer::new(&plan, corpus, settings(config, 8, cut)).expect("a trainer");
    for _ in 0..WARM_UP + STEPS {
        trainer.step().expect("a step");
    }
    trainer.profile(5).expect("the profile")
}

fn shown(cut: &[usize]) -> String {
    cut.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn mib(bytes: f64) -> f64 {
    bytes / (1024.0 * 1024.0)
}

fn main() {
    pipeweave_train::allocator::keep_freed_memory();
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let corpus = Corpus::default_sources().expect("the checkout's sources");
    prediction_table(&corpus);
    tune_choices(&corpus);
}

/// One profile predicting ten other configurations.
fn prediction_table(corpus: &Corpus) {
    let profile = profile_of(model(4), &[2, 2], corpus);
    println!("one profile (f1b(gpipe), 2 ranks, 8 microbatches, cut 2,2), predictions of other configurations:");
    println!(
        "{:<52} {:>5} {:>4} {:>8} {:>11} {:>10} {:>7} {:>13} {:>12}",
        "schedule",
        "ranks",
        "M",
        "cut",
        "predicted s",
        "measured s",
        "error",
        "peak MiB pred",
        "peak MiB run"
    );
    let configurations: [(&str, u32, u32, &[usize]); 10] = [
        ("f1b(gpipe)", 1, 8, &[4]),
        ("gpipe", 1, 16, &[4]),
        ("f1b(gpipe)", 2, 8, &[1, 3]),
        ("f1b(gpipe)", 2, 8, &[3, 1]),
        ("f1b(gpipe)", 2, 4, &[2, 2]),
        ("f1b(gpipe)", 2, 16, &[2, 2]),
        ("gpipe", 2, 8, &[2, 2]),
        ("zero_bubble(f1b(gpipe))", 2, 8, &[2, 2]),
        ("dual(f1b(gpipe))", 2, 8, &[2, 2]),
        (
            "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
            2,
            8,
            &[1, 3],
        ),
    ];
    let mut errors = Vec::new();
    let mut peak_ratios = Vec::new();
    for (expression, ranks, microbatches, cut) in configurations {
        let (predicted, predicted_peak) = predict(&profile, expression, ranks, microbatches, cut);
        let measured = measure(
            model(4),
            &profile,
            expression,
            ranks,
            microbatches,
            cut,
            None,
            corpus,
        );
        let error = (predicted - measured.seconds) / measured.seconds;
        errors.push(error.abs());
        peak_ratios.push(predicted_peak / measured.peak_bytes);
        println!(
            "{expression:<52} {ranks:>5} {microbatches:>4} {:>8} {predicted:>11.4} {:>10.4} {:>+6.1}% {:>13.1} {:>12.1}",
            shown(cut),
            measured.seconds,
            100.0 * error,
            mib(predicted_peak),
            mib(measured.peak_bytes),
        );
    }
    errors.sort_by(f64::total_cmp);
    let median = (errors[(errors.len() - 1) / 2] + errors[errors.len() / 2]) / 2.0;
    println!(
        "median |error| {:.1}% (target <= 10%), largest {:.1}% (target <= 20%), over {} configurations",
        100.0 * median,
        100.0 * errors.last().copied().unwrap_or(0.0),
        errors.len()
    );
    println!(
        "predicted peak over measured peak: {:.2} .. {:.2} (a limit holds where >= 1)",
        peak_ratios.iter().copied().fold(f64::INFINITY, f64::min),
        peak_ratios.iter().copied().fold(0.0, f64::max)
    );

    // More ranks than cores: the same profile, the ranks time-sharing the machine's cores
    // (`--cores N`) against every rank on its own core.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "\n4 ranks on this machine's {cores} cores (time-shared), the same profile:\n{:<52} {:>4} {:>11} {:>11} {:>10} {:>7}",
        "schedule", "M", "own cores s", "shared s", "measured s", "error"
    );
    for (expression, microbatches) in [
        ("f1b(gpipe)", 8u32),
        ("f1b(gpipe)", 16),
        ("zero_bubble(f1b(gpipe))", 8),
        ("gpipe", 8),
    ] {
        let cut = [1, 1, 1, 1];
        let (shared, _) = predict(&profile, expression, 4, microbatches, &cut);
        let (config, _) = PipelineConfig::new(4, microbatches)
            .expect("sizes")
            .with_profile(&profile, Some(&cut))
            .expect("the profile costs the cut");
        let (_, own) = build_and_simulate(expression, &config).expect("the plan builds");
        let measured = measure(
            model(4),
            &profile,
            expression,
            4,
            microbatches,
            &cut,
            None,
            corpus,
        );
        println!(
            "{expression:<52} {microbatches:>4} {:>11.4} {shared:>11.4} {:>10.4} {:>+6.1}%",
            own.makespan(),
            measured.seconds,
            100.0 * (shared - measured.seconds) / measured.seconds
        );
    }
}

/// `tune --profile` on a model whose even cut is uneven (5 blocks: the embedding and 2 blocks
/// against 3 blocks and the head): its first candidates measured, then its choice of cut
/// against the even cut's best.
fn tune_choices(corpus: &Corpus) {
    let config = model(5);
    let profile = profile_of(config, &[2, 3], corpus);
    let base = PipelineConfig::new(2, 8).expect("sizes");
    let cuts = candidate_cuts(profile.free_layers(), 2, &profile.pinned(), 64);
    let even = profile.even_cut(2);
    let ranked = ranked_within(&base, &profile, &cuts, None);
    println!(
        "\ntune --profile, 5 blocks, 2 ranks, 8 microbatches ({} candidates): its first five measured",
        ranked.candidates.len()
    );
    let mut measured_candidates = Vec::new();
    for c in ranked.candidates.iter().take(5) {
        let cut = c.layers_per_stage.clone().unwrap_or_else(|| even.clone());
        let measured = measure(config, &profile, &c.expression, 2, 8, &cut, None, corpus);
        println!(
            "{:<52} cut {:>5} predicted {:.4} measured {:.4}  peak MiB predicted {:.1} measured {:.1}",
            c.expression,
            shown(&cut),
            c.makespan,
            measured.seconds,
            mib(c.peak_activation_bytes.unwrap_or(f64::NAN)),
            mib(measured.peak_bytes)
        );
        measured_candidates.push(measured.seconds);
    }
    let best = measured_candidates
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    println!(
        "tune's first choice measures {:.1}% above the best of them (target <= 5%)",
        100.0 * (measured_candidates[0] / best - 1.0)
    );

    // One schedule, every cut: 1F1B's best cut against the even one.
    let for_f1b = |cut: &[usize]| {
        ranked
            .candidates
            .iter()
            .find(|c| c.expression == "f1b(gpipe)" && c.layers_per_stage.as_deref() == Some(cut))
            .map(|c| c.makespan)
    };
    let best_f1b = ranked
        .candidates
        .iter()
        .find(|c| c.expression == "f1b(gpipe)")
        .expect("f1b is a candidate");
    let chosen = best_f1b
        .layers_per_stage
        .clone()
        .expect("candidates carry their cut");
    let chosen_measured = measure(config, &profile, "f1b(gpipe)", 2, 8, &chosen, None, corpus);
    let even_measured = measure(config, &profile, "f1b(gpipe)", 2, 8, &even, None, corpus);
    println!(
        "f1b(gpipe): tune's cut {} predicted {:.4} measured {:.4}; the even cut {} predicted {:.4} measured {:.4} ({:+.1}%)",
        shown(&chosen),
        best_f1b.makespan,
        chosen_measured.seconds,
        shown(&even),
        for_f1b(&even).unwrap_or(f64::NAN),
        even_measured.seconds,
        100.0 * (chosen_measured.seconds / even_measured.seconds - 1.0)
    );

    // Within the memory the fastest schedule needs on the even cut (one byte less), and below
    // every DualPipe candidate's (their ranks hold both ends, so a cut changes their memory,
    // not their time): tune's pick against the even cut's best within the same limit.
    let fastest = &ranked.candidates[0];
    let fastest_even_peak = ranked
        .candidates
        .iter()
        .filter(|c| c.expression == fastest.expression)
        .find(|c| c.layers_per_stage.as_deref() == Some(&even[..]))
        .and_then(|c| c.peak_activation_bytes)
        .expect("every expression is ranked on the even cut");
    let least_dual = ranked
        .candidates
        .iter()
        .filter(|c| c.expression.contains("dual("))
        .filter_map(|c| c.peak_activation_bytes)
        .fold(f64::INFINITY, f64::min);
    for (limit, label) in [
        (
            fastest_even_peak - 1.0,
            format!("below what {} needs on the even cut", fastest.expression),
        ),
        (
            least_dual - 1.0,
            "below every DualPipe candidate".to_string(),
        ),
    ] {
        let limited = ranked_within(&base, &profile, &cuts, Some(limit));
        let pick = &limited.candidates[0];
        let pick_cut = pick
            .layers_per_stage
            .clone()
            .expect("candidates carry their cut");
        let Some(even_best) = limited
            .candidates
            .iter()
            .find(|c| c.layers_per_stage.as_deref() == Some(&even[..]))
        else {
            println!(
                "within {:.2} MiB ({label}): tune picks {} with cut {}; nothing fits on the even cut",
                mib(limit),
                pick.expression,
                shown(&pick_cut)
            );
            continue;
        };
        let pick_measured = measure(
            config,
            &profile,
            &pick.expression,
            2,
            8,
            &pick_cut,
            Some(limit),
            corpus,
        );
        let even_measured = measure(
            config,
            &profile,
            &even_best.expression,
            2,
            8,
            &even,
            Some(limit),
            corpus,
        );
        println!(
            "within {:.2} MiB ({label}):\n  tune picks {} with cut {}: predicted {:.4} s, {:.2} MiB; measured {:.4} s, {:.2} MiB{}\n  the even cut's best, {}: predicted {:.4} s, {:.2} MiB; measured {:.4} s, {:.2} MiB\n  tune's pick {:+.1}% against the even cut's best",
            mib(limit),
            pick.expression,
            shown(&pick_cut),
            pick.makespan,
            mib(pick.peak_activation_bytes.unwrap_or(f64::NAN)),
            pick_measured.seconds,
            mib(pick_measured.peak_bytes),
            if pick_measured.peak_bytes <= limit { " (within the limit)" } else { " (OVER the limit)" },
            even_best.expression,
            even_best.makespan,
            mib(even_best.peak_activation_bytes.unwrap_or(f64::NAN)),
            even_measured.seconds,
            mib(even_measured.peak_bytes),
            100.0 * (pick_measured.seconds / even_measured.seconds - 1.0)
        );
    }
}

/// `tune --profile`'s ranking of every schedule under every cut in `cuts`, within `limit`
/// bytes per rank where given (as `tune --memory-limit` in bytes: the frontier's search).
fn ranked_within(
    base: &PipelineConfig,
    profile: &Profile,
    cuts: &[Vec<usize>],
    limit: Option<f64>,
) -> TuneReport {
    tune_cuts(base, profile, cuts, &mut |config, cut| {
        Ok(match limit {
            None => tune(
                config,
                &candidate_expressions(2, config.microbatches(), None, config.sequence()),
                &|_| {},
            ),
            Some(bytes) => {
                let units = bytes / cut.bytes_per_unit;
                frontier(&config.clone().with_memory_limit(Some(units)), &|_| {}).ranked()
            }
        })
    })
    .expect("tune")
}
