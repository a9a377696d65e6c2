//! A mixture of experts' all-to-alls in the plan (issue 46, item 1): with `--costs ...,a2a=T`,
//! DualPipe's and DualPipeV's overlapped F&B pairs hide every all-to-all of a pair under the
//! other half's compute and beat the same plan with each pair's halves run one after the other;
//! 1F1B and ZB-V hide only what issuing them asynchronously hides; recompute and offload compose
//! (a recomputed forward redoes its all-to-alls); the projected programs state every task's
//! all-to-alls and pass the checker; bad input is one line.

mod common;

use common::cli::cli;
use common::costed;
use pipeweave::core_ir::formats::csv::lowered_csv;
use pipeweave::core_ir::{
    check_programs, project, sequential_pairs_makespan, AllToAll, Instr, ProgramSet,
    ProjectionOptions, RecvPolicy, StageCostsSpec, Task, TaskAllToAlls, TOLERANCE,
};
use pipeweave::{build_plan, simulate, PipelineConfig};
use std::collections::HashMap;

/// P = 8, M = 32, unit F, I, W, all-to-alls of half a forward.
fn config() -> PipelineConfig {
    costed(8, 32, StageCostsSpec::builder().a2a(0.5).build(), 0.0)
}

const DUAL: [&str; 2] = [
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
    "zero_bubble(dual(f1b(gpipe)))",
];

#[test]
fn dual_pairs_hide_every_all_to_all_of_a_pair_and_beat_their_halves_in_turn() {
    let c = config();
    for expression in DUAL {
        let plan = build_plan(expression, &c).unwrap();
        let costs = plan.costs();
        let mut pairs = 0;
        for task in plan.orders().iter().flatten() {
            if let Task::Overlapped { .. } = task {
                pairs += 1;
                let phases = costs.a2a_phases(task);
                assert!(phases.inside > 0.0, "{expression}: {task:?}");
                assert!(
                    phases.inside_exposed.abs() < TOLERANCE,
                    "{expression}: {task:?} waits {} for its all-to-alls",
                    phases.inside_exposed
                );
            }
        }
        assert!(pairs > 0, "{expression} has no F&B pairs");
        let sim = simulate(&plan).unwrap();
        let figures = sim.a2a().expect("all-to-all figures");
        assert!(figures.paired_ops > 0.6, "{expression}: {figures:?}");
        assert!(figures.hidden_fraction() > 0.7, "{expression}: {figures:?}");
        let sequential = sequential_pairs_makespan(&plan).unwrap();
        assert!(
            sim.makespan() < 0.9 * sequential,
            "{expression}: {} against {sequential} with the halves in turn",
            sim.makespan()
        );
    }
}

#[test]
fn one_route_schedules_hide_only_what_asynchronous_issue_hides() {
    let c = config();
    let dual = simulate(&build_plan(DUAL[0], &c).unwrap())
        .unwrap()
        .a2a()
        .unwrap();
    for expression in [
        "f1b(gpipe)",
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
    ] {
        let plan = build_plan(expression, &c).unwrap();
        let sim = simulate(&plan).unwrap();
        let figures = sim.a2a().unwrap();
        assert_eq!(figures.paired_ops, 0.0, "{expression}");
        // Only the forwards' combines and the backwards' heads can run beside other tasks.
        assert!(
            figures.hidden <= figures.total / 2.0 + TOLERANCE,
            "{figures:?}"
        );
        assert!(figures.hidden_fraction() < dual.hidden_fraction());
        // The all-to-alls cost them time: the same plan without them is faster.
        let plain = build_plan(
            expression,
            &costed(8, 32, StageCostsSpec::builder().build(), 0.0),
        )
        .unwrap();
        assert!(simulate(&plain).unwrap().makespan() < sim.makespan());
    }
}

#[test]
fn recompute_and_offload_compose_and_a_recompute_redoes_its_all_to_alls() {
    let c = config();
    for inner in DUAL {
        let base = simulate(&build_plan(inner, &c).unwrap()).unwrap();
        for pass in ["recompute", "offload"] {
            let expression = format!("{pass}({inner}, memory=6)");
            let plan = build_plan(&expression, &c).unwrap();
            let sim = simulate(&plan).unwrap();
            let figures = sim.a2a().unwrap();
            assert!(
                sim.makespan() >= base.makespan() - TOLERANCE,
                "{expression}"
            );
            if pass == "recompute" {
                assert!(
                    figures.total > base.a2a().unwrap().total,
                    "{expression}: a recompute redoes its dispatch and combine"
                );
            }
        }
    }
}

#[test]
fn the_report_names_the_all_to_all_figures_and_bad_input_is_one_line() {
    let report = cli("plan")
        .arg(DUAL[1])
        .line("-p 8 -m 32 --costs F=1,I=1,W=1,a2a=0.5 --format json")
        .json();
    for field in [
        "a2a_hidden",
        "a2a_exposed",
        "a2a_hidden_fraction",
        "a2a_paired_fraction",
        "a2a_sequential_makespan",
    ] {
        assert!(report[field].is_number(), "{field} missing: {report}");
    }
    let text = cli("plan")
        .arg(DUAL[1])
        .line("-p 8 -m 32 --costs a2a=0.5")
        .ok();
    assert!(text.contains("all-to-all   "), "{text}");
    let plain = cli("plan").arg(DUAL[1]).line("--format json").json();
    assert!(plain.get("a2a_hidden").is_none());
    cli("plan f1b(gpipe) --costs a2a=-1").refused("a2a = -1 must be a duration");
    cli("plan f1b(gpipe) --activation-memory weight_grad=0.5,experts=0.6")
        .refused("experts = 0.6 must lie between 0 and weight_grad = 0.5");
    cli("plan f1b(gpipe) --costs experts=2").refused("experts = 2 must be a share");
    cli("plan f1b(gpipe) --costs a2a=0.5,experts=0")
        .refused("a2a = 0.5 is an all-to-all cost, but experts = 0 says the model has no experts");
    let profile = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/profile_w192.json"
    );
    cli("plan f1b(gpipe) -p 2 --costs a2a=0.5 --profile")
        .arg(profile)
        .refused("a2a = 0.5 is an all-to-all cost, but the profiled model has no experts");
}

/// Per all-to-all, how often `instrs` issue it (`issue`) or wait for it.
fn counted(instrs: &[Instr], issue: bool) -> HashMap<AllToAll, usize> {
    let mut count = HashMap::new();
    for instr in instrs {
        match (instr, issue) {
            (Instr::IssueAllToAll(a), true) | (Instr::WaitAllToAll(a), false) => {
                *count.entry(*a).or_default() += 1;
            }
            _ => {}
        }
    }
    count
}

#[test]
fn the_programs_state_every_task_s_all_to_alls_and_pass_the_checker() {
    let c = config();
    for expression in [
        DUAL[1],
        DUAL[0],
        "f1b(gpipe)",
        "zero_bubble(vpp(f1b(gpipe), chunks=2, layout=v))",
        "recompute(zero_bubble(dual(f1b(gpipe))), memory=6)",
        "offload(zero_bubble(dual(f1b(gpipe))), memory=6)",
        "recompute(zero_bubble(f1b(gpipe)), memory=3)",
        "seq_split(f1b(gpipe), chunks=2)",
    ] {
        let plan = build_plan(expression, &c).unwrap();
        for recv in [RecvPolicy::Early, RecvPolicy::JustInTime] {
            for forward_only in [false, true] {
                let options = ProjectionOptions { recv, forward_only };
                let set = project(&plan, options).unwrap();
                check_programs(plan.problem(), &set)
                    .unwrap_or_else(|e| panic!("{expression} {options:?}: {e}"));
                for program in &set.programs {
                    // Every stage has experts: each task's head, span and tail, once per task
                    // (a recompute redoes its forward's), issued and waited for.
                    let mut expected: HashMap<AllToAll, usize> = HashMap::new();
                    for instr in &program.instrs {
                        let Instr::Compute(task) = instr else {
                            continue;
                        };
                        let all = TaskAllToAlls::of(task, |_| true);
                        for a in all.head.iter().chain(&all.span).chain(&all.tail) {
                            *expected.entry(*a).or_default() += 1;
                        }
                    }
                    assert!(!expected.is_empty(), "{expression}: rank {}", program.rank);
                    let issued = counted(&program.instrs, true);
                    assert_eq!(issued, expected, "{expression}: rank {}", program.rank);
                    assert_eq!(counted(&program.instrs, false), expected);
                }
            }
        }
    }
}

#[test]
fn dualpipe_s_programs_put_a_pair_s_four_all_to_alls_in_deepseek_s_slots() {
    let plan = build_plan(DUAL[1], &config()).unwrap();
    assert_eq!(
        (plan.problem().ranks(), plan.problem().microbatches()),
        (8, 32)
    );
    let set = project(&plan, ProjectionOptions::default()).unwrap();
    check_programs(plan.problem(), &set).unwrap();
    let mut pairs = 0;
    for program in &set.programs {
        let text: Vec<String> = program.instrs.iter().map(Instr::to_string).collect();
        for (i, instr) in program.instrs.iter().enumerate() {
            let Instr::Compute(Task::Overlapped { forward, backward }) = instr else {
                continue;
            };
            pairs += 1;
            let names = [
                ("combine-backward", backward),
                ("dispatch", forward),
                ("dispatch-backward", backward),
                ("combine", forward),
            ];
            let slots: Vec<String> = names
                .iter()
                .flat_map(|(name, w)| {
                    ["issue", "wait"].map(|step| {
                        format!("{step}-{name}(stage {}, mb {})", w.stage, w.microbatch)
                    })
                })
                .collect();
            assert_eq!(text[i + 1..i + 9], slots, "rank {}", program.rank);
        }
    }
    assert!(pairs > 100, "{pairs} pairs");
    // JSON keeps them; PyTorch's lowered CSV has no action for them and leaves them out.
    let json = serde_json::to_string(&set).unwrap();
    assert!(
        json.contains(r#"{"IssueAllToAll":{"work":{"stage":"#),
        "{json:.300}"
    );
    assert_eq!(serde_json::from_str::<ProgramSet>(&json).unwrap(), set);
    let mut without = set.clone();
    for program in &mut without.programs {
        program
            .instrs
            .retain(|i| !matches!(i, Instr::IssueAllToAll(_) | Instr::WaitAllToAll(_)));
    }
    assert_eq!(lowered_csv(&set), lowered_csv(&without));
    // Without all-to-all costs, none.
    let plain = build_plan(
        DUAL[1],
        &costed(8, 32, StageCostsSpec::builder().build(), 0.0),
    )
    .unwrap();
    let set = project(&plain, ProjectionOptions::default()).unwrap();
    assert!(set
        .programs
        .iter()
        .flat_map(|p| &p.instrs)
        .all(|i| !matches!(i, Instr::IssueAllToAll(_) | Instr::WaitAllToAll(_))));
}

#[test]
fn the_experts_rows_are_counted_apart_in_each_rank_s_peak() {
    let args = "-p 8 -m 32 --costs a2a=0.5 --activation-memory experts=0.3 --format json";
    for expression in [
        DUAL[1],
        "recompute(zero_bubble(dual(f1b(gpipe))), memory=6)",
    ] {
        let report = cli("plan").arg(expression).line(args).json();
        let peaks = &report["peak_activations_per_rank"];
        let experts = report["experts_peak_per_rank"]
            .as_array()
            .unwrap_or_else(|| panic!("{expression}: no experts' peaks in {report}"));
        for (r, part) in experts.iter().enumerate() {
            let (part, peak) = (part.as_f64().unwrap(), peaks[r].as_f64().unwrap());
            // Every pair held at the peak holds its experts' rows (0.3 of each forward's 1)
            // until its W; a recomputed pair none of them.
            assert!(
                part > 0.0 && part <= 0.3 * peak + TOLERANCE,
                "{expression}: rank {r}"
            );
        }
    }
    // Without the figure the report has no such field, and the peaks are the same.
    let plain = cli("plan")
        .arg(DUAL[1])
        .line("-p 8 -m 32 --costs a2a=0.5 --format json")
        .json();
    assert!(plain.get("experts_peak_per_rank").is_none());
    let with = cli("plan")
        .arg(DUAL[1])
        .line("-p 8 -m 32 --costs a2a=0.5 --activation-memory experts=0.3 --format json")
        .json();
    assert_eq!(
        plain["peak_activations_per_rank"],
        with["peak_activations_per_rank"]
    );
    let text = cli("plan")
        .arg(DUAL[1])
        .line("-p 8 -m 32 --costs a2a=0.5 --activation-memory experts=0.3")
        .ok();
    assert!(text.contains("of it experts"), "{text}");
}
