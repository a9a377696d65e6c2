//! Differential tests of the retimer: after every batch of edits (recomputes, offloads and
//! reloads inserted, transfers moved) and every rollback, its times, makespan and slack are
//! those of a full replay and [`crate::analysis::slack`] of the edited plan, bit for bit; and
//! every successor list of its graph is the inverse of the matching predecessor list.

use super::Retimer;
use crate::analysis::simulate::simulate;
use crate::analysis::slack::slack;
use crate::ir::cost::{CostModel, StageCostsSpec};
use crate::ir::memory::MemoryModel;
use crate::ir::op::{Task, Work};
use crate::ir::plan::Plan;
use crate::testing::problem;

/// A small deterministic generator (xorshift).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// 1F1B on `ranks` x `microbatches`, whole backwards, or split ones whose Ws run at the end;
/// forward, input-gradient and weight-gradient costs, latency `comm`, transfers of `transfer`,
/// all-to-alls of `a2a` per forward (a mixture of experts; 0 for none).
fn one_f_one_b(
    ranks: u32,
    microbatches: u32,
    split: bool,
    (comm, transfer, a2a): (f64, f64, f64),
) -> Plan {
    let orders: Vec<Vec<Task>> = (0..ranks)
        .map(|r| {
            let work = |m: u32| Work {
                stage: crate::ir::ids::StageId::new(r),
                microbatch: crate::ir::ids::MicrobatchId::new(m),
            };
            let warm = (ranks - r - 1).min(microbatches);
            let mut order: Vec<Task> = (0..warm).map(|m| Task::Forward(work(m))).collect();
            let backward = |m| {
                if split {
                    Task::InputGrad(work(m))
                } else {
                    Task::Backward(work(m))
                }
            };
            for m in 0..microbatches {
                if m + warm < microbatches {
                    order.push(Task::Forward(work(m + warm)));
                }
                order.push(backward(m));
            }
            if split {
                order.extend((0..microbatches).map(|m| Task::WeightGrad(work(m))));
            }
            order
        })
        .collect();
    let costs = StageCostsSpec::builder()
        .forward(1.0)
        .input_grad(0.7)
        .weight_grad(1.3)
        .offload(transfer)
        .recompute(0.9)
        .a2a(a2a)
        .build()
        .validate()
        .unwrap();
    let problem = problem(ranks, microbatches);
    let stages = problem.stages();
    Plan::new(
        problem,
        CostModel::uniform(stages, costs, comm).unwrap(),
        MemoryModel::uniform(stages, Default::default()),
        orders,
    )
    .unwrap()
}

/// The retimer agrees with a full replay and slack of its orders.
fn check(retimer: &Retimer, base: &Plan) {
    let plan = Plan::new(
        base.problem().clone(),
        base.costs().clone(),
        base.memory().clone(),
        retimer.orders().to_vec(),
    )
    .unwrap();
    let sim = simulate(&plan).unwrap();
    assert_eq!(retimer.makespan().to_bits(), sim.makespan().to_bits());
    let slacks = slack(&plan, &sim);
    for (r, row) in sim.timeline().iter().enumerate() {
        let mine = retimer.timeline(r);
        assert_eq!(mine.len(), row.len());
        for (a, b) in mine.iter().zip(row) {
            assert_eq!(a.task, b.task);
            assert_eq!(
                (a.start.to_bits(), a.end.to_bits()),
                (b.start.to_bits(), b.end.to_bits()),
                "rank {r}, {}: {a:?} against {b:?}",
                a.task
            );
        }
        let kept = retimer.slack(r);
        if !kept.is_empty() {
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&kept), bits(&slacks[r]), "slack of rank {r}");
        }
    }
    for r in 0..retimer.orders().len() {
        for i in 0..retimer.order(r).len() {
            retimer.for_each_pred(r, i, |pr, pi, _| {
                let mut found = false;
                retimer.for_each_succ(pr, pi, |sr, si| found |= (sr, si) == (r, i));
                assert!(found, "({pr}, {pi}) -> ({r}, {i}) missing among successors");
            });
            retimer.for_each_bounded(r, i, |br, bi, w| {
                let mut found = false;
                retimer.for_each_bounder(br, bi, |sr, si, v| {
                    found |= (sr, si) == (r, i) && v.to_bits() == w.to_bits()
                });
                assert!(
                    found,
                    "({r}, {i}) bounds ({br}, {bi}) missing among bounders"
                );
            });
        }
    }
}

/// One random edit of rank `r`: a recompute before a backward, an offload after a forward (or
/// after an I) with its reload somewhere before the backward that needs it, or a transfer moved.
fn edit(retimer: &mut Retimer, r: usize, dice: &mut Dice) {
    let order = retimer.order(r).to_vec();
    let managed = |w: Work| {
        order.iter().any(|t| {
            t.is_residency() && t.work() == w && !matches!(t, Task::RecomputeWeightGrad(_))
        })
    };
    let backwards: Vec<(usize, Work)> = order
        .iter()
        .enumerate()
        .filter_map(|(p, t)| match *t {
            Task::Backward(w) | Task::InputGrad(w) if !managed(w) => Some((p, w)),
            _ => None,
        })
        .collect();
    match dice.below(4) {
        0 | 1 if !backwards.is_empty() => {
            let (b, w) = backwards[dice.below(backwards.len())];
            let f = order.iter().position(|t| *t == Task::Forward(w)).unwrap();
            if dice.below(2) == 0 || f + 1 == b {
                retimer.insert(r, b, Task::Recompute(w)).unwrap();
            } else {
                let at = f + 2 + dice.below(b - f - 1);
                retimer.insert(r, at, Task::Reload(w)).unwrap();
                retimer.insert(r, f + 1, Task::Offload(w)).unwrap();
            }
        }
        2 => {
            // What a W keeps, moved out between its I and W.
            let split: Vec<(usize, usize, Work)> = order
                .iter()
                .enumerate()
                .filter_map(|(p, t)| match *t {
                    Task::WeightGrad(w) if !order.contains(&Task::Offload(w)) => {
                        let i = order.iter().position(|x| *x == Task::InputGrad(w))?;
                        Some((i, p, w))
                    }
                    _ => None,
                })
                .collect();
            if let Some(&(i, w_at, w)) = split.get(dice.below(split.len().max(1))) {
                let at = i + 2 + dice.below(w_at - i);
                retimer.insert(r, at, Task::Reload(w)).unwrap();
                retimer.insert(r, i + 1, Task::Offload(w)).unwrap();
            }
        }
        _ => {
            // A reload moved earlier, or an offload later, staying between the two.
            let transfers: Vec<usize> = (0..order.len()).filter(|&p| order[p].on_link()).collect();
            let Some(&p) = transfers.get(dice.below(transfers.len().max(1))) else {
                return;
            };
            let w = order[p].work();
            let (lo, hi) = match order[p] {
                Task::Reload(_) => (
                    order[..p]
                        .iter()
                        .rposition(|t| *t == Task::Offload(w))
                        .unwrap()
                        + 1,
                    p,
                ),
                _ => (
                    p,
                    p + order[p..]
                        .iter()
                        .position(|t| *t == Task::Reload(w))
                        .unwrap()
                        - 1,
                ),
            };
            let to = lo + dice.below(hi - lo + 1);
            if order[p].is_residency() && to != p {
                retimer.move_task(r, p, to);
            }
        }
    }
}

#[test]
fn edits_keep_the_times_and_slack_of_a_full_replay() {
    for (seed, split, figures) in [
        (1u64, false, (0.0, 1.0, 0.0)),
        (2, false, (0.3, 0.5, 0.0)),
        (3, true, (0.3, 0.7, 0.0)),
        (4, true, (0.0, 2.0, 0.0)),
        (5, false, (0.1, 0.3, 0.0)),
        (6, true, (0.3, 0.7, 0.4)),
        (7, false, (0.1, 1.0, 0.25)),
    ] {
        let plan = one_f_one_b(4, 6, split, figures);
        let mut retimer = Retimer::new(&plan).unwrap().with_slack();
        check(&retimer, &plan);
        let mut dice = Dice(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for round in 0..30 {
            let r = dice.below(4);
            for _ in 0..1 + dice.below(3) {
                edit(&mut retimer, r, &mut dice);
            }
            if round % 3 == 0 {
                edit(&mut retimer, (r + 1) % 4, &mut dice);
            }
            retimer.settle().unwrap();
            check(&retimer, &plan);
        }
        let count =
            |f: fn(&Task) -> bool| retimer.orders().iter().flatten().filter(|t| f(t)).count();
        assert!(
            count(|t| matches!(t, Task::Recompute(_))) > 2,
            "seed {seed}"
        );
        assert!(count(|t| matches!(t, Task::Offload(_))) > 2, "seed {seed}");
    }
}

#[test]
fn a_rolled_back_trial_leaves_everything_as_it_was() {
    let plan = one_f_one_b(4, 8, true, (0.3, 0.6, 0.0));
    let mut retimer = Retimer::new(&plan).unwrap().with_slack();
    let mut dice = Dice(77);
    for _ in 0..20 {
        let before = retimer.clone();
        retimer.begin();
        let r = dice.below(4);
        for _ in 0..3 {
            edit(&mut retimer, r, &mut dice);
        }
        retimer.settle().unwrap();
        check(&retimer, &plan);
        if dice.below(2) == 0 {
            retimer.rollback();
            assert_eq!(retimer.orders(), before.orders());
            check(&retimer, &plan);
            for r in 0..4 {
                assert_eq!(retimer.timeline(r), before.timeline(r));
            }
        } else {
            retimer.commit();
        }
    }
}

#[test]
fn an_insertion_with_no_room_between_keys_renumbers() {
    // Forty recomputes of one pair's rank in a row land in the same gap of keys.
    let plan = one_f_one_b(2, 2, false, (0.0, 1.0, 0.0));
    let mut retimer = Retimer::new(&plan).unwrap().with_slack();
    let w = plan.orders()[0][0].work();
    let b = retimer
        .order(0)
        .iter()
        .position(|t| *t == Task::Backward(w))
        .unwrap();
    for _ in 0..40 {
        retimer.insert(0, b, Task::Recompute(w)).unwrap();
        retimer.settle().unwrap();
    }
    check(&retimer, &plan);
    assert!(retimer.insert(0, 0, Task::Forward(w)).is_err());
}
