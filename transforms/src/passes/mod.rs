//! The built-in schedule passes, one per file; each file's doc names its source schedule, its
//! contract (the facts it requires, what it may change), its preconditions, and shows a
//! before/after grid. [`register_builtins`] puts them in a [`Registry`] with their arguments.

pub mod dual;
pub mod f1b;
pub mod gpipe;
pub mod vpp;
pub mod zero_bubble;

pub use dual::Dual;
pub use f1b::OneForwardOneBackward;
pub use gpipe::GPipe;
pub use vpp::Interleave;
pub use zero_bubble::{Policy, ZeroBubble};

use crate::error::TransformError;
use crate::expr::Node;
use crate::pass::Transform;
use crate::registry::{Arguments, Arity, Registry};
use pipeweave_core::ChunkPlacement;

/// Adds `gpipe`, `f1b`, `vpp`, `dual` and `zero_bubble` to `registry`.
pub fn register_builtins(registry: &mut Registry) {
    let entries: [(&str, Arity, crate::registry::Factory); 5] = [
        (
            "gpipe",
            Arity::Baseline,
            Box::new(no_arguments(|| Box::new(GPipe))),
        ),
        (
            "f1b",
            Arity::Rewrite,
            Box::new(no_arguments(|| Box::new(OneForwardOneBackward))),
        ),
        ("vpp", Arity::Rewrite, Box::new(vpp)),
        (
            "dual",
            Arity::Rewrite,
            Box::new(no_arguments(|| Box::new(Dual))),
        ),
        ("zero_bubble", Arity::Rewrite, Box::new(zero_bubble)),
    ];
    for (name, arity, factory) in entries {
        registry
            .register(name, arity, factory)
            .expect("the built-in names are distinct and well formed");
    }
}

/// A factory for a pass without keyword arguments.
fn no_arguments(
    make: fn() -> Box<dyn Transform>,
) -> impl Fn(&Arguments) -> Result<Box<dyn Transform>, TransformError> {
    move |args: &Arguments| {
        args.allow_only(&[])?;
        Ok(make())
    }
}

/// `vpp(schedule, chunks=2, group=G, layout=standard|v)`.
fn vpp(args: &Arguments) -> Result<Box<dyn Transform>, TransformError> {
    args.allow_only(&["chunks", "group", "layout"])?;
    let chunks = args.integer("chunks")?.unwrap_or(2);
    let group = args.integer("group")?;
    let placement = match args.word("layout", &["standard", "v"])? {
        Some((_, "v")) => ChunkPlacement::V,
        _ => ChunkPlacement::Standard,
    };
    let pass = Interleave::new(chunks, group, placement).map_err(|e| match e {
        TransformError::Precondition {
            constraint,
            details,
            ..
        } => args.bad(
            &constraint,
            args.column(),
            &format!("{constraint} violated: {details}"),
        ),
        other => other,
    })?;
    Ok(Box::new(pass))
}

/// `zero_bubble(schedule, policy=h1|h2|auto|auto(N)|deepseek, memory=N)`.
fn zero_bubble(args: &Arguments) -> Result<Box<dyn Transform>, TransformError> {
    args.allow_only(&["policy", "memory"])?;
    let memory = args.number("memory")?;
    let expected = "expected h1, h2, auto, auto(N) or deepseek";
    let policy = match args.value("policy") {
        None if memory.is_some() => Policy::Auto { memory },
        None => Policy::Default,
        Some((column, Node::Call(c))) => match (c.name.as_str(), c.positional.as_slice()) {
            ("h1", []) => Policy::H1,
            ("h2", []) => Policy::H2,
            ("deepseek", []) => Policy::DeepSeek,
            ("auto", []) => Policy::Auto { memory },
            ("auto", [Node::Number { value, .. }]) if memory.is_none() => Policy::Auto {
                memory: Some(*value),
            },
            ("auto", _) => {
                return Err(args.bad(
                    "policy",
                    column,
                    "write auto, auto(N) or policy=auto, memory=N (not both)",
                ))
            }
            _ => return Err(args.bad("policy", column, expected)),
        },
        Some((column, _)) => return Err(args.bad("policy", column, expected)),
    };
    if memory.is_some() && !matches!(policy, Policy::Auto { .. }) {
        let column = args.value("memory").map_or(args.column(), |(c, _)| c);
        return Err(args.bad(
            "memory",
            column,
            "a memory limit applies to policy=auto only",
        ));
    }
    let pass =
        ZeroBubble::new(policy).map_err(|e| args.bad("memory", args.column(), &e.to_string()))?;
    Ok(Box::new(pass))
}
