//! Unit tests of the replay engine: times, deadlocks, host-link transfers, resumed and bounded
//! replays, and faults.

use super::*;

fn plan(orders: &[&[&str]]) -> Plan {
    let rows: Vec<String> = orders.iter().map(|o| o.join(" ")).collect();
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    crate::testing::plan(1, &rows)
}

/// The start and end of each task of a rank's timeline.
fn spans(row: &[TimedTask]) -> Vec<(f64, f64)> {
    row.iter().map(|t| (t.start, t.end)).collect()
}

#[test]
fn tasks_start_as_early_as_dependencies_allow() {
    let p = plan(&[&["0F0", "0B0"], &["1F0", "1B0"]]);
    let replayed = replay(&p, |_| 1.0, 0.5, true).unwrap();
    let times = spans(&replayed.timeline[1]);
    assert_eq!(times, [(1.5, 2.5), (2.5, 3.5)]);
    assert_eq!(replayed.timeline[0][1].start, 4.0);
    assert!(replay(&p, |_| 1.0, 0.0, false).unwrap().timeline[0].is_empty());
}

#[test]
fn a_cycle_of_waits_is_a_deadlock_naming_every_rank_on_it() {
    // Rank 0 wants the gradient before sending the activation it depends on.
    let p = plan(&[&["0B0", "0F0"], &["1F0", "1B0"]]);
    match replay(&p, |_| 1.0, 0.0, false) {
        Err(ReplayError::Deadlock(waits)) => {
            let text = ReplayError::Deadlock(waits.clone()).to_string();
            assert!(text.contains("rank 0 waits at task 0 (0B0)"), "{text}");
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
}

#[test]
fn transfers_run_on_the_link_beside_the_computes() {
    // One rank, two microbatches. The offload of 0F0 takes [1, 3]; 0F1 allocates, so it
    // waits for it: [3, 4]. 0B1 [4, 6]; the reload is issued after 0B1 ([6, 8]) and 0B0
    // waits for it.
    let plan = crate::testing::plan(2, &["0F0 0OFFLOAD0 0F1 0B1 0RELOAD0 0B0"]);
    let duration = |t: &Task| match t {
        Task::Offload(_) | Task::Reload(_) => 2.0,
        Task::Backward(_) => 2.0,
        _ => 1.0,
    };
    let replayed = replay(&plan, duration, 0.0, true).unwrap();
    let times: Vec<(String, f64, f64)> = replayed.timeline[0]
        .iter()
        .map(|t| (t.task.to_string(), t.start, t.end))
        .collect();
    let expected = [
        ("0F0", 0.0, 1.0),
        ("0OFFLOAD0", 1.0, 3.0),
        ("0F1", 3.0, 4.0),
        ("0B1", 4.0, 6.0),
        ("0RELOAD0", 6.0, 8.0),
        ("0B0", 8.0, 10.0),
    ];
    let expected: Vec<(String, f64, f64)> = expected
        .iter()
        .map(|&(t, a, b)| (t.to_string(), a, b))
        .collect();
    assert_eq!(times, expected);
}

#[test]
fn an_offload_placed_late_is_issued_when_its_forward_ends() {
    // The offload of 0F0 sits after 0F1 (its device copy freed there): it is issued when
    // 0F0 ends, [1, 3], and 0F1 (before it in the order) does not wait for it: [1, 2].
    // 0B1 [2, 4]; the reload is issued after 0B1, [4, 6]; 0B0 waits for it.
    let plan = crate::testing::plan(2, &["0F0 0F1 0OFFLOAD0 0B1 0RELOAD0 0B0"]);
    let duration = |t: &Task| match t {
        Task::Offload(_) | Task::Reload(_) | Task::Backward(_) => 2.0,
        _ => 1.0,
    };
    let replayed = replay(&plan, duration, 0.0, true).unwrap();
    let times = spans(&replayed.timeline[0]);
    assert_eq!(
        times,
        [
            (0.0, 1.0),
            (1.0, 2.0),
            (1.0, 3.0),
            (2.0, 4.0),
            (4.0, 6.0),
            (6.0, 8.0)
        ]
    );
}

#[test]
fn a_w_waits_for_the_reload_of_what_it_keeps() {
    // 0F0 [0,1], 0I0 [1,2]; what its W keeps goes out [2,4] and comes back [4,6] (issued
    // after 0I0, once the link is free): 0W0 waits for it.
    let plan = crate::testing::plan(1, &["0F0 0I0 0OFFLOAD0 0RELOAD0 0W0"]);
    let duration = |t: &Task| if t.on_link() { 2.0 } else { 1.0 };
    let replayed = replay(&plan, duration, 0.0, true).unwrap();
    let times = spans(&replayed.timeline[0]);
    assert_eq!(
        times,
        [(0.0, 1.0), (1.0, 2.0), (2.0, 4.0), (4.0, 6.0), (6.0, 7.0)]
    );
}

#[test]
fn a_reload_placed_early_hides_behind_the_computes() {
    let plan = crate::testing::plan(2, &["0F0 0OFFLOAD0 0F1 0RELOAD0 0B1 0B0"]);
    let replayed = replay(&plan, |_| 1.0, 0.0, true).unwrap();
    let ends: Vec<f64> = replayed.timeline[0].iter().map(|t| t.end).collect();
    // F0 [0,1], offload [1,2], F1 [2,3], reload [3,4] beside B1 [3,4], B0 [4,5].
    assert_eq!(ends, [1.0, 2.0, 3.0, 4.0, 4.0, 5.0]);
    // A recompute runs on the compute side.
    let plan = crate::testing::plan(2, &["0F0 0F1 0B1 0R0 0B0"]);
    let replayed = replay(&plan, |_| 1.0, 0.0, true).unwrap();
    assert_eq!(replayed.timeline[0][4].end, 5.0);
}

#[test]
fn a_resumed_replay_equals_a_fresh_one_and_a_bound_stops_it() {
    let before = crate::testing::plan(
        2,
        &[
            "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0RELOAD0 0B0 0RELOAD1 0B1",
            "1F0 1B0 1F1 1B1",
        ],
    );
    let earlier = replay_within(&before, f64::INFINITY, None)
        .unwrap()
        .unwrap();
    // The second reload moved before the first backward: every task that ran before the
    // task now displaced (0B0, at position 5) keeps its times.
    let after = crate::testing::plan(
        2,
        &[
            "0F0 0OFFLOAD0 0F1 0OFFLOAD1 0RELOAD0 0RELOAD1 0B0 0B1",
            "1F0 1B0 1F1 1B1",
        ],
    );
    let cut = earlier.timeline[0][5].sequence;
    let fresh = replay_within(&after, f64::INFINITY, None).unwrap().unwrap();
    let resumed = replay_within(&after, f64::INFINITY, Some((&earlier, cut))).unwrap();
    let times = |r: &Replay| -> Vec<Vec<(Task, f64, f64)>> {
        let row = |row: &Vec<TimedTask>| row.iter().map(|t| (t.task, t.start, t.end)).collect();
        r.timeline.iter().map(row).collect()
    };
    assert_eq!(times(&resumed.unwrap()), times(&fresh));
    assert_ne!(
        times(&fresh)[0],
        times(&earlier)[0],
        "the move changes rank 0's times"
    );
    // A prefix that does not begin the plan's orders is ignored: the replay starts afresh.
    let wrong = replay_within(&after, f64::INFINITY, Some((&earlier, usize::MAX))).unwrap();
    assert_eq!(times(&wrong.unwrap()), times(&fresh));
    // No task ends after the makespan; one unit less is beaten, resumed or not.
    let makespan = fresh.makespan();
    assert!(replay_within(&after, makespan, None).unwrap().is_some());
    assert!(replay_within(&after, makespan - 1.0, None)
        .unwrap()
        .is_none());
    assert!(replay_within(&after, makespan - 1.0, Some((&earlier, cut)))
        .unwrap()
        .is_none());
}

#[test]
fn repeated_and_out_of_range_ops_are_faults_not_panics() {
    let twice = plan(&[&["0F0", "0F0", "0B0"], &["1F0", "1B0"]]);
    assert!(matches!(
        replay(&twice, |_| 1.0, 0.0, false),
        Err(ReplayError::RunsTwice(..))
    ));
    let far = plan(&[&["0F7"], &["1F0", "1B0"]]);
    assert!(matches!(
        replay(&far, |_| 1.0, 0.0, false),
        Err(ReplayError::OutOfRange(..))
    ));
}
