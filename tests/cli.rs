//! The command-line contract (../shared/CLI.md): output, JSON fields, exit codes.

mod common;

use common::cli::{cli, scratch_dir, stderr, stdout, words};
use common::read_json;
use pipeweave::core_ir::TOLERANCE;

/// The report's figures per rank `key` are `expected`.
fn per_rank_is(report: &serde_json::Value, key: &str, expected: &[f64]) {
    assert_eq!(report[key], serde_json::json!(expected), "{key}");
}

#[test]
fn command_lines_split_at_spaces_outside_parentheses() {
    assert_eq!(
        words("plan vpp(f1b(gpipe), chunks=2)  -p 4 f1b(gpipe"),
        ["plan", "vpp(f1b(gpipe), chunks=2)", "-p", "4", "f1b(gpipe"]
    );
}

#[test]
fn plan_without_arguments_runs_the_documented_default() {
    let text = cli("plan").ok();
    assert!(text.starts_with("vpp(f1b(gpipe), chunks=2)  (4 ranks, 8 stages, 8 microbatches; passes: gpipe -> f1b -> vpp)"), "{text}");
    assert!(text.contains("makespan     28.500"), "{text}");
    assert!(text.contains("bubble rate  0.1579"), "{text}");
    assert!(text.contains("verified     ok"), "{text}");
}

#[test]
fn json_report_has_the_contract_fields() {
    let json =
        cli("plan f1b(gpipe) --ranks 4 --microbatches 8 --format json --costs F=1,I=1,W=1").json();
    for field in [
        "ranks",
        "stages",
        "microbatches",
        "stage_to_rank",
        "order",
        "makespan",
        "bubble_rate",
        "idle_per_rank",
        "peak_activations_per_rank",
        "verified",
        "passes",
    ] {
        assert!(json.get(field).is_some(), "missing {field}");
    }
    assert_eq!(json["makespan"], 33.0);
    assert_eq!(json["verified"], true);
    assert_eq!(json["passes"], serde_json::json!(["gpipe", "f1b"]));
    per_rank_is(&json, "peak_activations_per_rank", &[4.0, 3.0, 2.0, 1.0]);
    per_rank_is(&json, "idle_per_rank", &[9.0, 9.0, 9.0, 9.0]);
    assert_eq!(json["order"][3][0], "3F0");
    assert_eq!(json["order"][3][1], "3B0");
}

#[test]
fn bad_input_exits_2_with_one_line_naming_the_constraint() {
    // Each command line (its words split outside parentheses) and its message, on one line.
    let check = |line: &str, message: &str| {
        cli(line).refused(message);
    };
    check(
        "plan gpipe --ranks 0",
        "ranks = 0 is out of range: must be between 1 and 4096",
    );
    check("plan f1b(gpipe", "syntax error at column 10");
    check("plan f2b(gpipe)", "unknown pass `f2b` at column 1");
    check(
        "plan vpp(f1b(gpipe), chunks=2, size=3)",
        "argument `size` at column 27",
    );
    check("plan --costs F=x", "option --costs: `x` is not a number");
    check(
        "plan vpp(f1b(gpipe), chunks=2, group=4) -p 4 -m 2",
        "precondition `ranks <= group <= microbatches` violated",
    );
    check(
        "plan gpipe --memory-limit 2",
        "pass `gpipe` exceeds the memory limit",
    );
    check(
        "plan --activation-memory total=1,weight_grad=3",
        "weight_grad = 3 must lie between 0 and total = 1",
    );
    check(
        "plan dual(vpp(f1b(gpipe), chunks=3)) -p 2 -m 8",
        "one chunk per rank (DualPipe) or two (DualPipeV)",
    );
    check(
        "plan zero_bubble(dual(f1b(gpipe)), policy=h1) -p 2 -m 4",
        "policies h1 and h2 need plain forwards",
    );
    check(
        "plan zero_bubble(f1b(gpipe), policy=auto, memory=0.5)",
        "auto finds a schedule within the memory limit",
    );
    check(
        "plan --microbatches 99999999999",
        "microbatches = 99999999999 is out of range: must be between 1 and 1048576",
    );
    // Issue 43: what clap used to answer in several lines, or with ranges that were not the
    // real ones; numbers read alike in options and expressions; sums that would overflow.
    let ranks = "ranks = -4 is out of range: must be between 1 and 4096";
    check("plan f1b(gpipe) -p -4", ranks);
    check("plan f1b(gpipe) --ranks=-4", ranks);
    check(
        "plan f1b(gpipe) -p four",
        "option --ranks: `four` is not a number",
    );
    check(
        "plan f1b(gpipe) -m 2.5",
        "option --microbatches: `2.5` is not a whole number",
    );
    check(
        "plan f1b(gpipe) --no-such-option",
        "unexpected argument '--no-such-option'",
    );
    check(
        "plan vpp(f1b(gpipe), chunks=1000000000)",
        "pass `vpp`, argument `chunks` at column 17: 1 <= chunks <= 64 violated",
    );
    check(
        "plan f1b(gpipe) --costs F=1e308,I=1e308",
        "F = 1e308 must be a duration between 0 and 1e100",
    );
    check(
        "plan f1b(gpipe) --costs comm=inf",
        "`inf` is not a number (key `comm`)",
    );
    check(
        "plan f1b(gpipe) --memory-limit 0",
        "option --memory-limit: 0 must be > 0",
    );
    check(
        "plan f1b(gpipe) --memory-limit 1e400",
        "option --memory-limit: `1e400` is too large for a number",
    );
    check(
        "plan zero_bubble(f1b(gpipe),memory=1e400)",
        "syntax error at column 31: `1e400` is too large for a number",
    );
    check(
        "run f1b(gpipe) --timeout nan",
        "option --timeout: `nan` is not a number",
    );
    // The same number reads the same in an option and in an expression.
    let option = cli("plan zero_bubble(f1b(gpipe)) --memory-limit 1e3 --format json").json();
    let argument = cli("plan zero_bubble(f1b(gpipe),memory=1e3) --format json").json();
    assert_eq!(option["memory_limit"], 1000.0);
    assert_eq!(option["makespan"], argument["makespan"]);
}

#[test]
fn a_file_that_is_not_text_is_refused_at_its_line_and_column() {
    let dir = std::env::temp_dir().join(format!("pipeweave-cli-binary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("binary.csv");
    std::fs::write(&path, b"0F0,1F0\n1F1,\xff\n").unwrap();
    cli("check")
        .arg(&path)
        .refused("line 2, column 5: byte 0xff is not UTF-8 text");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_says_which_costs_its_figures_are_under() {
    let dir = std::env::temp_dir().join(format!("pipeweave-cli-costs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("f1b.csv");
    cli("plan f1b(gpipe) -p 2 -m 4 --csv").arg(&path).ok();
    let text = cli("check").arg(&path).ok();
    assert!(text.contains("passes: none"), "{text}");
    assert!(
        text.contains("costs        F=1,I=1,W=1,comm=0 (default)"),
        "{text}"
    );
    let given = cli("check")
        .arg(&path)
        .line("--costs F=2 --format json")
        .json();
    assert_eq!(given["costs"], "F=2");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_25000_deep_expression_exits_2_with_one_line() {
    let deep = "f1b(".repeat(25_000) + "gpipe" + &")".repeat(25_000);
    let err = cli("plan").arg(&deep).error_line();
    assert_eq!(
        err.trim_end(),
        "error: syntax error at column 257: the expression nests more than 64 calls deep"
    );
}

#[test]
fn a_memory_limit_that_holds_is_reported() {
    assert!(cli("plan f1b(gpipe) --memory-limit 4")
        .ok()
        .contains("memory bound"));
}

#[test]
fn the_json_file_option_writes_the_report() {
    let dir = scratch_dir("cli");
    let path = dir.join("plan.json");
    cli("plan gpipe -p 2 -m 3 --json").arg(&path).ok();
    assert_eq!(read_json(&path)["makespan"], 12.0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn plan_writes_svg_trace_csv_and_programs() {
    let dir = scratch_dir("cli-files");
    let path = |name: &str| dir.join(name);
    let text = cli("plan zero_bubble(dual(vpp(f1b(gpipe), chunks=2))) -p 4 -m 8 --svg")
        .arg(path("t.svg"))
        .line("--trace")
        .arg(path("t.json"))
        .line("--csv")
        .arg(path("l.csv"))
        .line("--lowered --programs")
        .arg(path("p.json"))
        .ok();
    assert!(text.contains("programs     ok (96 messages"), "{text}");
    let svg = std::fs::read_to_string(path("t.svg")).unwrap();
    assert!(
        svg.starts_with("<svg")
            && svg.contains("makespan 27.000")
            && svg.contains("F&amp;B overlapped")
    );
    let trace = read_json(path("t.json"));
    let events = trace["traceEvents"].as_array().unwrap();
    assert!(events
        .iter()
        .any(|e| e["ph"] == "X" && e["name"] == "(0F7;7B3)OVERLAP_F_B"));
    assert_eq!(
        events.iter().filter(|e| e["ph"] == "s").count(),
        96,
        "one flow arrow per message"
    );
    let csv = std::fs::read_to_string(path("l.csv")).unwrap();
    assert_eq!(csv.lines().count(), 4);
    assert!(
        csv.lines().all(|l| !l.split(',').any(str::is_empty)),
        "no empty cells in a lowered file"
    );
    let programs = read_json(path("p.json"));
    assert_eq!(programs["programs"].as_array().unwrap().len(), 4);
    // The lowered file checks cleanly with `check`, with the same figures.
    let report = cli("check")
        .arg(path("l.csv"))
        .line("--costs F=1,I=1,W=1 --format json")
        .json();
    assert_eq!(report["messages"], 96);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn csv_refuses_a_plan_with_two_routes_with_one_line_and_leaves_no_file() {
    let dir = scratch_dir("cli-routes");
    let csv = dir.join("F.csv");
    let svg = dir.join("t.svg");
    for lowered in ["", "--lowered"] {
        let err = cli("plan zero_bubble(dual(f1b(gpipe))) -p 4 -m 8 --csv")
            .arg(&csv)
            .line("--svg")
            .arg(&svg)
            .line(lowered)
            .error_line();
        assert!(
            err.starts_with(
                "error: PyTorch's schedule CSV cannot express this plan: the plan has 2 routes"
            ) && err.contains("dual(vpp(f1b(gpipe), chunks=2)) (DualPipeV)"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            0,
            "no file is left, not even the other outputs"
        );
    }
    // The report and the programs stay available for such plans.
    let programs = dir.join("p.json");
    cli("plan zero_bubble(dual(f1b(gpipe))) -p 4 -m 8 --format json --programs")
        .arg(&programs)
        .ok();
    assert!(programs.is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lowered_csv_holds_pytorchs_parameter_actions() {
    let text = cli("plan f1b(gpipe) -p 2 -m 3 --csv /dev/stdout --lowered").ok();
    let rows: Vec<&str> = text.lines().take(2).collect();
    assert!(rows[0].starts_with("0UNSHARD,0F0,"), "{}", rows[0]);
    assert!(
        rows[0].ends_with(",0B2,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD"),
        "{}",
        rows[0]
    );
    assert!(
        rows[1].contains(",1SEND_B2,1WAIT_SEND_B2,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD"),
        "{}",
        rows[1]
    );
    assert!(text.contains("parameters   unshard/reshard and gradient reduction in order"));
}

#[test]
fn check_reports_a_deadlock_with_its_cycle_and_exit_2() {
    let dir = scratch_dir("cli-check");
    let file = dir.join("deadlock.csv");
    std::fs::write(&file, "0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n").unwrap();
    cli("check")
        .arg(&file)
        .refused("deadlock: rank 0 waits at task 1 (0B0) for 1I0");
    if std::path::Path::new("../shared/reference/dualpipe_pp4_m8.json").exists() {
        let text =
            cli("check ../shared/reference/dualpipe_pp4_m8.json --costs F=1,I=1,W=1,FB=3").ok();
        // DeepSeek's figure: a mirrored stage is a copy of a chunk and takes the rank's whole
        // share, as in `plan 'zero_bubble(dual(f1b(gpipe)))'` with the same costs.
        assert!(text.contains("makespan     26.000"), "{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn run_executes_on_threads_and_compares_gradients() {
    let report = cli("run zero_bubble(dual(f1b(gpipe))) -p 4 -m 8 --time-scale 0.2 --json").json();
    assert_eq!(report["gradients_equal"], true);
    assert_eq!(report["backend"], "threads");
    assert_eq!(report["simulated_makespan"], 26.0);
    // The run itself is a schedule with the tasks' measured times: replaying the plan with those
    // times as early as dependencies allow cannot take longer.
    let measured = report["measured_seconds"].as_f64().unwrap();
    let replayed = report["replayed_seconds"].as_f64().unwrap();
    assert!(
        replayed > 0.0 && replayed <= measured + TOLERANCE,
        "{report}"
    );
    let overhead = report["overhead"].as_f64().unwrap();
    assert!((overhead - measured / replayed).abs() < 1e-12, "{report}");
    cli("run f1b(gpipe) --time-scale -1").exit_2();
}

#[test]
fn stage_costs_files_set_uneven_costs_and_bad_ones_are_named() {
    let dir = scratch_dir("cli-costs");
    let json = plan_with_stage_costs(
        "f1b(gpipe)",
        "2",
        "4",
        r#"[{"F":1,"I":1,"W":1},{"F":2,"I":2,"W":2}]"#,
    );
    // The slow second rank dominates: it starts at 1 and is busy 4 x 6 = 24 without a gap; then
    // rank 0's last backward (2) follows: 1 + 24 + 2.
    assert_eq!(json["makespan"], 27.0);
    per_rank_is(&json, "idle_per_rank", &[15.0, 3.0]);
    for (body, message) in [
        (
            r#"[{"F":1}]"#,
            "cost model describes 1 stages but the problem has 2",
        ),
        (r#"[{"F":1},{"X":2}]"#, "entry 1: unknown key `X`"),
        (
            r#"{"F":1}"#,
            "expected a list with one cost object per rank",
        ),
        (
            r#"[{"F":-1},{"F":1}]"#,
            "F = -1 must be a duration between 0 and 1e100",
        ),
    ] {
        let bad = dir.join("bad.json");
        std::fs::write(&bad, body).unwrap();
        cli("plan f1b(gpipe) -p 2 -m 4 --stage-costs")
            .arg(&bad)
            .exit_2_with(message);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tune_ranks_schedules_and_each_expression_gives_the_same_figures_to_plan() {
    let report = cli("tune -p 4 -m 8 --memory-limit 4 --top 3 --format json").json();
    let candidates = report["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 3);
    assert!(report["evaluated"].as_u64().unwrap() >= 10);
    let mut last = 0.0;
    for c in candidates {
        let makespan = c["makespan"].as_f64().unwrap();
        assert!(makespan >= last);
        last = makespan;
        assert!(c["peak_activations"].as_f64().unwrap() <= 4.0 + TOLERANCE);
        let plan = cli("plan")
            .arg(c["expression"].as_str().unwrap())
            .line("-p 4 -m 8 --memory-limit 4 --format json")
            .stdout_json();
        assert_eq!(plan["makespan"], c["makespan"], "{}", c["expression"]);
        assert_eq!(plan["bubble_rate"], c["bubble_rate"], "{}", c["expression"]);
    }
    // Half a unit is reached by moving an interleaving's activations at the limit; a tenth of
    // one (less than one chunk of the 8-chunk interleaving holds) by nothing.
    let half = cli("tune -p 4 -m 8 --memory-limit 0.5 --top 1 --format json").json();
    let best = &half["candidates"][0];
    assert!(best["peak_activations"].as_f64().unwrap() <= 0.5 + TOLERANCE);
    cli("tune -p 4 -m 8 --memory-limit 0.1").exit_2_with("no schedule fits");
}

/// The JSON report of `plan EXPR -p P -m M --stage-costs FILE` with `costs` in FILE.
fn plan_with_stage_costs(expression: &str, p: &str, m: &str, costs: &str) -> serde_json::Value {
    let dir = scratch_dir(&format!(
        "cli-stage-costs-{}",
        expression.len() + costs.len()
    ));
    let file = dir.join("costs.json");
    std::fs::write(&file, costs).unwrap();
    let report = cli("plan")
        .args(&[expression, "-p", p, "-m", m, "--stage-costs"])
        .arg(&file)
        .line("--format json")
        .json();
    std::fs::remove_dir_all(&dir).unwrap();
    report
}

#[test]
fn dualpipe_overlap_with_uneven_stage_costs_costs_its_two_parts() {
    let report = plan_with_stage_costs(
        "dual(f1b(gpipe))",
        "4",
        "8",
        r#"[{"F":1,"I":2,"W":0.5},{"F":2,"I":1,"W":1},{"F":1.5,"I":1,"W":0.3},{"F":1,"I":1,"W":1}]"#,
    );
    assert_eq!(report["makespan"], 32.9);
}

#[test]
fn tune_frontier_is_monotone_each_point_reproduces_and_a_limit_picks_from_it() {
    // The sizes and costs of every command here.
    const SIZES: &str = "-p 4 -m 12 --costs F=1,I=1,W=1,comm=0.1";
    let dir = scratch_dir("cli-frontier");
    let svg = dir.join("f.svg");
    let report = cli("tune")
        .line(SIZES)
        .line("--frontier --format json --svg")
        .arg(&svg)
        .json();
    let points = report["frontier"].as_array().unwrap();
    assert!(points.len() >= 4, "{points:?}");
    let mut last: Option<(f64, f64)> = None;
    for p in points {
        let (limit, makespan) = (
            p["memory_limit"].as_f64().unwrap(),
            p["makespan"].as_f64().unwrap(),
        );
        assert!(p["peak_activations"].as_f64().unwrap() <= limit + TOLERANCE);
        if let Some((l, m)) = last {
            assert!(limit > l && makespan < m, "not monotone: {points:?}");
        }
        last = Some((limit, makespan));
        let plan = cli("plan")
            .arg(p["expression"].as_str().unwrap())
            .line(SIZES)
            .line("--format json")
            .stdout_json();
        assert_eq!(plan["makespan"], p["makespan"], "{}", p["expression"]);
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    // `tune --memory-limit` ranks the same search: its best is the frontier's point there.
    let middle = &points[points.len() / 2];
    let limit = middle["memory_limit"].as_f64().unwrap().to_string();
    let tuned = cli("tune")
        .line(SIZES)
        .line("--memory-limit")
        .arg(&limit)
        .line("--format json")
        .stdout_json();
    assert_eq!(tuned["candidates"][0]["makespan"], middle["makespan"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn recompute_and_offload_report_device_and_host_memory_and_their_counts() {
    let json_of = |expression: &str| {
        cli("plan")
            .arg(expression)
            .line("-p 4 -m 8 --format json --costs F=1,I=1,W=1,R=1.5,offload=0.5")
            .json()
    };
    let kept = json_of("f1b(gpipe)");
    assert!(kept.get("device_peak_per_rank").is_none());
    assert!(kept.get("host_peak_per_rank").is_none());
    assert!(kept.get("recomputed_ops").is_none());
    let offloaded = json_of("offload(f1b(gpipe), memory=2)");
    per_rank_is(&offloaded, "device_peak_per_rank", &[2.0, 2.0, 2.0, 1.0]);
    per_rank_is(&offloaded, "host_peak_per_rank", &[3.0, 2.0, 0.0, 0.0]);
    assert_eq!(offloaded["offloads_per_rank"][0], 6);
    assert_eq!(offloaded["memory_limit"], 2.0);
    let order = offloaded["order"][0].as_array().unwrap();
    assert!(order.iter().any(|a| a == "0OFFLOAD0") && order.iter().any(|a| a == "0RELOAD0"));
    let recomputed = json_of("recompute(f1b(gpipe), memory=2)");
    assert!(recomputed.get("host_peak_per_rank").is_none());
    let per_rank = recomputed["recomputes_per_rank"].as_array().unwrap();
    let total: u64 = per_rank.iter().map(|r| r.as_u64().unwrap()).sum();
    assert_eq!(recomputed["recomputed_ops"], total);
    assert!(total >= 3, "{recomputed}");

    // Text: the extra columns, and the link rows of the grid.
    let text = stdout(&cli("plan offload(f1b(gpipe), memory=2) -p 4 -m 8").output());
    assert!(text.contains("offloads  host peak  link busy"), "{text}");
    assert!(text.contains("   link |"), "{text}");

    // What ZB-H1's late Ws keep, recomputed for them (RW): counted with the recomputes.
    let late = json_of("recompute(zero_bubble(f1b(gpipe), policy=h1), memory=1)");
    let orders = late["order"].as_array().unwrap();
    let rebuilt = orders[3].as_array().unwrap().iter();
    let rebuilt = rebuilt
        .filter(|a| a.as_str().unwrap().contains("RW"))
        .count() as u64;
    assert!(rebuilt > 0, "{late}");
    assert!(
        late["recomputes_per_rank"][3].as_u64().unwrap() >= rebuilt,
        "{late}"
    );

    // `weight_grads=keep` recomputes activations only (what PyTorch's runtime can run); where
    // that fits, RW is used only if it makes the plan faster: at PyTorch's measured share (2/3
    // of a stage's activations kept for W) ZB-H1 at 3.1 units fits without any RW, as fast.
    let at_torch_share = |expression: &str| {
        cli("plan")
            .arg(expression)
            .line("-p 4 -m 8 --format json --activation-memory total=1,weight_grad=0.6667")
            .json()
    };
    let has_rw = |report: &serde_json::Value| report["order"].to_string().contains("RW");
    let chosen = at_torch_share("recompute(zero_bubble(f1b(gpipe), policy=h1), memory=3.1)");
    let keep = at_torch_share(
        "recompute(zero_bubble(f1b(gpipe), policy=h1), memory=3.1, weight_grads=keep)",
    );
    assert!(!has_rw(&chosen) && !has_rw(&keep), "{chosen}");
    assert_eq!(chosen["makespan"], keep["makespan"]);
    cli(
        "plan recompute(zero_bubble(f1b(gpipe), policy=h1), memory=1, weight_grads=keep) -p 4 -m 8",
    )
    .refused("kept for a weight gradient");
    cli("plan recompute(f1b(gpipe), memory=2, weight_grads=some) -p 4 -m 8")
        .refused("expected `recompute` or `keep`");

    // A limit no recompute reaches (a running forward holds its own activations): exit 2, one
    // line naming the constraint.
    cli("plan recompute(zero_bubble(f1b(gpipe), policy=h1), memory=0.5) -p 4 -m 8")
        .refused("`memory=0.5 reachable with pairs recomputed`");
}

#[test]
fn ranks_sharing_a_host_link_slow_each_other_s_transfers_and_the_report_says_how_busy_it_is() {
    // 8 ranks, 3 interleaved chunks offloaded to one unit: the links carry most of the step.
    let expression = "offload(vpp(f1b(gpipe), chunks=3, group=8), memory=1)";
    let json_of = |extra: &str| {
        cli("plan")
            .arg(expression)
            .line(&format!(
                "-p 8 -m 32 --costs offload=1 --format json {extra}"
            ))
            .json()
    };
    let own = json_of("");
    assert!(own.get("ranks_per_link").is_none() && own.get("shared_link_busy").is_none());
    let pairs = json_of("--ranks-per-link 2");
    assert_eq!(pairs["ranks_per_link"], 2);
    let busy = pairs["shared_link_busy"].as_array().unwrap();
    assert_eq!(busy.len(), 4);
    let per_rank = pairs["link_busy_per_rank"].as_array().unwrap();
    for (link, busy) in busy.iter().enumerate() {
        // One link carries both ranks' transfers: busy at least as long as either, at most both.
        let busy = busy.as_f64().unwrap();
        let (a, b) = (
            per_rank[2 * link].as_f64().unwrap(),
            per_rank[2 * link + 1].as_f64().unwrap(),
        );
        assert!(
            busy >= a.max(b) - 1e-6 && busy <= a + b + 1e-6,
            "{busy} {a} {b}"
        );
    }
    let (alone, shared) = (
        own["makespan"].as_f64().unwrap(),
        pairs["makespan"].as_f64().unwrap(),
    );
    assert!(shared > alone, "{shared} vs {alone}");
    let text = stdout(
        &cli("plan")
            .arg(expression)
            .line("-p 8 -m 32 --ranks-per-link 4")
            .output(),
    );
    assert!(
        text.contains("host links   4 ranks per link; busy "),
        "{text}"
    );
    cli("plan f1b(gpipe) --ranks-per-link 0").refused("0 ranks per host link");
}

#[test]
fn csv_of_a_recompute_plan_keeps_the_compute_order_and_says_what_it_leaves_out() {
    let dir = scratch_dir("residency-csv");
    let path = dir.join("plan.csv");
    let out = cli("plan offload(recompute(f1b(gpipe), memory=2), memory=1) -p 4 -m 8 --csv")
        .arg(&path)
        .output();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let note = stderr(&out);
    assert!(
        note.starts_with("note: the CSV leaves out ")
            && note.contains("PyTorch's schedule format has no such actions"),
        "{note}"
    );
    let csv = std::fs::read_to_string(&path).unwrap();
    assert!(!csv.contains('R') && !csv.contains('O'), "{csv}");
    // The compute order is the plain 1F1B's: PyTorch trains it as it would 1F1B.
    let plain = dir.join("plain.csv");
    cli("plan f1b(gpipe) -p 4 -m 8 --csv").arg(&plain).ok();
    assert_eq!(csv, std::fs::read_to_string(&plain).unwrap());
    // The file checks as a schedule of its own.
    cli("check").arg(&path).ok();
    std::fs::remove_dir_all(&dir).unwrap();
}
