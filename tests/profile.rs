//! Measured profiles on the command line (CLI.md: `--profile`, `--layers-per-stage`, limits in
//! bytes): costs and memory of a cut, tune choosing the cut, and the bad inputs; the former
//! format read as the current one, and a profile of any model's plain layer list.

mod common;

use common::cli::{cli, stderr, words, Cli};
use common::{max_of, read_json, u64s};
use pipeweave::core_ir::TOLERANCE;
use std::process::Command;

/// Our GPT's profile (`pipeweave-profile/2`, as `train_gpt --profile` writes it).
const PROFILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/profile_w192.json"
);

/// The same profile in the former format (`pipeweave-profile/1`).
const PROFILE_V1: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/profile_w192_v1.json"
);

/// A hand-written profile of a model's plain list of 6 layers, none pinned to an end, with no
/// sequence length (as a PyTorch producer may write one).
const GENERIC: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/generic_profile_v2.json"
);

/// The JSON report of `COMMAND SIZES --profile PROFILE --format json` with `extra`, which exits 0.
fn profiled(command: Cli, sizes: &str, profile: &str, extra: &[&str]) -> serde_json::Value {
    command
        .line(sizes)
        .line("--profile")
        .arg(profile)
        .line("--format json")
        .args(extra)
        .json()
}

/// `tune -p 2 -m 8 --profile PROFILE --format json` with `extra`.
fn tune(extra: &[&str]) -> serde_json::Value {
    tune_on("2", extra)
}

/// `tune -p RANKS -m 8 --profile PROFILE --format json` with `extra`.
fn tune_on(ranks: &str, extra: &[&str]) -> serde_json::Value {
    profiled(cli("tune"), &format!("-p {ranks} -m 8"), PROFILE, extra)
}

/// `plan EXPRESSION -p 2 -m 8 --profile PROFILE --layers-per-stage CUT --format json`.
fn plan(expression: &str, cut: &str) -> serde_json::Value {
    plan_on(expression, "2", &["--layers-per-stage", cut])
}

/// `plan EXPRESSION -p RANKS -m 8 --profile PROFILE --format json` with `extra`.
fn plan_on(expression: &str, ranks: &str, extra: &[&str]) -> serde_json::Value {
    let command = cli("plan").arg(expression);
    profiled(command, &format!("-p {ranks} -m 8"), PROFILE, extra)
}

/// The command exits 2 with one line (up to surrounding white space) that contains `expected`.
fn refused(command: Cli, expected: &str) {
    let err = command.exit_2();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(expected), "{command:?}: {err}");
}

/// Two reports' makespans are equal up to the figures' rounding.
fn same_makespan(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    (a["makespan"].as_f64().unwrap() - b["makespan"].as_f64().unwrap()).abs() < 1e-6
}

/// A tune candidate's `--layers-per-stage` as the option takes it.
fn cut_of(candidate: &serde_json::Value) -> String {
    candidate["layers_per_stage"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn layer_sum(profile: &serde_json::Value, range: std::ops::Range<usize>, key: &str) -> f64 {
    profile["layers"].as_array().unwrap()[range]
        .iter()
        .map(|l| l[key].as_f64().unwrap())
        .sum()
}

/// The time F, I and W of the layers in `range` take for one microbatch.
fn share_work(profile: &serde_json::Value, range: std::ops::Range<usize>) -> f64 {
    ["forward", "input_grad", "weight_grad"]
        .iter()
        .map(|k| layer_sum(profile, range.clone(), k))
        .sum()
}

/// The report's makespan, checked against the work `W` of the heavier of two shares (the layers
/// in `shares` of `profile`) over `microbatches`: at least `microbatches · W`, less than
/// `microbatches · W · slack`.
fn makespan_of_shares(
    report: &serde_json::Value,
    profile: &serde_json::Value,
    shares: [std::ops::Range<usize>; 2],
    microbatches: f64,
    slack: f64,
) -> f64 {
    let [first, second] = shares;
    let heavier = share_work(profile, first).max(share_work(profile, second));
    let makespan = report["makespan"].as_f64().unwrap();
    assert!(
        makespan >= microbatches * heavier - TOLERANCE,
        "{makespan} vs {heavier}"
    );
    assert!(
        makespan < microbatches * heavier * slack,
        "{makespan} vs {heavier}"
    );
    makespan
}

#[test]
fn a_cut_is_costed_by_its_layers_and_reports_bytes() {
    let profile = read_json(PROFILE);
    let even = plan("f1b(gpipe)", "2,2");
    assert_eq!(even["layers_per_stage"], serde_json::json!([2, 2]));
    assert!(even["bytes_per_unit"].as_f64().unwrap() > 0.0);
    let bytes = even["peak_activation_bytes_per_rank"].as_array().unwrap();
    assert_eq!(bytes.len(), 2);
    // 1F1B's makespan on 2 ranks is bounded below by the heavier share's M·(F+I+W).
    let makespan = makespan_of_shares(&even, &profile, [0..3, 3..6], 8.0, 1.5);
    // A lopsided cut is slower.
    assert!(plan("f1b(gpipe)", "0,4")["makespan"].as_f64().unwrap() > makespan);
}

#[test]
fn tune_chooses_a_cut_that_plan_reproduces() {
    let found = tune(&["--top", "3"]);
    let first = &found["candidates"][0];
    let again = plan(first["expression"].as_str().unwrap(), &cut_of(first));
    assert!(same_makespan(&again, first), "{again} vs {first}");
    // Every candidate fits a limit given in bytes.
    let limited = tune(&["--memory-limit", "16MiB"]);
    for c in limited["candidates"].as_array().unwrap() {
        assert!(
            c["peak_activation_bytes"].as_f64().unwrap() <= 16.0 * 1024.0 * 1024.0 + 1.0,
            "{c}"
        );
    }
}

#[test]
fn bad_cuts_profiles_and_limits_exit_2_with_one_line() {
    // A former-format profile that lists fewer layers than its model's blocks.
    let missing = std::env::temp_dir().join("pipeweave-missing-layer-profile.json");
    let mut profile = read_json(PROFILE_V1);
    profile["layers"].as_array_mut().unwrap().remove(2);
    std::fs::write(&missing, profile.to_string()).unwrap();
    // A current-format profile with a layer placed last in the middle of the list.
    let misplaced = std::env::temp_dir().join("pipeweave-misplaced-layer-profile.json");
    let mut profile = read_json(PROFILE);
    profile["layers"][2]["placement"] = serde_json::json!("last");
    std::fs::write(&misplaced, profile.to_string()).unwrap();
    // An unknown format tag.
    let unknown = std::env::temp_dir().join("pipeweave-unknown-format-profile.json");
    profile["format"] = serde_json::json!("pipeweave-profile/9");
    std::fs::write(&unknown, profile.to_string()).unwrap();
    // Options after `plan f1b(gpipe) -m 8 --profile PROFILE`.
    let check = |extra: &str, expected: &str| {
        let command = cli("plan f1b(gpipe) -m 8 --profile").arg(PROFILE);
        refused(command.line(extra), expected);
    };
    check("-p 2 --layers-per-stage 1,2", "sums to 3");
    check("-p 2 --layers-per-stage 1,1,2", "3 counts for 2 ranks");
    check("-p 3 --layers-per-stage 2,0,2", "leaves stage 1 empty");
    check("-p 2 --memory-limit 1KiB", "memory");
    // The profile of `plan f1b(gpipe) -p 2 --profile PROFILE`.
    let check = |path: &std::path::Path, expected: &str| {
        refused(cli("plan f1b(gpipe) -p 2 --profile").arg(path), expected);
    };
    check(&missing, "5 layers listed");
    check(
        &misplaced,
        "is placed `any` after layer 2 (`block.1`) placed `last`",
    );
    check(
        &unknown,
        "format `pipeweave-profile/9` is not `pipeweave-profile/2`",
    );
    cli("plan f1b(gpipe) --memory-limit 2GiB").exit_2_with("needs a profile");
    cli("tune -p 2 --profile")
        .arg(PROFILE)
        .line("--memory-limit 1KiB")
        .exit_2_with("no schedule fits");
    // --layers-per-stage needs --profile.
    cli("plan f1b(gpipe) --layers-per-stage 2,2").exit_2();
}

#[test]
fn microbatch_tokens_price_each_microbatch_by_the_per_token_model() {
    let makespan = |profile: &str, tokens: Option<&str>| {
        let extra = match tokens {
            Some(t) => vec!["--microbatch-tokens", t],
            None => vec![],
        };
        let command = cli("plan f1b(gpipe)");
        profiled(command, "-p 2 -m 4", profile, &extra)["makespan"]
            .as_f64()
            .unwrap()
    };
    let full = makespan(PROFILE, None);
    assert!((makespan(PROFILE, Some("64,64,64,64")) - full).abs() < TOLERANCE);
    // Each phase a linear part and a quadratic one (fitted from the half-length times): half
    // the tokens cost at most about half the time (the sends' latency does not shrink) and more
    // than a quarter.
    let half = makespan(PROFILE, Some("32,32,32,32"));
    assert!(half < 0.51 * full && half > 0.25 * full, "{half} vs {full}");
    assert!(makespan(PROFILE, Some("64,16,32,64")) < full);
    // A profile measured at one length: linear in the tokens.
    let mut one_length = read_json(PROFILE);
    for layer in one_length["layers"].as_array_mut().unwrap() {
        layer.as_object_mut().unwrap().remove("half_length");
    }
    let path = std::env::temp_dir().join("pipeweave-one-length-profile.json");
    std::fs::write(&path, one_length.to_string()).unwrap();
    let path = path.to_str().unwrap();
    let full = makespan(path, None);
    let half = makespan(path, Some("32,32,32,32"));
    assert!((half - full / 2.0).abs() < 0.01 * full, "{half} vs {full}");
    for bad in ["64,64,64", "64,64,64,65", "0,64,64,64"] {
        cli("plan f1b(gpipe) -p 2 -m 4 --profile")
            .args(&[PROFILE, "--microbatch-tokens", bad])
            .exit_2();
    }
}

/// The example trainer, built beside this test's binaries by `cargo test`, on a model of
/// `layers` blocks (the profile's has 4).
fn train_gpt(layers: &str) -> Command {
    let mut command = common::train_gpt();
    // The profile's model, 2 ranks, 8 microbatches, one step.
    command.args(["--layers", layers]).args(words(
        "--d-model 192 --heads 4 --seq-len 64 --microbatch-size 4 --microbatches 8 --ranks 2 \
         --steps 1 --threads-per-rank 1",
    ));
    command
}

#[test]
fn train_gpt_runs_the_plan_a_profile_chose_within_its_byte_limit() {
    // A limit below what 1F1B needs on the even cut: Zero Bubble's auto policy fits it there.
    let f1b = plan("f1b(gpipe)", "2,2");
    let limit = (max_of(&f1b["peak_activation_bytes_per_rank"]) * 0.9).round();
    let limit_text = format!("{limit}B");
    let expression = "zero_bubble(f1b(gpipe), policy=auto)";
    let planned = plan_on(
        expression,
        "2",
        &["--layers-per-stage", "2,2", "--memory-limit", &limit_text],
    );
    let predicted = max_of(&planned["peak_activation_bytes_per_rank"]);
    assert!(predicted <= limit + 1.0, "{predicted} > {limit}");
    let out = train_gpt("4")
        .args(["--schedule", expression, "--cost-profile", PROFILE])
        .args(["--layers-per-stage", "2,2", "--memory-limit", &limit_text])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let peaks: Vec<f64> = err
        .lines()
        .find_map(|l| l.strip_prefix("peak live activation bytes per rank (last step, measured): "))
        .expect("train_gpt reports its measured peaks")
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|v| v.trim().parse().unwrap())
        .collect();
    assert_eq!(peaks.len(), 2);
    for peak in peaks {
        // The measured peak stays within what the plan predicted, and so within the limit.
        assert!(peak <= predicted, "measured {peak} > predicted {predicted}");
    }

    // Bad input: one line, exit 2.
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("4", vec!["--memory-limit", "2GiB"], "needs a profile"),
        (
            "3",
            vec!["--cost-profile", PROFILE],
            "a profile of another model",
        ),
        (
            "4",
            vec!["--cost-profile", PROFILE, "--memory-limit", "1KiB"],
            "memory",
        ),
        (
            "4",
            vec!["--cost-profile", GENERIC],
            "not one of this trainer's GPT",
        ),
        (
            "3",
            vec!["--cost-profile", PROFILE_V1],
            "a profile of another model",
        ),
    ];
    for (layers, extra, expected) in cases {
        let out = train_gpt(layers).args(&extra).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
}

#[test]
fn a_share_that_leaves_an_interleaved_position_empty_exits_2() {
    let command = cli("plan vpp(f1b(gpipe), chunks=2) -p 2 -m 8 --profile")
        .arg(PROFILE)
        .line("--layers-per-stage 1,3");
    refused(command, "spread over the 4 positions");
}

#[test]
fn more_ranks_than_cores_time_share_them() {
    let makespan = |extra: &[&str]| {
        plan_on("f1b(gpipe)", "4", extra)["makespan"]
            .as_f64()
            .unwrap()
    };
    let work = share_work(&read_json(PROFILE), 0..6) * 8.0;
    let own = makespan(&[]);
    let shared = makespan(&["--cores", "2"]);
    // The profile ran one compute thread per rank: two cores hold two busy ranks at once, so
    // the whole model's work of 8 microbatches takes at least half its time.
    assert!(shared > own, "{shared} vs {own}");
    assert!(shared >= work / 2.0 * 0.99, "{shared} vs {}", work / 2.0);
    assert!((makespan(&["--cores", "4"]) - own).abs() < 1e-12);
    // tune ranks on the same shared cores, and its pick reproduces in plan.
    let found = tune_on("4", &["--cores", "2", "--top", "1"]);
    let first = &found["candidates"][0];
    let cut = cut_of(first);
    let again = plan_on(
        first["expression"].as_str().unwrap(),
        "4",
        &["--layers-per-stage", &cut, "--cores", "2"],
    );
    let tuned = first["makespan"].as_f64().unwrap();
    assert!(same_makespan(&again, first), "{again} vs {first}");
    assert!(tuned >= work / 2.0 * 0.99, "{tuned}");
    cli("plan f1b(gpipe) -p 4 --profile")
        .arg(PROFILE)
        .line("--cores 0")
        .exit_2_with("--cores");
    // --cores needs --profile.
    cli("plan f1b(gpipe) --cores 2").exit_2();
}

#[test]
fn a_former_profile_reads_as_its_current_conversion() {
    use pipeweave::Profile;
    use pipeweave_train::GptProfileModel;
    let read = |path: &str| Profile::from_json(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (v1, v2) = (read(PROFILE_V1), read(PROFILE));
    // Everything but the model's own keys (the former ones kept as they were) is the same.
    assert_eq!(v1.layers, v2.layers);
    assert_eq!(v1.send, v2.send);
    assert_eq!(
        (
            v1.format.as_str(),
            v1.threads_per_rank,
            v1.repeats,
            v1.calibrated
        ),
        (
            v2.format.as_str(),
            v2.threads_per_rank,
            v2.repeats,
            v2.calibrated
        )
    );
    assert_eq!(
        (v1.seq_len(), &v1.model.microbatch_size, &v1.model.dtype),
        (v2.seq_len(), &v2.model.microbatch_size, &v2.model.dtype)
    );
    assert_eq!(v1.free_layers(), 4);
    // Both describe the same GPT.
    let gpt = GptProfileModel::of(&v2).unwrap();
    assert_eq!(GptProfileModel::of(&v1), Some(gpt));
    assert_eq!(
        (gpt.blocks, gpt.d_model, gpt.heads, gpt.vocab),
        (4, 192, 4, 256)
    );
    // Written back, the former one is in the current format and reads the same.
    let written = v1.to_json();
    assert!(
        written.contains("\"format\": \"pipeweave-profile/2\""),
        "{written}"
    );
    assert_eq!(Profile::from_json(&written).unwrap(), v1);
    // And plan gives the same figures from either file.
    let with = |path: &str| {
        cli("plan zero_bubble(vpp(f1b(gpipe), chunks=2)) -p 2 -m 8 --profile")
            .arg(path)
            .line("--layers-per-stage 2,2 --microbatch-tokens 64,32,16,64,64,48,64,8 --format json")
            .json()
    };
    assert_eq!(with(PROFILE_V1), with(PROFILE));
}

#[test]
fn a_plain_layer_list_of_any_model_is_cut_and_tuned() {
    let profile = read_json(GENERIC);
    // `COMMAND [EXPRESSION] -p 2 -m 4 --profile GENERIC --format json` with `extra`.
    let on_generic = |command: &[&str], extra: &[&str]| {
        profiled(cli("").args(command), "-p 2 -m 4", GENERIC, extra)
    };
    let planned = on_generic(&["plan", "f1b(gpipe)"], &["--layers-per-stage", "2,4"]);
    assert_eq!(planned["layers_per_stage"], serde_json::json!([2, 4]));
    assert!(planned["bytes_per_unit"].as_f64().unwrap() > 0.0);
    // Every layer is free: the first share is layers 0 and 1, the second 2 to 5.
    makespan_of_shares(&planned, &profile, [0..2, 2..6], 4.0, 2.0);
    // Without a cut, the layers even over the shares.
    let even = on_generic(&["plan", "f1b(gpipe)"], &[]);
    assert_eq!(even["layers_per_stage"], serde_json::json!([3, 3]));
    // tune chooses among cuts that give every share a layer, and plan reproduces its pick.
    let found = on_generic(&["tune"], &[]);
    let candidates = found["candidates"].as_array().unwrap();
    assert!(!candidates.is_empty());
    for c in candidates {
        let cut = u64s(&c["layers_per_stage"]);
        assert_eq!(cut.len(), 2, "{c}");
        assert_eq!(cut.iter().sum::<u64>(), 6, "{c}");
        assert!(cut.iter().all(|&n| n >= 1), "{c}");
    }
    let first = &candidates[0];
    let cut = cut_of(first);
    let again = on_generic(
        &["plan", first["expression"].as_str().unwrap()],
        &["--layers-per-stage", &cut],
    );
    assert!(same_makespan(&again, first), "{again} vs {first}");
    // Bad input, one line each: a share with no layer (nothing is pinned to the first), and
    // pricing by tokens without the profile's sequence length.
    for (extra, expected) in [
        ("--layers-per-stage 0,6", "leaves stage 0 empty"),
        ("--microbatch-tokens 8,8,8,8", "no seq_len"),
    ] {
        let command = cli("plan f1b(gpipe) -p 2 -m 4 --profile").arg(GENERIC);
        refused(command.line(extra), expected);
    }
}
