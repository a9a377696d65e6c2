//! Unit tests of the communication checker: projected programs pass, and each kind of broken
//! program is named by its check.

use super::pairs::pair_counts;
use super::replay::CommReplay;
use super::{check_programs, simulate_comm, CommError};
use crate::ir::ids::RankId;
use crate::ir::problem::Problem;
use crate::ir::slots::OpSlots;
use crate::spmd::program::{CommGroup, CommOp, Direction, Instr, Message, ProgramSet, Semantics};
use crate::spmd::project::{project, ProjectionOptions};

/// Check 2 on its own, for programs whose messages all cross route edges (check 1): per ordered
/// pair, the k-th send is the k-th receive. Returns the message count.
fn check_matching(problem: &Problem, set: &ProgramSet) -> Result<usize, CommError> {
    match pair_counts(set) {
        (_, Some(stray)) => Err(stray),
        (counts, None) => {
            CommReplay::new(set, &counts, Some(OpSlots::of(problem))).check_matching()
        }
    }
}

fn one_f_one_b() -> (Problem, ProgramSet) {
    let plan = crate::testing::plan(2, &["0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1"]);
    let set = project(&plan, ProjectionOptions::default()).unwrap();
    (plan.problem().clone(), set)
}

/// Removes the first communication group of `rank` that holds an op matching `pick`.
fn drop_op(set: &mut ProgramSet, rank: usize, pick: impl Fn(&CommOp) -> bool) -> CommOp {
    for instr in &mut set.programs[rank].instrs {
        if let Instr::Comm(group) = instr {
            if let Some(i) = group.ops.iter().position(&pick) {
                let mut ops = group.ops.to_vec();
                let op = ops.remove(i);
                group.ops = ops.into();
                return op;
            }
        }
    }
    panic!("no such op on rank {rank}")
}

#[test]
fn projected_programs_pass_and_are_counted() {
    let (problem, set) = one_f_one_b();
    let report = check_programs(&problem, &set).unwrap();
    assert_eq!(report.messages, 4);
    assert!(report.groups >= 4);
}

#[test]
fn a_missing_receive_is_named_with_its_compute() {
    let (problem, mut set) = one_f_one_b();
    drop_op(&mut set, 1, |op| matches!(op, CommOp::Recv { .. }));
    let err = check_programs(&problem, &set).unwrap_err();
    assert!(matches!(err, CommError::NotReceived { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("needs act(stage 0 -> 1, mb 0) from rank 0"),
        "{err}"
    );
}

#[test]
fn unmatched_and_mismatched_messages_are_reported() {
    let (problem, mut set) = one_f_one_b();
    drop_op(&mut set, 0, |op| matches!(op, CommOp::Send { .. }));
    let err = check_matching(&problem, &set).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 0 -> rank 1: send #0 carries act(stage 0 -> 1, mb 1) but receive #0 expects act(stage 0 -> 1, mb 0)"
    );
    let (problem, mut set) = one_f_one_b();
    drop_op(
        &mut set,
        1,
        |op| matches!(op, CommOp::Send { message, .. } if message.microbatch.get() == 1),
    );
    let err = check_matching(&problem, &set).unwrap_err();
    assert!(
        matches!(
            err,
            CommError::CountMismatch {
                sends: 1,
                recvs: 2,
                ..
            }
        ),
        "{err}"
    );
    let (problem, mut set) = one_f_one_b();
    for instr in &mut set.programs[1].instrs {
        if let Instr::Comm(CommGroup { ops }) = instr {
            for op in ops {
                if let CommOp::Recv { message, .. } = op {
                    message.microbatch =
                        crate::ir::ids::MicrobatchId::new(1 - message.microbatch.get());
                }
            }
        }
    }
    assert!(matches!(
        check_matching(&problem, &set),
        Err(CommError::Mismatch { .. })
    ));
}

#[test]
fn a_send_exchange_deadlocks_under_blocking_semantics_only() {
    // Two ranks each send first, then receive: fine when batched, a cycle when blocking.
    let message = |from: u32, to: u32| Message::activation(from.into(), to.into(), 0.into());
    let program = |rank: u32, peer: u32| crate::spmd::program::RankProgram {
        rank: RankId::new(rank),
        instrs: vec![
            Instr::Comm(CommGroup {
                ops: vec![CommOp::Send {
                    to: RankId::new(peer),
                    message: message(rank, peer),
                }]
                .into(),
            }),
            Instr::Comm(CommGroup {
                ops: vec![CommOp::Recv {
                    from: RankId::new(peer),
                    message: message(peer, rank),
                }]
                .into(),
            }),
        ],
    };
    let set = ProgramSet {
        programs: vec![program(0, 1), program(1, 0)],
        forward_only: false,
        semantics: Semantics::Blocking,
    };
    assert!(simulate_comm(&set, Semantics::Batched).is_ok());
    let err = simulate_comm(&set, Semantics::Blocking).unwrap_err();
    assert_eq!(
        err.to_string(),
        "deadlock under blocking rendezvous semantics: rank 0 waits at instruction 0 for send-act(stage 0, mb 0) to rank 1; rank 1 waits at instruction 0 for send-act(stage 1, mb 0) to rank 0"
    );
}

#[test]
fn a_wait_on_a_send_deadlocks_under_rendezvous_semantics_until_its_receive_is_posted() {
    // Two ranks each send, wait for their send, then receive: the waits block each other. With
    // the receive before the wait, the exchange completes.
    let message = |from: u32, to: u32| Message::activation(from.into(), to.into(), 0.into());
    let program = |rank: u32, peer: u32, wait_first: bool| {
        let send = Instr::Comm(CommGroup {
            ops: vec![CommOp::Send {
                to: RankId::new(peer),
                message: message(rank, peer),
            }]
            .into(),
        });
        let wait = Instr::WaitSend {
            to: RankId::new(peer),
            message: message(rank, peer),
        };
        let recv = Instr::Comm(CommGroup {
            ops: vec![CommOp::Recv {
                from: RankId::new(peer),
                message: message(peer, rank),
            }]
            .into(),
        });
        let instrs = if wait_first {
            vec![send, wait, recv]
        } else {
            vec![send, recv, wait]
        };
        crate::spmd::program::RankProgram {
            rank: RankId::new(rank),
            instrs,
        }
    };
    let set = |wait_first| ProgramSet {
        programs: vec![program(0, 1, wait_first), program(1, 0, wait_first)],
        forward_only: false,
        semantics: Semantics::Rendezvous,
    };
    assert!(simulate_comm(&set(false), Semantics::Rendezvous).is_ok());
    let err = simulate_comm(&set(true), Semantics::Rendezvous).unwrap_err();
    assert_eq!(
        err.to_string(),
        "deadlock under rendezvous (WAIT_SEND blocks) semantics: rank 0 waits at instruction 1 for send-act(stage 0, mb 0) to rank 1; rank 1 waits at instruction 1 for send-act(stage 1, mb 0) to rank 0"
    );
}

#[test]
fn a_message_across_no_boundary_is_rejected() {
    // Found by the fuzzer: a send and its receive both retargeted to a stage two hops away.
    let (problem, mut set) = one_f_one_b();
    let bogus = |m: &mut Message| m.to_stage = crate::ir::ids::StageId::new(0);
    for program in &mut set.programs {
        for instr in &mut program.instrs {
            if let Instr::Comm(CommGroup { ops }) = instr {
                for op in ops {
                    match op {
                        CommOp::Send { message, .. } | CommOp::Recv { message, .. } => {
                            if message.direction == Direction::Activation {
                                bogus(message)
                            }
                        }
                    }
                }
            }
        }
    }
    let err = check_programs(&problem, &set).unwrap_err();
    assert!(matches!(err, CommError::NotAnEdge { .. }), "{err}");
}

#[test]
fn a_message_sent_twice_is_rejected() {
    // Found by the fuzzer: a duplicated send group and receive group matched pairwise.
    let (problem, mut set) = one_f_one_b();
    for rank in [0, 1] {
        let instrs = &mut set.programs[rank].instrs;
        let first = instrs
            .iter()
            .position(|i| matches!(i, Instr::Comm(_)))
            .unwrap();
        let copy = instrs[first].clone();
        instrs.insert(first + 1, copy);
    }
    let err = check_programs(&problem, &set).unwrap_err();
    assert!(matches!(err, CommError::Repeated { .. }), "{err}");
}

#[test]
fn numbering_and_peers_are_checked_before_anything_else() {
    let (problem, mut set) = one_f_one_b();
    set.programs.swap(0, 1);
    assert!(matches!(
        check_programs(&problem, &set),
        Err(CommError::Misnumbered { index: 0, .. })
    ));
    let (problem, mut set) = one_f_one_b();
    set.programs.pop();
    assert!(matches!(
        check_programs(&problem, &set),
        Err(CommError::RankCount {
            got: 1,
            expected: 2
        })
    ));
}
