//! Turns a parsed expression into the list of passes it stands for.
//!
//! `vpp(f1b(gpipe), chunks=2)` is sugar for the list `[gpipe, f1b, vpp(chunks=2)]`: the innermost
//! call runs first. This module is the registry of pass names and their arguments; an unknown name
//! or argument is an error, never ignored.

use crate::driver::PassList;
use crate::error::TransformError;
use crate::expr::{parse, Call, Node};
use crate::passes::{Dual, GPipe, Interleave, Layout, OneForwardOneBackward, Policy, ZeroBubble};
use crate::transform::Transform;

/// Pass names the language knows.
pub const KNOWN_PASSES: &[&str] = &["gpipe", "f1b", "vpp", "dual", "zero_bubble"];

/// Parses and compiles an expression.
pub fn compile_expression(text: &str) -> Result<PassList, TransformError> {
    compile(&parse(text)?)
}

/// Compiles a parsed expression into its pass list (innermost first).
pub fn compile(root: &Call) -> Result<PassList, TransformError> {
    let mut chain: Vec<&Call> = Vec::new();
    let mut current = root;
    loop {
        chain.push(current);
        match current.positional.as_slice() {
            [] => break,
            [Node::Call(inner)] => current = inner,
            [other] => {
                return Err(bad(
                    current,
                    "schedule",
                    other.column(),
                    "expected a schedule expression such as f1b(gpipe), found a number",
                ))
            }
            [_, extra, ..] => {
                return Err(bad(
                    current,
                    "schedule",
                    extra.column(),
                    "takes one schedule to rewrite; write other arguments as name=value",
                ))
            }
        }
    }
    let passes = chain
        .into_iter()
        .rev()
        .map(pass_for)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PassList::new(passes))
}

fn bad(call: &Call, argument: &str, column: usize, message: &str) -> TransformError {
    TransformError::BadArgument {
        pass: call.name.clone(),
        argument: argument.to_string(),
        column,
        message: message.to_string(),
    }
}

fn pass_for(call: &Call) -> Result<Box<dyn Transform>, TransformError> {
    let needs_inner = |call: &Call| -> Result<(), TransformError> {
        if call.positional.is_empty() {
            Err(bad(
                call,
                "schedule",
                call.column,
                &format!(
                    "needs the schedule it rewrites as first argument, e.g. {}(gpipe)",
                    call.name
                ),
            ))
        } else {
            Ok(())
        }
    };
    match call.name.as_str() {
        "gpipe" => {
            reject_keywords(call, &[])?;
            if let Some(inner) = call.positional.first() {
                return Err(bad(
                    call,
                    "schedule",
                    inner.column(),
                    "gpipe is the baseline and rewrites no schedule",
                ));
            }
            Ok(Box::new(GPipe))
        }
        "f1b" => {
            needs_inner(call)?;
            reject_keywords(call, &[])?;
            Ok(Box::new(OneForwardOneBackward))
        }
        "vpp" => {
            needs_inner(call)?;
            reject_keywords(call, &["chunks", "group", "layout"])?;
            let chunks = integer_argument(call, "chunks")?.unwrap_or(2);
            let group = integer_argument(call, "group")?;
            let layout = match keyword(call, "layout") {
                None => Layout::Standard,
                Some((_, Node::Call(c))) if c.name == "standard" && c.positional.is_empty() => {
                    Layout::Standard
                }
                Some((_, Node::Call(c))) if c.name == "v" && c.positional.is_empty() => Layout::V,
                Some((column, _)) => {
                    return Err(bad(call, "layout", column, "expected `standard` or `v`"))
                }
            };
            let pass = Interleave::new(chunks, group, layout).map_err(|e| match e {
                TransformError::Precondition {
                    constraint,
                    details,
                    ..
                } => TransformError::BadArgument {
                    pass: "vpp".to_string(),
                    argument: constraint.clone(),
                    column: call.column,
                    message: format!("{constraint} violated: {details}"),
                },
                other => other,
            })?;
            Ok(Box::new(pass))
        }
        "dual" => {
            needs_inner(call)?;
            reject_keywords(call, &[])?;
            Ok(Box::new(Dual))
        }
        "zero_bubble" => {
            needs_inner(call)?;
            reject_keywords(call, &["policy", "memory"])?;
            let memory = number_argument(call, "memory")?;
            let policy = match keyword(call, "policy") {
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
                        return Err(bad(
                            call,
                            "policy",
                            column,
                            "write auto, auto(N) or policy=auto, memory=N (not both)",
                        ))
                    }
                    _ => {
                        return Err(bad(
                            call,
                            "policy",
                            column,
                            "expected h1, h2, auto, auto(N) or deepseek",
                        ))
                    }
                },
                Some((column, _)) => {
                    return Err(bad(
                        call,
                        "policy",
                        column,
                        "expected h1, h2, auto, auto(N) or deepseek",
                    ))
                }
            };
            if memory.is_some() && !matches!(policy, Policy::Auto { .. }) {
                let column = keyword(call, "memory").map_or(call.column, |(c, _)| c);
                return Err(bad(
                    call,
                    "memory",
                    column,
                    "a memory limit applies to policy=auto only",
                ));
            }
            let pass = ZeroBubble::new(policy)
                .map_err(|e| bad(call, "memory", call.column, &e.to_string()))?;
            Ok(Box::new(pass))
        }
        other => Err(TransformError::UnknownPass {
            name: other.to_string(),
            column: call.column,
            known: KNOWN_PASSES.join(", "),
        }),
    }
}

fn keyword<'a>(call: &'a Call, name: &str) -> Option<(usize, &'a Node)> {
    call.keywords
        .iter()
        .find(|(k, _, _)| k == name)
        .map(|(_, column, node)| (*column, node))
}

fn reject_keywords(call: &Call, allowed: &[&str]) -> Result<(), TransformError> {
    for (name, column, _) in &call.keywords {
        if !allowed.contains(&name.as_str()) {
            let message = if allowed.is_empty() {
                format!("`{}` takes no arguments besides its schedule", call.name)
            } else {
                format!(
                    "unknown argument; `{}` takes {}",
                    call.name,
                    allowed.join(", ")
                )
            };
            return Err(bad(call, name, *column, &message));
        }
    }
    Ok(())
}

fn number_argument(call: &Call, name: &str) -> Result<Option<f64>, TransformError> {
    match keyword(call, name) {
        None => Ok(None),
        Some((_, Node::Number { value, .. })) => Ok(Some(*value)),
        Some((column, _)) => Err(bad(call, name, column, "expected a number")),
    }
}

fn integer_argument(call: &Call, name: &str) -> Result<Option<u32>, TransformError> {
    match keyword(call, name) {
        None => Ok(None),
        Some((
            _,
            Node::Number {
                value,
                text,
                column,
            },
        )) => {
            if value.fract() != 0.0 || *value < 0.0 || *value > f64::from(u32::MAX) {
                Err(bad(
                    call,
                    name,
                    *column,
                    &format!("`{text}` is not a whole number between 0 and {}", u32::MAX),
                ))
            } else {
                Ok(Some(*value as u32))
            }
        }
        Some((column, _)) => Err(bad(call, name, column, "expected a whole number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_calls_become_pass_lists() {
        assert_eq!(compile_expression("gpipe").unwrap().names(), ["gpipe"]);
        assert_eq!(
            compile_expression("vpp(f1b(gpipe), chunks=3, group=8)")
                .unwrap()
                .names(),
            ["gpipe", "f1b", "vpp"]
        );
    }

    #[test]
    fn unknown_names_and_arguments_are_errors() {
        let err = compile_expression("f1b(gpype)").unwrap_err();
        assert!(
            matches!(err, TransformError::UnknownPass { column: 5, .. }),
            "{err}"
        );
        let err = compile_expression("vpp(f1b(gpipe), chunk=2)").unwrap_err();
        assert!(
            err.to_string()
                .contains("argument `chunk` at column 17: unknown argument"),
            "{err}"
        );
        let err = compile_expression("f1b(gpipe, 3)").unwrap_err();
        assert!(err.to_string().contains("takes one schedule"), "{err}");
        let err = compile_expression("vpp(f1b(gpipe), chunks=2.5)").unwrap_err();
        assert!(err.to_string().contains("not a whole number"), "{err}");
        let err = compile_expression("vpp(f1b(gpipe), chunks=3, layout=v)").unwrap_err();
        assert!(
            err.to_string().contains("layout = v needs chunks = 2"),
            "{err}"
        );
        let err = compile_expression("vpp(f1b(gpipe), layout=w)").unwrap_err();
        assert!(
            err.to_string().contains("expected `standard` or `v`"),
            "{err}"
        );
        let err = compile_expression("f1b").unwrap_err();
        assert!(
            err.to_string().contains("needs the schedule it rewrites"),
            "{err}"
        );
        let err = compile_expression("gpipe(gpipe)").unwrap_err();
        assert!(err.to_string().contains("baseline"), "{err}");
        for (text, why) in [
            (
                "zero_bubble(f1b(gpipe), policy=h3)",
                "expected h1, h2, auto",
            ),
            (
                "zero_bubble(f1b(gpipe), policy=h1, memory=4)",
                "applies to policy=auto only",
            ),
            (
                "zero_bubble(f1b(gpipe), policy=auto(4), memory=4)",
                "not both",
            ),
            ("zero_bubble(f1b(gpipe), memory=-1)", "memory > 0"),
            ("dual(f1b(gpipe), x=1)", "takes no arguments"),
        ] {
            let err = compile_expression(text).unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
        let err = compile_expression("vpp(f1b(gpipe), chunks=0)").unwrap_err();
        assert!(err.to_string().contains("1 <= chunks <= 64"), "{err}");
    }
}
