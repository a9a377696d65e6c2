//! The built-in passes' names and arguments in the expression language: `gpipe`, `f1b`,
//! `vpp(chunks, group, layout)`, `dual(memory)`, `zero_bubble(policy, memory)`, `recompute(memory, weight_grads)`,
//! `offload(memory)`, `seq_split(chunks, split, memory)`. [`Registry::builtin`] holds them; users add their own passes to such a
//! registry. What a pass's constructor refuses becomes an error about the argument, at its column
//! where it has one, reading `constraint violated: details`.

use crate::driver::PassList;
use crate::error::TransformError;
use crate::expr::Node;
use crate::pass::Pass;
use crate::passes::{
    ChunkOffload, Dual, F1b, Gpipe, Offload, Policy, Recompute, Relief, ReliefStrategy, SeqSplit,
    Vpp, VppOrder, WeightGrads, ZeroBubble,
};
use crate::registry::{Arguments, Arity, Factory, Registry};
use crate::schedules::cache::SearchCache;
use crate::schedules::controllable::Controllable;
use pipeweave_core::{ChunkPlacement, SplitBy};

impl Registry {
    /// The built-in passes: `gpipe`, `f1b`, `vpp`, `dual`, `zero_bubble`, `recompute`, `offload`,
    /// `seq_split`.
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

/// Adds `gpipe`, `f1b`, `vpp`, `dual`, `zero_bubble`, `recompute`, `offload` and `seq_split` to
/// `registry`.
/// The `zero_bubble` passes it builds share one [`SearchCache`], so the expressions one registry
/// compiles share what their searches remember.
pub fn register_builtins(registry: &mut Registry) {
    let cache = SearchCache::new();
    let entries: [(&str, Arity, Factory); 8] = [
        (
            Gpipe::NAME,
            Arity::Baseline,
            Box::new(no_arguments(|| Box::new(Gpipe))),
        ),
        (
            F1b::NAME,
            Arity::Rewrite,
            Box::new(no_arguments(|| Box::new(F1b))),
        ),
        (Vpp::NAME, Arity::Rewrite, Box::new(vpp)),
        (Dual::NAME, Arity::Rewrite, Box::new(dual)),
        (
            ZeroBubble::NAME,
            Arity::Rewrite,
            Box::new(move |args: &Arguments| zero_bubble(args, &cache)),
        ),
        (Recompute::NAME, Arity::Rewrite, Box::new(recompute)),
        (Offload::NAME, Arity::Rewrite, Box::new(offload)),
        (SeqSplit::NAME, Arity::Rewrite, Box::new(seq_split)),
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

/// `vpp(schedule, chunks=2, group=G, layout=standard|v, order=auto|megatron|block)`.
fn vpp(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["chunks", "group", "layout", "order"])?;
    let chunks = args.integer("chunks")?.unwrap_or(2);
    let group = args.integer("group")?;
    let placement = match args.word("layout", &["standard", "v"])? {
        Some((_, "v")) => ChunkPlacement::V,
        _ => ChunkPlacement::Standard,
    };
    let order = match args.word("order", &["auto", "megatron", "block"])? {
        Some((_, "megatron")) => VppOrder::Megatron,
        Some((_, "block")) => VppOrder::Block,
        _ => VppOrder::Auto,
    };
    let built = |group, placement, order| {
        Vpp::new(chunks, group, placement).and_then(|pass: Vpp| pass.with_order(order))
    };
    // A refusal blames the first argument that, added to the ones before it, is refused.
    let blame = |argument: &'static str| {
        let column = args.value(argument).map_or(args.column(), |(c, _)| c);
        move |e| refused(args, argument, column, e)
    };
    built(None, ChunkPlacement::Standard, VppOrder::Auto).map_err(blame("chunks"))?;
    built(group, ChunkPlacement::Standard, VppOrder::Auto).map_err(blame("group"))?;
    built(group, placement, VppOrder::Auto).map_err(blame("layout"))?;
    let pass = built(group, placement, order).map_err(blame("order"))?;
    Ok(Box::new(pass))
}

/// `dual(schedule, memory=N)`.
fn dual(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["memory"])?;
    let memory = args.number("memory")?;
    let pass = Dual::new(memory).map_err(|e| refused(args, "memory", memory_column(args), e))?;
    Ok(Box::new(pass))
}

/// `zero_bubble(schedule, policy=h1|h2|auto|auto(N)|optimal|deepseek|in_place|v_half|v_min,
/// memory=N, budget=S, nodes=K)`.
fn zero_bubble(args: &Arguments, cache: &SearchCache) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["policy", "memory", "budget", "nodes"])?;
    let memory = args.number("memory")?;
    let budget = args.number("budget")?;
    let nodes = args.integer("nodes")?.map(u64::from);
    let expected = "expected h1, h2, auto, auto(N), optimal, deepseek, in_place, v_half or v_min";
    let policy = match args.value("policy") {
        None if memory.is_some() => Policy::Auto { memory },
        None => Policy::Default,
        Some((column, Node::Call(c))) => match (c.name.as_str(), c.positional.as_slice()) {
            ("h1", []) => Policy::H1,
            ("h2", []) => Policy::H2,
            ("deepseek", []) => Policy::DeepSeek,
            ("in_place", []) => Policy::InPlace,
            ("v_half", []) => Policy::Controllable(Controllable::Half),
            ("v_min", []) => Policy::Controllable(Controllable::Min),
            ("auto", []) => Policy::Auto { memory },
            ("optimal", []) => Policy::Optimal {
                memory,
                budget: budget.unwrap_or(ZeroBubble::DEFAULT_BUDGET),
                nodes,
            },
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
    if memory.is_some() && !matches!(policy, Policy::Auto { .. } | Policy::Optimal { .. }) {
        let column = args.value("memory").map_or(args.column(), |(c, _)| c);
        return Err(args.bad(
            "memory",
            column,
            "a memory limit applies to policy=auto and policy=optimal only",
        ));
    }
    for (given, argument) in [(budget.is_some(), "budget"), (nodes.is_some(), "nodes")] {
        if given && !matches!(policy, Policy::Optimal { .. }) {
            let column = args.value(argument).map_or(args.column(), |(c, _)| c);
            return Err(args.bad(
                argument,
                column,
                "a search budget applies to policy=optimal only",
            ));
        }
    }
    let argument = if budget.is_some() && memory.is_none() {
        "budget"
    } else {
        "memory"
    };
    let column = args.value(argument).map_or(args.column(), |(c, _)| c);
    let pass = ZeroBubble::new(policy)
        .map_err(|e| refused(args, argument, column, e))?
        .with_cache(cache.clone());
    Ok(Box::new(pass))
}

/// `seq_split(schedule, chunks=k, split=tokens|cost, memory=N)`.
fn seq_split(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["chunks", "split", "memory"])?;
    let chunks = args.integer("chunks")?.unwrap_or(2);
    let by = match args.word("split", &["tokens", "cost"])? {
        Some((_, "cost")) => SplitBy::Cost,
        _ => SplitBy::Tokens,
    };
    let memory = args.number("memory")?;
    let argument = if memory.is_some_and(|m| !(m.is_finite() && m > 0.0)) {
        "memory"
    } else {
        "chunks"
    };
    let column = args.value(argument).map_or(args.column(), |(c, _)| c);
    let pass = SeqSplit::new(chunks, by, memory).map_err(|e| refused(args, argument, column, e))?;
    Ok(Box::new(pass))
}

/// `recompute(schedule, memory=N, weight_grads=recompute|keep)`.
fn recompute(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["memory", "weight_grads"])?;
    let weight_grads = match args.word("weight_grads", &["recompute", "keep"])? {
        Some((_, "keep")) => WeightGrads::Keep,
        _ => WeightGrads::Recompute,
    };
    relief(Recompute::new(weight_grads), &["memory", "weight_grads"])(args)
}

/// `recompute(schedule, memory=N)` and `offload(schedule, memory=N)`: the relief pass with
/// `strategy`, whose arguments are `allowed`.
fn relief<S: ReliefStrategy>(
    strategy: S,
    allowed: &'static [&'static str],
) -> impl Fn(&Arguments) -> Result<Box<dyn Pass>, TransformError> {
    move |args: &Arguments| {
        args.allow_only(allowed)?;
        let memory = args.number("memory")?;
        let pass = Relief::new(strategy, memory)
            .map_err(|e| refused(args, "memory", memory_column(args), e))?;
        Ok(Box::new(pass))
    }
}

/// `offload(schedule, memory=N)` (the relief pass) or `offload(schedule, chunks=K)`
/// ([`ChunkOffload`]), not both.
fn offload(args: &Arguments) -> Result<Box<dyn Pass>, TransformError> {
    args.allow_only(&["memory", "chunks"])?;
    let Some(chunks) = args.integer("chunks")? else {
        return relief(Offload, &["memory", "chunks"])(args);
    };
    let column = args.value("chunks").map_or(args.column(), |(c, _)| c);
    if args.value("memory").is_some() {
        return Err(args.bad(
            "chunks",
            column,
            "give memory=N (fit a limit pair by pair) or chunks=K (whole chunks), not both",
        ));
    }
    let pass = ChunkOffload::new(chunks).map_err(|e| refused(args, "chunks", column, e))?;
    Ok(Box::new(pass))
}

/// The column of the `memory` argument, else of the call.
fn memory_column(args: &Arguments) -> usize {
    args.value("memory").map_or(args.column(), |(c, _)| c)
}

/// What a pass's constructor refused, as an error about `argument` at `column`: a precondition
/// reads `constraint violated: details` (the argument error names the pass, once).
fn refused(
    args: &Arguments,
    argument: &str,
    column: usize,
    error: TransformError,
) -> TransformError {
    match error {
        TransformError::Precondition {
            constraint,
            details,
            ..
        } => args.bad(
            argument,
            column,
            &format!("{constraint} violated: {details}"),
        ),
        other => args.bad(argument, column, &other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_arguments_name_the_pass_once() {
        for (text, message) in [
            (
                "recompute(f1b(gpipe), memory=0)",
                "pass `recompute`, argument `memory` at column 23: memory > 0 violated: \
                 memory=0 is not a positive number of activations",
            ),
            (
                "offload(f1b(gpipe), memory=-1)",
                "pass `offload`, argument `memory` at column 21: memory > 0 violated: \
                 memory=-1 is not a positive number of activations",
            ),
            (
                "offload(f1b(gpipe), memory=1, chunks=1)",
                "pass `offload`, argument `chunks` at column 31: give memory=N (fit a limit pair \
                 by pair) or chunks=K (whole chunks), not both",
            ),
            (
                "offload(f1b(gpipe), chunks=0)",
                "pass `offload`, argument `chunks` at column 21: 1 <= chunks <= 64 violated: \
                 chunks=0 offloads no chunk or more than a plan can have",
            ),
            (
                "zero_bubble(f1b(gpipe), memory=0)",
                "pass `zero_bubble`, argument `memory` at column 25: memory > 0 violated: \
                 memory = 0",
            ),
        ] {
            let err = compile_expression(text).unwrap_err().to_string();
            assert_eq!(err, message, "{text}");
        }
        // Built directly, outside any expression, the pass still names itself.
        let err = Relief::new(Recompute::default(), Some(f64::NAN)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pass `recompute` precondition `memory > 0` violated: memory=NaN is not a positive \
             number of activations"
        );
    }
}
