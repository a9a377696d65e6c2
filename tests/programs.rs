//! Projection and the communication checker over random plans of every pass prefix; CSV export
//! and import round trips; mutated programs caught with the right error.

use pipeweave::core_ir::formats::csv::{compute_csv, import_csv, lowered_csv};
use pipeweave::core_ir::{
    check_programs, project, CommError, CommOp, Instr, ProgramSet, ProjectionOptions, RecvPolicy,
};
use pipeweave::{build_plan, PipelineConfig, Plan, StageCosts};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

/// Computes and communication of every rank, flattened (markers dropped): what a CSV can hold.
fn essence(set: &ProgramSet) -> Vec<Vec<String>> {
    set.programs
        .iter()
        .map(|p| {
            p.instrs
                .iter()
                .flat_map(|i| match i {
                    Instr::Compute(t) => vec![t.to_string()],
                    Instr::Comm(g) => g.ops.iter().map(|op| op.to_string()).collect(),
                    _ => Vec::new(),
                })
                .collect()
        })
        .collect()
}

fn expressions(p: u32, m: u32) -> Vec<String> {
    let mut out = vec![
        "gpipe".to_string(),
        "f1b(gpipe)".to_string(),
        "vpp(gpipe, chunks=3)".to_string(),
        format!("vpp(gpipe, chunks=3, group={})", m.min(2)),
        "vpp(f1b(gpipe), chunks=2, layout=v)".to_string(),
        "zero_bubble(f1b(gpipe), policy=h1)".to_string(),
        "zero_bubble(f1b(gpipe))".to_string(),
    ];
    // Interleaving and DualPipeV take every microbatch count.
    out.push("vpp(f1b(gpipe), chunks=2)".to_string());
    out.push("vpp(f1b(gpipe), chunks=3)".to_string());
    out.push("zero_bubble(vpp(f1b(gpipe), chunks=2))".to_string());
    out.push("zero_bubble(dual(vpp(f1b(gpipe), chunks=2, layout=v)))".to_string());
    if m >= 2 * p && p % 2 == 0 && m % 2 == 0 {
        out.push("zero_bubble(dual(f1b(gpipe)))".to_string());
        out.push("dual(f1b(gpipe))".to_string());
    }
    out
}

fn plan(expr: &str, p: u32, m: u32) -> Plan {
    plan_with_costs(expr, p, m, (1, 1, 1, 0))
}

fn plan_with_costs(expr: &str, p: u32, m: u32, (f, i, w, c): (u32, u32, u32, u32)) -> Plan {
    let costs = pipeweave::StageCostsSpec::builder()
        .forward(f as f64)
        .input_grad(i as f64)
        .weight_grad(w as f64)
        .build()
        .validate()
        .unwrap();
    let config = PipelineConfig::new(p, m)
        .unwrap()
        .with_costs(costs, c as f64 / 10.0)
        .unwrap();
    build_plan(expr, &config).unwrap_or_else(|e| panic!("{expr} P={p} M={m}: {e}"))
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 200,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/programs.txt"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn projection_passes_the_checker_and_csv_round_trips(
        p in 1u32..=6, m in 1u32..=16, costs in (1u32..=4, 1u32..=4, 0u32..=3, 0u32..=5),
    ) {
        for expr in expressions(p, m) {
            let plan = plan_with_costs(&expr, p, m, costs);
            for recv in [RecvPolicy::Early, RecvPolicy::JustInTime] {
                let set = project(&plan, ProjectionOptions { recv, forward_only: false }).unwrap();
                check_programs(plan.problem(), &set).unwrap_or_else(|e| panic!("{expr} P={p} M={m} {recv:?}: {e}"));
                let lowered = import_csv(&lowered_csv(&set), StageCosts::default(), 0.0).unwrap();
                prop_assert_eq!(lowered.plan.orders(), plan.orders(), "{}: lowered orders", expr);
                match lowered.programs {
                    Some(programs) => {
                        prop_assert_eq!(essence(&programs), essence(&set), "{}: lowered programs", expr);
                        check_programs(lowered.plan.problem(), &programs).unwrap();
                    }
                    // Without any message (one rank) a lowered file is a compute file.
                    None => prop_assert!(set.programs.iter().all(|p| p.comm_ops().next().is_none())),
                }
            }
            let compute = import_csv(&compute_csv(&plan), StageCosts::default(), 0.0).unwrap();
            prop_assert_eq!(compute.plan.orders(), plan.orders());
            prop_assert_eq!(compute.plan.problem().stage_to_rank(), plan.problem().stage_to_rank());
            prop_assert_eq!(compute.plan.problem().routes().len(), plan.problem().routes().len());
            let forward = project(&plan, ProjectionOptions { recv: RecvPolicy::Early, forward_only: true }).unwrap();
            check_programs(plan.problem(), &forward).unwrap();
            let only_forwards = forward.programs.iter().flat_map(|p| &p.instrs).all(|i| match i {
                Instr::Compute(t) => t.is_forward(),
                _ => true,
            });
            prop_assert!(only_forwards, "{}: a forward-only program runs a backward", expr);
        }
    }

    #[test]
    fn mutated_programs_are_caught(p in 2u32..=5, m in 2u32..=10, pick in any::<prop::sample::Index>()) {
        let plan = plan("f1b(gpipe)", p, m);
        let set = project(&plan, ProjectionOptions::default()).unwrap();
        // Drop one receive: the compute needing it has not received it.
        let mut dropped = set.clone();
        let receives: Vec<(usize, usize, usize)> = dropped.programs.iter().enumerate().flat_map(|(r, prog)| {
            prog.instrs.iter().enumerate().flat_map(move |(i, instr)| match instr {
                Instr::Comm(g) => g.ops.iter().enumerate().filter(|(_, op)| matches!(op, CommOp::Recv { .. })).map(|(k, _)| (r, i, k)).collect::<Vec<_>>(),
                _ => Vec::new(),
            })
        }).collect();
        let (r, i, k) = receives[pick.index(receives.len())];
        if let Instr::Comm(g) = &mut dropped.programs[r].instrs[i] { let mut ops = g.ops.to_vec(); ops.remove(k); g.ops = ops.into(); }
        let err = check_programs(plan.problem(), &dropped).unwrap_err();
        prop_assert!(matches!(err, CommError::NotReceived { .. }), "{}", err);
        // Swap two sends from rank 0 to rank 1: the pair's k-th send no longer matches.
        let mut swapped = set.clone();
        let sends: Vec<usize> = swapped.programs[0].instrs.iter().enumerate().filter(|(_, instr)| matches!(instr, Instr::Comm(g) if g.ops.iter().any(|op| matches!(op, CommOp::Send { .. })))).map(|(i, _)| i).collect();
        if sends.len() >= 2 {
            let (a, b) = (sends[0], sends[1]);
            let take = |instr: &Instr| match instr { Instr::Comm(g) => g.ops.iter().position(|op| matches!(op, CommOp::Send { .. })).unwrap(), _ => unreachable!() };
            let (ka, kb) = (take(&swapped.programs[0].instrs[a]), take(&swapped.programs[0].instrs[b]));
            let op_a = match &swapped.programs[0].instrs[a] { Instr::Comm(g) => g.ops[ka], _ => unreachable!() };
            let op_b = match &swapped.programs[0].instrs[b] { Instr::Comm(g) => g.ops[kb], _ => unreachable!() };
            if let Instr::Comm(g) = &mut swapped.programs[0].instrs[a] { g.ops[ka] = op_b; }
            if let Instr::Comm(g) = &mut swapped.programs[0].instrs[b] { g.ops[kb] = op_a; }
            let err = check_programs(plan.problem(), &swapped).unwrap_err();
            prop_assert!(matches!(err, CommError::BadSend { .. } | CommError::Mismatch { .. }), "{}", err);
        }
    }
}

#[test]
fn a_swap_of_sends_that_keeps_dataflow_is_a_mismatch() {
    // Two sends in one group to the same peer, swapped: data exists for both, order differs.
    let plan = plan("gpipe", 2, 3);
    let mut set = project(&plan, ProjectionOptions::default()).unwrap();
    let program = &mut set.programs[0];
    let last_group = program.instrs.iter().rposition(|i| matches!(i, Instr::Comm(g) if g.ops.iter().filter(|op| matches!(op, CommOp::Send { .. })).count() >= 1)).unwrap();
    // Move every send of rank 0 into its last group, reversed.
    let mut sends = Vec::new();
    for instr in program.instrs.iter_mut() {
        if let Instr::Comm(g) = instr {
            sends.extend(
                g.ops
                    .iter()
                    .filter(|op| matches!(op, CommOp::Send { .. }))
                    .copied(),
            );
            g.ops = g
                .ops
                .iter()
                .filter(|op| !matches!(op, CommOp::Send { .. }))
                .copied()
                .collect();
        }
    }
    sends.reverse();
    if let Instr::Comm(g) = &mut program.instrs[last_group] {
        g.ops = g.ops.iter().copied().chain(sends).collect();
    }
    program
        .instrs
        .retain(|i| !matches!(i, Instr::Comm(g) if g.ops.is_empty()));
    let err = check_programs(plan.problem(), &set).unwrap_err();
    assert!(matches!(err, CommError::Mismatch { index: 0, .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with("rank 0 -> rank 1: send #0 carries act(stage 0 -> 1, mb 2)"),
        "{err}"
    );
}

#[test]
fn a_two_rank_exchange_needs_batching_or_early_receives() {
    // A hand-made program set: both ranks send first, then receive, one op per group. Batched
    // (sends buffered) completes; blocking rendezvous deadlocks, with the cycle named.
    use pipeweave::core_ir::{
        spmd::check::simulate_comm, CommGroup, Message, RankProgram, Semantics,
    };
    use pipeweave::{MicrobatchId, RankId, StageId};
    let a = Message::activation(StageId::new(0), StageId::new(1), MicrobatchId::new(0));
    let b = Message::activation(StageId::new(2), StageId::new(3), MicrobatchId::new(0));
    let group = |op| {
        Instr::Comm(CommGroup {
            ops: vec![op].into(),
        })
    };
    let set = ProgramSet {
        programs: vec![
            RankProgram {
                rank: RankId::new(0),
                instrs: vec![
                    group(CommOp::Send {
                        to: RankId::new(1),
                        message: a,
                    }),
                    group(CommOp::Recv {
                        from: RankId::new(1),
                        message: b,
                    }),
                ],
            },
            RankProgram {
                rank: RankId::new(1),
                instrs: vec![
                    group(CommOp::Send {
                        to: RankId::new(0),
                        message: b,
                    }),
                    group(CommOp::Recv {
                        from: RankId::new(0),
                        message: a,
                    }),
                ],
            },
        ],
        forward_only: false,
        semantics: Semantics::Blocking,
    };
    simulate_comm(&set, Semantics::Batched).unwrap();
    let err = simulate_comm(&set, Semantics::Blocking).unwrap_err();
    assert_eq!(
        err.to_string(),
        "deadlock under blocking rendezvous semantics: rank 0 waits at instruction 0 for send-act(stage 0, mb 0) to rank 1; \
         rank 1 waits at instruction 0 for send-act(stage 2, mb 0) to rank 0"
    );
}

#[test]
fn just_in_time_receives_hold_no_more_buffers_than_early_ones() {
    for expr in [
        "f1b(gpipe)",
        "vpp(f1b(gpipe), chunks=2)",
        "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
    ] {
        let plan = plan_with_costs(expr, 4, 16, (1, 2, 1, 1));
        let early = project(
            &plan,
            ProjectionOptions {
                recv: RecvPolicy::Early,
                forward_only: false,
            },
        )
        .unwrap();
        let late = project(
            &plan,
            ProjectionOptions {
                recv: RecvPolicy::JustInTime,
                forward_only: false,
            },
        )
        .unwrap();
        let (e, l) = (early.peak_receive_buffers(), late.peak_receive_buffers());
        assert!(
            l.iter().zip(&e).all(|(l, e)| l <= e),
            "{expr}: just in time {l:?}, early {e:?}"
        );
        assert!(
            l.iter().all(|&b| b >= 1),
            "{expr}: every rank receives something"
        );
    }
}
