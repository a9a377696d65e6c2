//! Predictions from one profile checked against measured steps (issue 20).
//!
//! `cargo bench --bench predictions`: one profile is measured (a GPT of 4 blocks, width 192, 4
//! heads, 64-byte sequences, 4 per microbatch, trained as `f1b(gpipe)` on 2 ranks, every layer
//! measured alone and scaled to that run's per-stage op times: what `train_gpt --profile` does).
//! Then, for other configurations (schedules, rank counts, microbatch counts, cuts), the
//! simulator's makespan from the profile (what `pipeweave plan --profile` prints) is set beside
//! the measured pipeline step (first op start to last op end, the median of the steps after a
//! warm-up, threads backend, one compute thread per rank) with the relative error; then
//! `tune --profile`'s ranking (schedules and cuts together) is checked by measuring its first
//! candidates. Rank counts stay within the machine's cores (more ranks than cores time-share
//! them, which the simulator does not model).

use pipeweave::tune::{candidate_cuts, candidate_expressions, tune, tune_cuts};
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

/// The median measured pipeline step of `expression` after a warm-up, in seconds.
fn measure(
    config: GptConfig,
    expression: &str,
    ranks: u32,
    microbatches: u32,
    cut: &[usize],
    corpus: &Corpus,
) -> f64 {
    let plan = build_plan(
        expression,
        &PipelineConfig::new(ranks, microbatches).expect("sizes"),
    )
    .expect("the bench's plans build");
    let mut trainer =
        Trainer::new(&plan, corpus, settings(config, microbatches, cut)).expect("a trainer");
    let mut steps = Vec::new();
    for i in 0..WARM_UP + STEPS {
        trainer.step().expect("a step");
        if i >= WARM_UP {
            let overhead = pipeline_overhead(&plan, trainer.last_measured()).expect("replay");
            steps.push(overhead.measured_seconds);
        }
    }
    steps.sort_by(f64::total_cmp);
    steps[steps.len() / 2]
}

fn predict(
    profile: &Profile,
    expression: &str,
    ranks: u32,
    microbatches: u32,
    cut: &[usize],
) -> f64 {
    let (config, _) = PipelineConfig::new(ranks, microbatches)
        .expect("sizes")
        .with_profile(profile, Some(cut))
        .expect("the profile costs the cut");
    let (_, simulation) = build_and_simulate(expression, &config).expect("the plan builds");
    simulation.makespan()
}

/// What `train_gpt --profile` writes after a run of `f1b(gpipe)` on 2 ranks, 8 microbatches,
/// cut `cut`: every layer measured alone, scaled to the run's per-stage op times.
fn profile_of(config: GptConfig, cut: &[usize], corpus: &Corpus) -> Profile {
    let plan =
        build_plan("f1b(gpipe)", &PipelineConfig::new(2, 8).expect("sizes")).expect("f1b builds");
    let mut trainer = Trainer::new(&plan, corpus, settings(config, 8, cut)).expect("a trainer");
    for _ in 0..WARM_UP + 1 {
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

fn main() {
    pipeweave_train::allocator::keep_freed_memory();
    std::env::set_var("RAYON_NUM_THREADS", "1");
    let corpus = Corpus::default_sources().expect("the checkout's sources");

    let profile = profile_of(model(4), &[2, 2], &corpus);
    println!("one profile (f1b(gpipe), 2 ranks, 8 microbatches, cut 2,2), predictions of other configurations:");
    println!(
        "{:<52} {:>5} {:>4} {:>8} {:>11} {:>10} {:>7}",
        "schedule", "ranks", "M", "cut", "predicted s", "measured s", "error"
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
            &[2, 2],
        ),
    ];
    let mut errors = Vec::new();
    for (expression, ranks, microbatches, cut) in configurations {
        let predicted = predict(&profile, expression, ranks, microbatches, cut);
        let measured = measure(model(4), expression, ranks, microbatches, cut, &corpus);
        let error = (predicted - measured) / measured;
        errors.push(error.abs());
        println!(
            "{expression:<52} {ranks:>5} {microbatches:>4} {:>8} {predicted:>11.4} {measured:>10.4} {:>+6.1}%",
            shown(cut),
            100.0 * error
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

    // tune --profile on a model whose even cut is uneven (5 blocks: 2 + the embedding against
    // 3 + the head): its first candidates measured, and its best cut for 1F1B against the even
    // one.
    let config = model(5);
    let profile = profile_of(config, &[2, 3], &corpus);
    let base = PipelineConfig::new(2, 8).expect("sizes");
    let cuts = candidate_cuts(profile.model.layers, 2, 64);
    let expressions = candidate_expressions(2, None);
    let ranked = tune_cuts(&base, &profile, &cuts, &mut |config, _| {
        Ok(tune(config, &expressions, &|_| {}))
    })
    .expect("tune");
    let even = profile.even_cut(2);
    let mut measured_candidates = Vec::new();
    println!(
        "\ntune --profile, 5 blocks, 2 ranks, 8 microbatches ({} candidates): its first five measured",
        ranked.candidates.len()
    );
    for c in ranked.candidates.iter().take(5) {
        let cut = c.layers_per_stage.clone().unwrap_or_else(|| even.clone());
        let measured = measure(config, &c.expression, 2, 8, &cut, &corpus);
        println!(
            "{:<52} cut {:>5} predicted {:.4} measured {:.4}",
            c.expression,
            shown(&cut),
            c.makespan,
            measured
        );
        measured_candidates.push(measured);
    }
    let best = measured_candidates
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    println!(
        "tune's first choice measures {:.1}% above the best of them (target <= 5%)",
        100.0 * (measured_candidates[0] / best - 1.0)
    );
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
    let chosen_measured = measure(config, "f1b(gpipe)", 2, 8, &chosen, &corpus);
    let even_measured = measure(config, "f1b(gpipe)", 2, 8, &even, &corpus);
    println!(
        "f1b(gpipe): tune's cut {} predicted {:.4} measured {:.4}; the even cut {} predicted {:.4} measured {:.4} ({:+.1}%)",
        shown(&chosen),
        best_f1b.makespan,
        chosen_measured,
        shown(&even),
        for_f1b(&even).unwrap_or(f64::NAN),
        even_measured,
        100.0 * (chosen_measured / even_measured - 1.0)
    );

    // Below the least memory any DualPipe candidate needs (its ranks hold both ends, so every
    // cut costs it the same): tune's pick against the even cut's best.
    let limit_bytes = ranked
        .candidates
        .iter()
        .filter(|c| c.expression.contains("dual("))
        .filter_map(|c| c.peak_activation_bytes)
        .fold(f64::INFINITY, f64::min)
        - 1.0;
    let limited = tune_cuts(&base, &profile, &cuts, &mut |config, cut| {
        let limit = limit_bytes / cut.bytes_per_unit;
        let expressions = candidate_expressions(2, Some(limit));
        Ok(tune(
            &config.clone().with_memory_limit(Some(limit)),
            &expressions,
            &|_| {},
        ))
    })
    .expect("tune within the limit");
    let pick = &limited.candidates[0];
    let pick_cut = pick
        .layers_per_stage
        .clone()
        .expect("candidates carry their cut");
    let even_best = limited
        .candidates
        .iter()
        .find(|c| c.layers_per_stage.as_deref() == Some(&even[..]))
        .expect("the even cut fits its own peak");
    if pick_cut == even {
        println!(
            "within {:.1} MiB (below every DualPipe candidate): tune picks {} on the even cut",
            limit_bytes / (1024.0 * 1024.0),
            pick.expression
        );
        return;
    }
    let pick_measured = measure(config, &pick.expression, 2, 8, &pick_cut, &corpus);
    let even_best_measured = measure(config, &even_best.expression, 2, 8, &even, &corpus);
    println!(
        "within {:.1} MiB (below every DualPipe candidate): tune picks {} with cut {}, measured {:.4}; the even cut's best, {}, measured {:.4} ({:+.1}%)",
        limit_bytes / (1024.0 * 1024.0),
        pick.expression,
        shown(&pick_cut),
        pick_measured,
        even_best.expression,
        even_best_measured,
        100.0 * (pick_measured / even_best_measured - 1.0)
    );
}
