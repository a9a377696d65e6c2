//! The pass driver: order rules, preconditions, observation, and blame of a broken pass by name.

use pipeweave::core_ir::{ChunkPlacement, Pacing};
use pipeweave::transforms::passes::{F1b, Gpipe, Vpp};
use pipeweave::transforms::{Changes, Contract, Pass, Requires};
use pipeweave::{
    Arguments, Arity, PassList, PipelineConfig, Plan, ProblemSpec, Registry, StageCosts,
    TransformError,
};
use pipeweave_core::testing::unscheduled_on;

/// A pass that drops the last task of rank 0: always produces an incomplete plan.
struct DropLast;

impl Pass for DropLast {
    fn name(&self) -> &str {
        "drop_last"
    }
    fn contract(&self) -> Contract {
        Contract::new(
            Requires::paced(&[Pacing::OneForwardOneBackward]),
            Changes::NONE,
        )
    }
    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let mut orders = plan.orders().to_vec();
        orders[0].pop();
        plan.with_orders(orders)
            .map_err(|e| TransformError::core("drop_last", e))
    }
}

fn start(ranks: u32, microbatches: u32) -> Plan {
    PipelineConfig::new(ranks, microbatches)
        .unwrap()
        .unscheduled_plan()
        .unwrap()
}

/// What `passes` make of the unscheduled plan at `ranks` x `microbatches`.
fn run(passes: Vec<Box<dyn Pass>>, ranks: u32, microbatches: u32) -> Result<Plan, TransformError> {
    PassList::new(passes).run(start(ranks, microbatches))
}

/// `vpp` with two chunks on the standard layout and `group`.
fn vpp2(group: Option<u32>) -> Box<dyn Pass> {
    Box::new(Vpp::new(2, group, ChunkPlacement::Standard).unwrap())
}

#[test]
fn a_broken_pass_is_blamed_by_name() {
    let err = run(
        vec![Box::new(Gpipe), Box::new(F1b), Box::new(DropLast)],
        4,
        8,
    )
    .unwrap_err();
    match &err {
        TransformError::PassBroke { pass, violations } => {
            assert_eq!(pass, "drop_last");
            assert_eq!(violations.0.len(), 2, "{violations}");
        }
        other => panic!("expected PassBroke, got {other:?}"),
    }
    assert!(err
        .to_string()
        .starts_with("pass `drop_last` produced an invalid plan (a bug in the pass)"));
    assert!(
        err.to_string()
            .contains("op 0I7 (stage 0, microbatch 7) is missing from rank 0"),
        "{err}"
    );
}

#[test]
fn passes_out_of_the_clients_order_are_rejected() {
    assert_eq!(
        run(vec![Box::new(Gpipe), vpp2(None), Box::new(F1b)], 2, 4).unwrap_err(),
        TransformError::OutOfOrder {
            pass: "f1b".into(),
            after: "vpp".into(),
            needs: "plain layout: one stage per rank, stage s on rank s, one route".into(),
            found: "the interleaved (2 chunks, standard placement) layout".into(),
        }
    );
    assert!(matches!(
        run(vec![Box::new(Gpipe), vpp2(None), vpp2(None)], 2, 4),
        Err(TransformError::OutOfOrder { .. })
    ));
    let err = run(vec![Box::new(F1b)], 2, 4).unwrap_err();
    assert!(
        err.to_string()
            .contains("the innermost schedule must be gpipe"),
        "{err}"
    );
}

#[test]
fn the_observer_sees_every_verified_intermediate_plan() {
    let passes = PassList::new(vec![Box::new(Gpipe), Box::new(F1b), vpp2(None)]);
    let mut seen = Vec::new();
    let plan = passes
        .run_observed(start(4, 8), &mut |name, plan| {
            seen.push((
                name.to_string(),
                plan.problem().stages(),
                plan.passes().to_vec(),
            ))
        })
        .unwrap();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0], ("gpipe".to_string(), 4, vec!["gpipe".to_string()]));
    assert_eq!(seen[2].1, 8);
    assert_eq!(plan.passes(), ["gpipe", "f1b", "vpp"]);
}

#[test]
fn preconditions_name_the_constraint_and_values() {
    // Two stages per rank from the start: 1F1B and interleaving need the plain layout.
    let problem = ProblemSpec::builder()
        .ranks(2)
        .microbatches(4)
        .stage_to_rank(vec![0, 1, 0, 1])
        .build()
        .validate()
        .unwrap();
    let plan = unscheduled_on(problem, StageCosts::default());
    let gpipe_only = PassList::new(vec![Box::new(Gpipe)])
        .run(plan.clone())
        .unwrap();
    assert_eq!(gpipe_only.task_count(), 32);
    let err = PassList::new(vec![Box::new(Gpipe), Box::new(F1b)])
        .run(plan)
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pass `f1b` precondition `plain layout: one stage per rank, stage s on rank s, one route` \
         violated: the problem has 4 stages on 2 ranks with 1 route(s)"
    );
    // Megatron's rules bind an explicit group; without one, sizes Megatron refuses still run.
    let interleaved = |group| vec![Box::new(Gpipe) as Box<dyn Pass>, Box::new(F1b), vpp2(group)];
    assert!(run(interleaved(None), 4, 2).is_ok());
    assert_eq!(
        run(interleaved(Some(4)), 4, 2).unwrap_err().to_string(),
        "pass `vpp` precondition `ranks <= group <= microbatches` violated: ranks = 4, group = 4, microbatches = 2"
    );
    let err = run(interleaved(Some(4)), 4, 10).unwrap_err().to_string();
    assert!(
        err.contains("the last group has 2 < 4 microbatches"),
        "{err}"
    );
    let err = run(vec![Box::new(Gpipe), Box::new(Gpipe)], 2, 2).unwrap_err();
    assert!(matches!(err, TransformError::OutOfOrder { .. }), "{err}");
}

#[test]
fn a_builtin_that_leaves_the_plan_unchanged_still_counts_as_applied() {
    // At one microbatch `dual` keeps the 1F1B plan on its linear layout; `vpp` after it is still
    // out of order, as at every other size.
    for m in [1, 8] {
        let err = pipeweave::build_plan(
            "vpp(dual(f1b(gpipe)), chunks=2)",
            &PipelineConfig::new(4, m).unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("pass `vpp` cannot run after `dual`: it needs plain layout"),
            "M={m}: {err}"
        );
    }
    let plan =
        pipeweave::build_plan("dual(f1b(gpipe))", &PipelineConfig::new(4, 1).unwrap()).unwrap();
    assert_eq!(plan.passes(), ["gpipe", "f1b", "dual"]);
}

/// A pass whose precondition error does not name it: the driver does.
struct Fussy;

impl Pass for Fussy {
    fn name(&self) -> &str {
        "fussy"
    }
    fn contract(&self) -> Contract {
        Contract::new(Requires::ANY, Changes::NONE)
    }
    fn rewrite(&self, _: Plan) -> Result<Plan, TransformError> {
        Err(TransformError::unmet("never", "it never runs"))
    }
}

#[test]
fn the_driver_names_the_pass_on_its_errors_and_the_registry_checks_names() {
    let err = run(vec![Box::new(Gpipe), Box::new(Fussy)], 2, 2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pass `fussy` precondition `never` violated: it never runs"
    );
    let mut registry = Registry::builtin();
    let fussy = |_: &Arguments| Ok(Box::new(Fussy) as Box<dyn Pass>);
    registry
        .register("picky", Arity::Rewrite, Box::new(fussy))
        .unwrap();
    assert_eq!(
        registry.compile_expression("picky(gpipe)").err(),
        Some(TransformError::MisnamedPass {
            registered: "picky".into(),
            named: "fussy".into(),
        })
    );
}
