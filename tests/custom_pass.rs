//! Passes defined outside the library: registered under a name, composed with the built-ins in
//! expressions, held to their contracts and verified like the built-ins.

use pipeweave::{
    build_plan_with, Arguments, Arity, Backwards, Changes, Contract, Facts, Pacing, Pass,
    PipelineConfig, Plan, Registry, Requires, Task, TransformError,
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
        let requires = Requires::paced(&[Pacing::OneForwardOneBackward]).with_whole_backwards();
        let changes = Changes {
            backwards: self.declare,
            ..Changes::NONE
        };
        Contract::new(requires, changes)
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

/// The plan `expression` builds at 4 ranks and 8 microbatches, with `split_all` registered.
fn build(expression: &str) -> Result<Plan, pipeweave::Error> {
    build_plan_with(&registry(), expression, &PipelineConfig::new(4, 8).unwrap())
}

/// The error `expression` gives, as the user reads it.
fn error(expression: &str) -> String {
    build(expression).unwrap_err().to_string()
}

#[test]
fn a_users_pass_composes_with_the_builtins() {
    for expression in [
        "split_all(f1b(gpipe))",
        "split_all(vpp(f1b(gpipe), chunks=2))",
        "split_all(dual(f1b(gpipe)))",
    ] {
        let plan = build(expression).unwrap();
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
    for (expression, needs) in [
        (
            "zero_bubble(split_all(f1b(gpipe)))",
            "pass `zero_bubble` cannot run after `split_all`: it needs whole backwards",
        ),
        (
            "split_all(gpipe)",
            "pass `split_all` cannot run after `gpipe`: it needs one-forward-one-backward pacing",
        ),
        (
            "split_all(f1b(gpipe), x=1)",
            "unknown argument; `split_all` takes declare, drop_last",
        ),
    ] {
        let err = error(expression);
        assert!(err.contains(needs), "{expression}: {err}");
    }
}

#[test]
fn a_broken_users_pass_is_blamed_by_name() {
    let err = error("split_all(f1b(gpipe), drop_last=1)");
    assert!(
        err.starts_with("pass `split_all` produced an invalid plan (a bug in the pass)"),
        "{err}"
    );
    assert_eq!(
        error("split_all(f1b(gpipe), declare=0)"),
        "pass `split_all` changed the backwards fact, which its contract says it leaves alone (a bug in the pass)"
    );
}
