//! Passes defined outside the library: registered under a name, composed with the built-ins in
//! expressions, held to their contracts and verified like the built-ins.

use pipeweave::{
    build_plan_with, Arguments, Arity, Backwards, Changes, Contract, Facts, LayoutKind, Pacing,
    Pass, PipelineConfig, Plan, Registry, Requires, Task, TransformError,
};

/// Splits every full backward into I then W, right after each other.
struct SplitAll {
    /// Declare the change of the backwards fact (a pass that does not is broken).
    declare: bool,
    /// Drop the last task of rank 0 (a broken pass).
    drop_last: bool,
}

impl Pass for SplitAll {
    fn name(&self) -> &str {
        "split_all"
    }
    fn contract(&self) -> Contract {
        Contract {
            requires: Requires {
                pacing: &[Pacing::OneForwardOneBackward],
                layout: LayoutKind::ALL,
                whole_backwards: true,
                residency: Requires::KEPT,
            },
            changes: Changes {
                backwards: self.declare,
                ..Changes::default()
            },
            establishes: None,
        }
    }
    fn rewrite(&self, plan: Plan) -> Result<Plan, TransformError> {
        let mut orders: Vec<Vec<Task>> = plan
            .orders()
            .iter()
            .map(|o| {
                o.iter()
                    .flat_map(|&t| match t {
                        Task::Backward(w) => vec![Task::InputGrad(w), Task::WeightGrad(w)],
                        other => vec![other],
                    })
                    .collect()
            })
            .collect();
        if self.drop_last {
            orders[0].pop();
        }
        let facts = Facts {
            backwards: Backwards::Split,
            ..plan.facts()
        };
        plan.reshaped(None, orders, facts)
            .map_err(|e| TransformError::core("split_all", e))
    }
}

fn registry() -> Registry {
    let mut registry = Registry::builtin();
    registry
        .register(
            "split_all",
            Arity::Rewrite,
            Box::new(|args: &Arguments| {
                args.allow_only(&["declare", "drop_last"])?;
                let flag = |name| args.integer(name).map(|v| v.unwrap_or(0) == 1);
                Ok(Box::new(SplitAll {
                    declare: args.integer("declare")?.is_none_or(|v| v != 0),
                    drop_last: flag("drop_last")?,
                }) as Box<dyn Pass>)
            }),
        )
        .unwrap();
    registry
}

fn config() -> PipelineConfig {
    PipelineConfig::new(4, 8).unwrap()
}

#[test]
fn a_users_pass_composes_with_the_builtins() {
    let registry = registry();
    for expression in [
        "split_all(f1b(gpipe))",
        "split_all(vpp(f1b(gpipe), chunks=2))",
        "split_all(dual(f1b(gpipe)))",
    ] {
        let plan = build_plan_with(&registry, expression, &config()).unwrap();
        assert_eq!(plan.facts().backwards, Backwards::Split, "{expression}");
        assert_eq!(plan.passes().last().unwrap(), "split_all");
        assert!(plan
            .orders()
            .iter()
            .flatten()
            .all(|t| !matches!(t, Task::Backward(_))));
    }
}

#[test]
fn the_builtins_refuse_a_users_pass_out_of_order_and_vice_versa() {
    let registry = registry();
    let err =
        build_plan_with(&registry, "zero_bubble(split_all(f1b(gpipe)))", &config()).unwrap_err();
    assert!(
        err.to_string()
            .contains("pass `zero_bubble` cannot run after `split_all`: it needs whole backwards"),
        "{err}"
    );
    let err = build_plan_with(&registry, "split_all(gpipe)", &config()).unwrap_err();
    assert!(
        err.to_string().contains(
            "pass `split_all` cannot run after `gpipe`: it needs one-forward-one-backward pacing"
        ),
        "{err}"
    );
    let err = build_plan_with(&registry, "split_all(f1b(gpipe), x=1)", &config()).unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown argument; `split_all` takes declare, drop_last"),
        "{err}"
    );
}

#[test]
fn a_broken_users_pass_is_blamed_by_name() {
    let registry = registry();
    let err =
        build_plan_with(&registry, "split_all(f1b(gpipe), drop_last=1)", &config()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("pass `split_all` produced an invalid plan (a bug in the pass)"),
        "{err}"
    );
    let err =
        build_plan_with(&registry, "split_all(f1b(gpipe), declare=0)", &config()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pass `split_all` changed the backwards fact, which its contract says it leaves alone (a bug in the pass)"
    );
}
