//! Measured profiles on the command line (CLI.md: `--profile`, `--layers-per-stage`, limits in
//! bytes): costs and memory of a cut, tune choosing the cut, and the bad inputs; the former
//! format read as the current one, and a profile of any model's plain layer list.

use std::process::{Command, Output};

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

fn pipeweave(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_pipeweave"))
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = pipeweave(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `tune -p 2 -m 8 --profile PROFILE --format json` with `extra`.
fn tune(extra: &[&str]) -> serde_json::Value {
    tune_on("2", extra)
}

/// `tune -p RANKS -m 8 --profile PROFILE --format json` with `extra`.
fn tune_on(ranks: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "tune",
        "-p",
        ranks,
        "-m",
        "8",
        "--profile",
        PROFILE,
        "--format",
        "json",
    ];
    args.extend(extra);
    json(&args)
}

/// `plan EXPRESSION -p 2 -m 8 --profile PROFILE --layers-per-stage CUT --format json`.
fn plan(expression: &str, cut: &str) -> serde_json::Value {
    plan_on(expression, "2", &["--layers-per-stage", cut])
}

/// `plan EXPRESSION -p RANKS -m 8 --profile PROFILE --format json` with `extra`.
fn plan_on(expression: &str, ranks: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "plan",
        expression,
        "-p",
        ranks,
        "-m",
        "8",
        "--profile",
        PROFILE,
        "--format",
        "json",
    ];
    args.extend(extra);
    json(&args)
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

#[test]
fn a_cut_is_costed_by_its_layers_and_reports_bytes() {
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(PROFILE).unwrap()).unwrap();
    let even = plan("f1b(gpipe)", "2,2");
    assert_eq!(even["layers_per_stage"], serde_json::json!([2, 2]));
    assert!(even["bytes_per_unit"].as_f64().unwrap() > 0.0);
    let bytes = even["peak_activation_bytes_per_rank"].as_array().unwrap();
    assert_eq!(bytes.len(), 2);
    // 1F1B's makespan on 2 ranks is bounded below by the heavier share's M·(F+I+W).
    let share = |range| {
        ["forward", "input_grad", "weight_grad"]
            .iter()
            .map(|k| layer_sum(&profile, std::ops::Range::clone(&range), k))
            .sum::<f64>()
    };
    let heavier = share(0..3).max(share(3..6));
    let makespan = even["makespan"].as_f64().unwrap();
    assert!(makespan >= 8.0 * heavier - 1e-9, "{makespan} vs {heavier}");
    assert!(makespan < 8.0 * heavier * 1.5, "{makespan} vs {heavier}");
    // A lopsided cut is slower.
    assert!(plan("f1b(gpipe)", "0,4")["makespan"].as_f64().unwrap() > makespan);
}

#[test]
fn tune_chooses_a_cut_that_plan_reproduces() {
    let found = tune(&["--top", "3"]);
    let first = &found["candidates"][0];
    let again = plan(first["expression"].as_str().unwrap(), &cut_of(first));
    let close = |a: &serde_json::Value, b: &serde_json::Value| {
        (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 1e-6
    };
    assert!(
        close(&again["makespan"], &first["makespan"]),
        "{again} vs {first}"
    );
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
    let mut profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(PROFILE_V1).unwrap()).unwrap();
    profile["layers"].as_array_mut().unwrap().remove(2);
    std::fs::write(&missing, profile.to_string()).unwrap();
    // A current-format profile with a layer placed last in the middle of the list.
    let misplaced = std::env::temp_dir().join("pipeweave-misplaced-layer-profile.json");
    let mut profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(PROFILE).unwrap()).unwrap();
    profile["layers"][2]["placement"] = serde_json::json!("last");
    std::fs::write(&misplaced, profile.to_string()).unwrap();
    // An unknown format tag.
    let unknown = std::env::temp_dir().join("pipeweave-unknown-format-profile.json");
    profile["format"] = serde_json::json!("pipeweave-profile/9");
    std::fs::write(&unknown, profile.to_string()).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["-p", "2", "--layers-per-stage", "1,2"], "sums to 3"),
        (
            vec!["-p", "2", "--layers-per-stage", "1,1,2"],
            "3 counts for 2 ranks",
        ),
        (
            vec!["-p", "3", "--layers-per-stage", "2,0,2"],
            "leaves stage 1 empty",
        ),
        (vec!["-p", "2", "--memory-limit", "1KiB"], "memory"),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["plan", "f1b(gpipe)", "-m", "8", "--profile", PROFILE];
        args.extend(extra.iter().copied());
        let out = pipeweave(&args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
    for (path, expected) in [
        (&missing, "5 layers listed"),
        (
            &misplaced,
            "is placed `any` after layer 2 (`block.1`) placed `last`",
        ),
        (
            &unknown,
            "format `pipeweave-profile/9` is not `pipeweave-profile/2`",
        ),
    ] {
        let out = pipeweave(&[
            "plan",
            "f1b(gpipe)",
            "-p",
            "2",
            "--profile",
            path.to_str().unwrap(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(expected), "{err}");
    }
    let out = pipeweave(&["plan", "f1b(gpipe)", "--memory-limit", "2GiB"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a profile"));
    let out = pipeweave(&[
        "tune",
        "-p",
        "2",
        "--profile",
        PROFILE,
        "--memory-limit",
        "1KiB",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no schedule fits"));
    let out = pipeweave(&["plan", "f1b(gpipe)", "--layers-per-stage", "2,2"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--layers-per-stage needs --profile"
    );
}

#[test]
fn microbatch_tokens_price_each_microbatch_by_the_per_token_model() {
    let makespan = |profile: &str, tokens: Option<&str>| {
        let mut args = vec![
            "plan",
            "f1b(gpipe)",
            "-p",
            "2",
            "-m",
            "4",
            "--profile",
            profile,
            "--format",
            "json",
        ];
        if let Some(t) = tokens {
            args.extend(["--microbatch-tokens", t]);
        }
        json(&args)["makespan"].as_f64().unwrap()
    };
    let full = makespan(PROFILE, None);
    assert!((makespan(PROFILE, Some("64,64,64,64")) - full).abs() < 1e-9);
    // Each phase a linear part and a quadratic one (fitted from the half-length times): half
    // the tokens cost at most about half the time (the sends' latency does not shrink) and more
    // than a quarter.
    let half = makespan(PROFILE, Some("32,32,32,32"));
    assert!(half < 0.51 * full && half > 0.25 * full, "{half} vs {full}");
    assert!(makespan(PROFILE, Some("64,16,32,64")) < full);
    // A profile measured at one length: linear in the tokens.
    let mut one_length: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(PROFILE).unwrap()).unwrap();
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
        let out = pipeweave(&[
            "plan",
            "f1b(gpipe)",
            "-p",
            "2",
            "-m",
            "4",
            "--profile",
            PROFILE,
            "--microbatch-tokens",
            bad,
        ]);
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}

/// The example trainer, built beside this test's binaries by `cargo test`, on a model of
/// `layers` blocks (the profile's has 4).
fn train_gpt(layers: &str) -> Command {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_pipeweave"));
    let path = bin
        .parent()
        .map(|dir| dir.join("examples").join("train_gpt"))
        .expect("the binary has a folder");
    assert!(path.exists(), "{} is missing", path.display());
    let mut command = Command::new(path);
    // The profile's model, 2 ranks, 8 microbatches, one step.
    command.args([
        "--layers",
        layers,
        "--d-model",
        "192",
        "--heads",
        "4",
        "--seq-len",
        "64",
        "--microbatch-size",
        "4",
        "--microbatches",
        "8",
        "--ranks",
        "2",
        "--steps",
        "1",
        "--threads-per-rank",
        "1",
    ]);
    command
}

fn max_of(values: &serde_json::Value) -> f64 {
    values
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .fold(0.0, f64::max)
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
    let err = String::from_utf8_lossy(&out.stderr).to_string();
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
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
}

#[test]
fn a_share_that_leaves_an_interleaved_position_empty_exits_2() {
    let out = pipeweave(&[
        "plan",
        "vpp(f1b(gpipe), chunks=2)",
        "-p",
        "2",
        "-m",
        "8",
        "--profile",
        PROFILE,
        "--layers-per-stage",
        "1,3",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("spread over the 4 positions"), "{err}");
}

#[test]
fn more_ranks_than_cores_time_share_them() {
    let makespan = |extra: &[&str]| {
        plan_on("f1b(gpipe)", "4", extra)["makespan"]
            .as_f64()
            .unwrap()
    };
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(PROFILE).unwrap()).unwrap();
    let work: f64 = ["forward", "input_grad", "weight_grad"]
        .iter()
        .map(|k| layer_sum(&profile, 0..6, k))
        .sum::<f64>()
        * 8.0;
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
    assert!(
        (again["makespan"].as_f64().unwrap() - tuned).abs() < 1e-6,
        "{again} vs {first}"
    );
    assert!(tuned >= work / 2.0 * 0.99, "{tuned}");
    let out = pipeweave(&[
        "plan",
        "f1b(gpipe)",
        "-p",
        "4",
        "--profile",
        PROFILE,
        "--cores",
        "0",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cores"));
    let out = pipeweave(&["plan", "f1b(gpipe)", "--cores", "2"]);
    assert_eq!(out.status.code(), Some(2), "--cores needs --profile");
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
        json(&[
            "plan",
            "zero_bubble(vpp(f1b(gpipe), chunks=2))",
            "-p",
            "2",
            "-m",
            "8",
            "--profile",
            path,
            "--layers-per-stage",
            "2,2",
            "--microbatch-tokens",
            "64,32,16,64,64,48,64,8",
            "--format",
            "json",
        ])
    };
    assert_eq!(with(PROFILE_V1), with(PROFILE));
}

#[test]
fn a_plain_layer_list_of_any_model_is_cut_and_tuned() {
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(GENERIC).unwrap()).unwrap();
    // `COMMAND [EXPRESSION] -p 2 -m 4 --profile GENERIC --format json` with `extra`.
    let on_generic = |command: &[&str], extra: &[&str]| {
        let mut args = command.to_vec();
        args.extend([
            "-p",
            "2",
            "-m",
            "4",
            "--profile",
            GENERIC,
            "--format",
            "json",
        ]);
        args.extend(extra);
        json(&args)
    };
    let planned = on_generic(&["plan", "f1b(gpipe)"], &["--layers-per-stage", "2,4"]);
    assert_eq!(planned["layers_per_stage"], serde_json::json!([2, 4]));
    assert!(planned["bytes_per_unit"].as_f64().unwrap() > 0.0);
    // Every layer is free: the first share is layers 0 and 1, the second 2 to 5.
    let share = |range: std::ops::Range<usize>| {
        ["forward", "input_grad", "weight_grad"]
            .iter()
            .map(|k| layer_sum(&profile, range.clone(), k))
            .sum::<f64>()
    };
    let heavier = share(0..2).max(share(2..6));
    let makespan = planned["makespan"].as_f64().unwrap();
    assert!(makespan >= 4.0 * heavier - 1e-9, "{makespan} vs {heavier}");
    assert!(makespan < 4.0 * heavier * 2.0, "{makespan} vs {heavier}");
    // Without a cut, the layers even over the shares.
    let even = on_generic(&["plan", "f1b(gpipe)"], &[]);
    assert_eq!(even["layers_per_stage"], serde_json::json!([3, 3]));
    // tune chooses among cuts that give every share a layer, and plan reproduces its pick.
    let found = on_generic(&["tune"], &[]);
    let candidates = found["candidates"].as_array().unwrap();
    assert!(!candidates.is_empty());
    for c in candidates {
        let cut: Vec<u64> = c["layers_per_stage"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
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
    assert!(
        (again["makespan"].as_f64().unwrap() - first["makespan"].as_f64().unwrap()).abs() < 1e-6,
        "{again} vs {first}"
    );
    // Bad input, one line each: a share with no layer (nothing is pinned to the first), and
    // pricing by tokens without the profile's sequence length.
    for (extra, expected) in [
        (vec!["--layers-per-stage", "0,6"], "leaves stage 0 empty"),
        (vec!["--microbatch-tokens", "8,8,8,8"], "no seq_len"),
    ] {
        let mut args = vec![
            "plan",
            "f1b(gpipe)",
            "-p",
            "2",
            "-m",
            "4",
            "--profile",
            GENERIC,
        ];
        args.extend(extra);
        let out = pipeweave(&args);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}
