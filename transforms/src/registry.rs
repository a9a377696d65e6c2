//! The registry of pass names for the expression language, and the compiler that turns an
//! expression into the list of passes it stands for.
//!
//! `vpp(f1b(gpipe), chunks=2)` is sugar for the list `[gpipe, f1b, vpp(chunks=2)]`: the innermost
//! call runs first. Each name maps to a factory that builds the pass from its keyword arguments
//! ([`Arguments`]); an unknown name or argument is an error, never ignored, and an error a
//! factory returns without its pass's name (a precondition written with
//! [`TransformError::unmet`]) gets it. `Registry::builtin` ([`crate::builtins`]) holds the seven
//! built-in passes; a user's crate adds its own with [`Registry::register`] and composes them
//! with the built-ins in the same expressions.

use crate::driver::PassList;
use crate::error::TransformError;
use crate::expr::{parse, Call, Node};
use crate::pass::Pass;
use std::collections::BTreeMap;

/// Whether a pass builds a schedule from nothing or rewrites the one it is given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// A baseline such as `gpipe`: written without a schedule argument.
    Baseline,
    /// A rewrite such as `f1b(gpipe)`: its first argument is the schedule it rewrites.
    Rewrite,
}

/// Builds a pass from its arguments.
pub type Factory = Box<dyn Fn(&Arguments) -> Result<Box<dyn Pass>, TransformError> + Send + Sync>;

struct Entry {
    arity: Arity,
    factory: Factory,
}

/// Pass names and their factories.
pub struct Registry {
    entries: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.entries.keys()).finish()
    }
}

impl Registry {
    /// A registry without any pass.
    pub fn empty() -> Registry {
        Registry {
            entries: BTreeMap::new(),
        }
    }

    /// Adds a pass under `name` (a name of the expression language: letters, digits, `_`).
    pub fn register(
        &mut self,
        name: &str,
        arity: Arity,
        factory: Factory,
    ) -> Result<(), TransformError> {
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(TransformError::BadArgument {
                pass: name.to_string(),
                argument: "name".to_string(),
                column: 1,
                message: "a pass name is a letter or `_` followed by letters, digits or `_`"
                    .to_string(),
            });
        }
        if self.entries.contains_key(name) {
            return Err(TransformError::DuplicatePass {
                name: name.to_string(),
            });
        }
        self.entries
            .insert(name.to_string(), Entry { arity, factory });
        Ok(())
    }

    /// The registered names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    /// Parses and compiles an expression.
    pub fn compile_expression(&self, text: &str) -> Result<PassList, TransformError> {
        self.compile(&parse(text)?)
    }

    /// Compiles a parsed expression into its pass list (innermost first).
    pub fn compile(&self, root: &Call) -> Result<PassList, TransformError> {
        let chain = schedule_chain(root)?;
        let passes = chain
            .into_iter()
            .rev()
            .map(|call| self.pass_for(call))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PassList::new(passes))
    }

    fn pass_for(&self, call: &Call) -> Result<Box<dyn Pass>, TransformError> {
        let entry = self
            .entries
            .get(&call.name)
            .ok_or_else(|| TransformError::UnknownPass {
                name: call.name.clone(),
                column: call.column,
                known: self.names().join(", "),
            })?;
        let args = Arguments { call };
        match (entry.arity, call.positional.first()) {
            (Arity::Rewrite, None) => Err(args.bad(
                "schedule",
                call.column,
                &format!(
                    "needs the schedule it rewrites as first argument, e.g. {}(gpipe)",
                    call.name
                ),
            )),
            (Arity::Baseline, Some(inner)) => Err(args.bad(
                "schedule",
                inner.column(),
                &format!("{} is a baseline and rewrites no schedule", call.name),
            )),
            _ => {
                // A factory's errors name its pass, as the driver names a rewrite's.
                let pass = (entry.factory)(&args).map_err(|e| e.of_pass(&call.name))?;
                // The registry's name and the pass's own must be one.
                if pass.name() != call.name {
                    return Err(TransformError::MisnamedPass {
                        registered: call.name.clone(),
                        named: pass.name().to_string(),
                    });
                }
                Ok(pass)
            }
        }
    }
}

/// The calls from the outermost to the innermost, each (but the innermost) rewriting the next.
fn schedule_chain(root: &Call) -> Result<Vec<&Call>, TransformError> {
    let mut chain: Vec<&Call> = Vec::new();
    let mut current = root;
    loop {
        chain.push(current);
        let args = Arguments { call: current };
        match current.positional.as_slice() {
            [] => return Ok(chain),
            [Node::Call(inner)] => current = inner,
            [other] => {
                return Err(args.bad(
                    "schedule",
                    other.column(),
                    "expected a schedule expression such as f1b(gpipe), found a number",
                ))
            }
            [_, extra, ..] => {
                return Err(args.bad(
                    "schedule",
                    extra.column(),
                    "takes one schedule to rewrite; write other arguments as name=value",
                ))
            }
        }
    }
}

/// The keyword arguments of one call, with typed accessors whose errors name the pass, the
/// argument and its column.
pub struct Arguments<'a> {
    call: &'a Call,
}

impl<'a> Arguments<'a> {
    /// The pass name as written.
    pub fn pass(&self) -> &str {
        &self.call.name
    }

    /// The column of the call.
    pub fn column(&self) -> usize {
        self.call.column
    }

    /// An error about `argument` at `column`.
    pub fn bad(&self, argument: &str, column: usize, message: &str) -> TransformError {
        TransformError::BadArgument {
            pass: self.call.name.clone(),
            argument: argument.to_string(),
            column,
            message: message.to_string(),
        }
    }

    /// Fails on any keyword not in `allowed`.
    pub fn allow_only(&self, allowed: &[&str]) -> Result<(), TransformError> {
        for (name, column, _) in &self.call.keywords {
            if !allowed.contains(&name.as_str()) {
                let message = if allowed.is_empty() {
                    format!(
                        "`{}` takes no arguments besides its schedule",
                        self.call.name
                    )
                } else {
                    format!(
                        "unknown argument; `{}` takes {}",
                        self.call.name,
                        allowed.join(", ")
                    )
                };
                return Err(self.bad(name, *column, &message));
            }
        }
        Ok(())
    }

    /// The raw value of a keyword with the column of its name.
    pub fn value(&self, name: &str) -> Option<(usize, &'a Node)> {
        self.call
            .keywords
            .iter()
            .find(|(k, _, _)| k == name)
            .map(|(_, column, node)| (*column, node))
    }

    /// A number, if given.
    pub fn number(&self, name: &str) -> Result<Option<f64>, TransformError> {
        match self.value(name) {
            None => Ok(None),
            Some((_, Node::Number { value, .. })) => Ok(Some(*value)),
            Some((column, _)) => Err(self.bad(name, column, "expected a number")),
        }
    }

    /// A whole number between 0 and `u32::MAX`, if given.
    pub fn integer(&self, name: &str) -> Result<Option<u32>, TransformError> {
        match self.value(name) {
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
                    Err(self.bad(
                        name,
                        *column,
                        &format!("`{text}` is not a whole number between 0 and {}", u32::MAX),
                    ))
                } else {
                    Ok(Some(*value as u32))
                }
            }
            Some((column, _)) => Err(self.bad(name, column, "expected a whole number")),
        }
    }

    /// Every keyword argument as written, in order: its name, its column (as [`Arguments::value`]
    /// gives it) and the value (a number, or a bare word as a call without arguments). For
    /// factories that pass the arguments on (passes written in Python take them as keyword
    /// arguments).
    pub fn keywords(&self) -> impl Iterator<Item = (&'a str, usize, &'a Node)> + 'a {
        self.call
            .keywords
            .iter()
            .map(|(name, column, value)| (name.as_str(), *column, value))
    }

    /// A bare word (`layout=v`), if given: Ok(Some((column, word))) or an error listing `choices`.
    pub fn word(
        &self,
        name: &str,
        choices: &[&str],
    ) -> Result<Option<(usize, &'a str)>, TransformError> {
        match self.value(name) {
            None => Ok(None),
            Some((column, Node::Call(c))) if c.positional.is_empty() && c.keywords.is_empty() => {
                if choices.contains(&c.name.as_str()) {
                    Ok(Some((column, c.name.as_str())))
                } else {
                    Err(self.bad(name, column, &expected(choices)))
                }
            }
            Some((column, _)) => Err(self.bad(name, column, &expected(choices))),
        }
    }
}

fn expected(choices: &[&str]) -> String {
    let quoted: Vec<String> = choices.iter().map(|c| format!("`{c}`")).collect();
    match quoted.split_last() {
        Some((last, [])) => format!("expected {last}"),
        Some((last, rest)) => format!("expected {} or {last}", rest.join(", ")),
        None => "expected nothing".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builtins::compile_expression;
    use crate::passes;

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
        for (text, why) in [
            ("f1b(gpipe, 3)", "takes one schedule"),
            ("vpp(f1b(gpipe), chunks=2.5)", "not a whole number"),
            (
                "vpp(f1b(gpipe), chunks=3, layout=v)",
                "layout = v needs chunks = 2",
            ),
            ("vpp(f1b(gpipe), layout=w)", "expected `standard` or `v`"),
            ("f1b", "needs the schedule it rewrites"),
            ("gpipe(gpipe)", "baseline"),
            (
                "zero_bubble(f1b(gpipe), policy=h3)",
                "expected h1, h2, auto",
            ),
            (
                "zero_bubble(f1b(gpipe), policy=h1, memory=4)",
                "applies to policy=auto and policy=optimal only",
            ),
            (
                "zero_bubble(f1b(gpipe), policy=auto(4), memory=4)",
                "not both",
            ),
            ("zero_bubble(f1b(gpipe), memory=-1)", "memory > 0"),
            (
                "zero_bubble(f1b(gpipe), policy=auto, budget=5)",
                "a search budget applies to policy=optimal only",
            ),
            (
                "zero_bubble(f1b(gpipe), policy=optimal, budget=0)",
                "0 < budget <= 86400 seconds",
            ),
            (
                "zero_bubble(f1b(gpipe), policy=optimal, memory=0)",
                "memory > 0",
            ),
            ("dual(f1b(gpipe), x=1)", "unknown argument"),
            ("dual(f1b(gpipe), memory=0)", "memory > 0"),
            ("f1b(gpipe, chunks=2)", "takes no arguments"),
            ("vpp(f1b(gpipe), chunks=0)", "1 <= chunks <= 64"),
        ] {
            let err = compile_expression(text).unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn users_register_passes_under_new_names_once() {
        let mut registry = Registry::builtin();
        let factory = || -> Factory {
            Box::new(|_: &Arguments| Ok(Box::new(passes::Gpipe) as Box<dyn Pass>))
        };
        registry
            .register("my_base", Arity::Baseline, factory())
            .unwrap();
        let error =
            |registry: &Registry, text| registry.compile_expression(text).unwrap_err().to_string();
        // A pass has one name: registered under another, it is refused when built.
        let err = error(&registry, "f1b(my_base)");
        assert!(
            err.starts_with("the pass registered as `my_base` names itself `gpipe`"),
            "{err}"
        );
        let err = registry
            .register("f1b", Arity::Rewrite, factory())
            .unwrap_err();
        assert_eq!(err.to_string(), "a pass named `f1b` is already registered");
        assert!(registry.register("1x", Arity::Rewrite, factory()).is_err());
        let err = error(&registry, "nope(gpipe)");
        assert!(
            err.contains(
                "known passes: dual, f1b, gpipe, my_base, offload, recompute, seq_split, vpp, \
                 zero_bubble"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_factory_precondition_names_its_pass() {
        let mut registry = Registry::empty();
        let refuse: Factory =
            Box::new(|_: &Arguments| Err(TransformError::unmet("size >= 1", "size = 0")));
        registry.register("fussy", Arity::Baseline, refuse).unwrap();
        let err = registry.compile_expression("fussy").unwrap_err();
        assert_eq!(
            err.to_string(),
            "pass `fussy` precondition `size >= 1` violated: size = 0"
        );
    }
}
