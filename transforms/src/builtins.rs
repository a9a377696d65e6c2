//! The built-in passes' names and arguments in the expression language: `gpipe`, `f1b`,
//! `vpp(chunks, group, layout)`, `dual`, `zero_bubble(policy, memory)`, `recompute(memory)`,
//! `offload(memory)`. [`Registry::builtin`] holds them; users add their own passes to such a
//! registry.

use crate::driver::PassList;
use crate::error::TransformError;
use crate::expr::Node;
use crate::pass::Pass;
use crate::passes::{
    Dual, GPipe, Interleave, Offload, OneForwardOneBackward, Policy, Recompute, ZeroBubble,
};
use crate::registry::{Arguments, Arity, Factory, Registry};
use crate::schedules::controllable::Controllable;
use pipeweave_core::ChunkPlacement;

impl Registry {
    /// The built-in passes: `gpipe`, `f1b`, `vpp`, `dual`, `zero_bubble`, `recompute`, `offload`.
    pub fn builtin() -> Registry {
        let mut registry = Registry::empty();
        register_builtins(&mut registry);
        registry
    }
}

/// Compiles an expression with the built-in passes.
pub fn compile_expression(text: &str) -> Result<PassList, TransformError> {
    Registry::builtin().compile_expression(text)
}

/// Adds `gpipe`, `f1b`, `vpp`, `dual`, `zero_bubble`, `recompute` and `offload` to `registry`.
pub fn register_builtins(registry: &mut Registry) {
    let entries: [(&str, Arity, Factory); 7] = [
        (
            GPipe::NAME,
            Arity::Baseline,
            Box::new(no_arguments(|| Box::new(GPipe))),
        ),
        (
            OneForwardOneBackward::NAME,
            Arity::Rewrite,
            Box::new(no_arguments(|| Box::new(OneForwardOneBackward))),
        ),
        (Interleave::NAME, Arity::Rewrite, Box::new(vpp)),
        (
            Dual::NAME,
            Arity::Rewrite,
            Box::new(no_arguments(|| Box::new(Dual))),
        ),
        (ZeroBubble::NAME, Arity::Rewrite, Box::new(zero_bubble)),
        (Recompute::NAME, Arity::Rewrite, Box::new(recompute)),
        (Offload::NAME, Arity::Rewrite, Box::new(offload)),
    ];
    for (name, arity, factory) in entries {
        registry
            .register(name, arity, factory)
            .expect("the built-in names are distinct and well formed");
    }
}

/// A factory for a pass without keyword arguments.
fn no_arguments(
    make: fn() -> Box<dyn Pass>,
) -> impl Fn(&Arguments) -> Result<Box<dyn Pass>, TransformError> {
    move |args: &Arguments| {
        args.allow_only(&[])?;
        Ok(make())
    }
}

/// `vpp(schedule, chunks=2, group=G, layout=standard|v)`.
fn vpp(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
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

/// `zero_bubble(schedule, policy=h1|h2|auto|auto(N)|deepseek|v_half|v_min, memory=N)`.
fn zero_bubble(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["policy", "memory"])?;
    let memory = args.number("memory")?;
    let expected = "expected h1, h2, auto, auto(N), deepseek, v_half or v_min";
    let policy = match args.value("policy") {
        None if memory.is_some() => Policy::Auto { memory },
        None => Policy::Default,
        Some((column, Node::Call(c))) => match (c.name.as_str(), c.positional.as_slice()) {
            ("h1", []) => Policy::H1,
            ("h2", []) => Policy::H2,
            ("deepseek", []) => Policy::DeepSeek,
            ("v_half", []) => Policy::Controllable(Controllable::Half),
            ("v_min", []) => Policy::Controllable(Controllable::Min),
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

/// `recompute(schedule, memory=N)`.
fn recompute(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["memory"])?;
    let memory = args.number("memory")?;
    let column = args.value("memory").map_or(args.column(), |(c, _)| c);
    let pass = Recompute::new(memory).map_err(|e| args.bad("memory", column, &e.to_string()))?;
    Ok(Box::new(pass))
}

/// `offload(schedule, memory=N)`.
fn offload(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["memory"])?;
    let memory = args.number("memory")?;
    let column = args.value("memory").map_or(args.column(), |(c, _)| c);
    let pass = Offload::new(memory).map_err(|e| args.bad("memory", column, &e.to_string()))?;
    Ok(Box::new(pass))
}
