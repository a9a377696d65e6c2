//! The schedule expression language: nested calls with keyword arguments.
//!
//! ```text
//! expr    := name [ "(" args ")" ]
//! args    := arg { "," arg }
//! arg     := expr | name "=" value
//! value   := number | expr
//! name    := [A-Za-z_][A-Za-z0-9_]*
//! ```
//! A bare name is a call without arguments. The parser only builds the tree; which names and
//! arguments exist is decided by [`crate::registry`]. Errors carry the 1-based column. Calls nest
//! at most [`MAX_DEPTH`] deep, so no input can exhaust the stack (a deeper expression is
//! [`TransformError::TooDeep`]).

use crate::error::TransformError;
use pipeweave_core::parse_number;

/// How deep calls may nest. The deepest meaningful expression of the built-in passes nests seven
/// calls (`offload(recompute(zero_bubble(dual(vpp(f1b(gpipe))))))`); users' passes leave ample
/// room below this.
pub const MAX_DEPTH: usize = 64;

/// A node of the expression tree.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// `name` or `name(args)`.
    Call(Call),
    /// A number literal, kept with its text.
    Number {
        /// The value.
        value: f64,
        /// The literal as written.
        text: String,
        /// 1-based column.
        column: usize,
    },
}

impl Node {
    /// The node's 1-based column.
    pub fn column(&self) -> usize {
        match self {
            Node::Call(c) => c.column,
            Node::Number { column, .. } => *column,
        }
    }
}

/// A call: a name with positional and keyword arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The callee.
    pub name: String,
    /// 1-based column of the name.
    pub column: usize,
    /// Positional arguments, in order.
    pub positional: Vec<Node>,
    /// Keyword arguments: (name, column of the name, value).
    pub keywords: Vec<(String, usize, Node)>,
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

/// Parses a whole expression.
pub fn parse(text: &str) -> Result<Call, TransformError> {
    let mut p = Parser {
        text,
        pos: 0,
        depth: 0,
    };
    p.skip_space();
    let call = p.call()?;
    p.skip_space();
    if p.pos < text.len() {
        return Err(p.error(format!(
            "unexpected `{}` after the expression",
            p.rest_char()
        )));
    }
    Ok(call)
}

impl<'a> Parser<'a> {
    fn error(&self, message: String) -> TransformError {
        TransformError::Syntax {
            column: self.text[..self.pos].chars().count() + 1,
            message,
        }
    }

    fn rest_char(&self) -> char {
        self.text[self.pos..].chars().next().unwrap_or(' ')
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn skip_space(&mut self) {
        while let Some(c) = self.peek() {
            if c.is_whitespace() {
                self.pos += c.len_utf8();
            } else {
                break;
            }
        }
    }

    fn column(&self) -> usize {
        self.text[..self.pos].chars().count() + 1
    }

    fn name(&mut self) -> Result<String, TransformError> {
        let start = self.pos;
        match self.peek() {
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
            Some(c) => return Err(self.error(format!("expected a name, found `{c}`"))),
            None => return Err(self.error("expected a name, found the end".to_string())),
        }
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                self.pos += 1;
            } else {
                break;
            }
        }
        Ok(self.text[start..self.pos].to_string())
    }

    fn call(&mut self) -> Result<Call, TransformError> {
        let column = self.column();
        if self.depth >= MAX_DEPTH {
            return Err(TransformError::TooDeep {
                column,
                limit: MAX_DEPTH,
            });
        }
        self.depth += 1;
        let call = self.call_body(column);
        self.depth -= 1;
        call
    }

    fn call_body(&mut self, column: usize) -> Result<Call, TransformError> {
        let name = self.name()?;
        let mut call = Call {
            name,
            column,
            positional: Vec::new(),
            keywords: Vec::new(),
        };
        self.skip_space();
        if self.peek() != Some('(') {
            return Ok(call);
        }
        self.pos += 1;
        self.skip_space();
        if self.peek() == Some(')') {
            self.pos += 1;
            return Ok(call);
        }
        loop {
            self.skip_space();
            self.argument(&mut call)?;
            self.skip_space();
            match self.peek() {
                Some(',') => self.pos += 1,
                Some(')') => {
                    self.pos += 1;
                    return Ok(call);
                }
                Some(c) => return Err(self.error(format!("expected `,` or `)`, found `{c}`"))),
                None => return Err(self.error("expected `)`, found the end".to_string())),
            }
        }
    }

    fn argument(&mut self, call: &mut Call) -> Result<(), TransformError> {
        if self
            .peek()
            .is_some_and(|c| c.is_ascii_digit() || c == '.' || c == '-')
        {
            let number = self.number()?;
            call.positional.push(number);
            return Ok(());
        }
        let save = self.pos;
        let column = self.column();
        let name = self.name()?;
        self.skip_space();
        if self.peek() == Some('=') {
            self.pos += 1;
            self.skip_space();
            let value = self.value()?;
            if call.keywords.iter().any(|(k, _, _)| *k == name) {
                return Err(TransformError::Syntax {
                    column,
                    message: format!("argument `{name}` is given twice"),
                });
            }
            call.keywords.push((name, column, value));
        } else {
            self.pos = save;
            if !call.keywords.is_empty() {
                return Err(self
                    .error("positional arguments must come before keyword arguments".to_string()));
            }
            let inner = self.call()?;
            call.positional.push(Node::Call(inner));
        }
        Ok(())
    }

    fn value(&mut self) -> Result<Node, TransformError> {
        if self
            .peek()
            .is_some_and(|c| c.is_ascii_digit() || c == '.' || c == '-')
        {
            self.number()
        } else {
            Ok(Node::Call(self.call()?))
        }
    }

    fn number(&mut self) -> Result<Node, TransformError> {
        let column = self.column();
        let start = self.pos;
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+' {
                self.pos += 1;
            } else {
                break;
            }
        }
        let text = &self.text[start..self.pos];
        // Read as the command line's options read numbers (`1e3` alike in both).
        match parse_number(text) {
            Ok(value) => Ok(Node::Number {
                value,
                text: text.to_string(),
                column,
            }),
            Err(e) => Err(TransformError::Syntax {
                column,
                message: e.describe(text),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_nested_calls_with_keywords() {
        let call = parse(" vpp( f1b(gpipe), chunks=3, group = 8 ) ").unwrap();
        assert_eq!(call.name, "vpp");
        assert_eq!(call.column, 2);
        assert_eq!(call.keywords.len(), 2);
        assert_eq!(call.keywords[1].0, "group");
        let Node::Call(inner) = &call.positional[0] else {
            panic!("expected a call")
        };
        assert_eq!(inner.name, "f1b");
        let bare = parse("gpipe").unwrap();
        assert!(bare.positional.is_empty());
    }

    #[test]
    fn nesting_is_limited_without_exhausting_the_stack() {
        let deep = "f1b(".repeat(25_000) + "gpipe" + &")".repeat(25_000);
        match parse(&deep) {
            Err(TransformError::TooDeep { column, limit }) => {
                assert_eq!(limit, MAX_DEPTH);
                assert_eq!(column, 4 * MAX_DEPTH + 1);
            }
            other => panic!("expected TooDeep, got {other:?}"),
        }
        let ok = "f1b(".repeat(MAX_DEPTH - 1) + "gpipe" + &")".repeat(MAX_DEPTH - 1);
        assert!(parse(&ok).is_ok());
        let keyword_deep = "v(x=".repeat(1000) + "1" + &")".repeat(1000);
        assert!(matches!(
            parse(&keyword_deep),
            Err(TransformError::TooDeep { .. })
        ));
    }

    #[test]
    fn syntax_errors_name_the_column() {
        let cases = [
            ("", 1, "expected a name"),
            ("f1b(gpipe", 10, "expected `)`"),
            ("f1b(gpipe))", 11, "unexpected `)`"),
            ("vpp(f1b(gpipe), chunks=)", 24, "expected a name"),
            ("vpp(f1b(gpipe), chunks=2x)", 24, "`2x` is not a number"),
            (
                "vpp(chunks=2, f1b(gpipe))",
                15,
                "positional arguments must come before",
            ),
            ("vpp(f1b(gpipe), chunks=2, chunks=3)", 27, "given twice"),
            ("f1b(gpipe) + 1", 12, "unexpected `+`"),
        ];
        for (text, column, message) in cases {
            match parse(text) {
                Err(TransformError::Syntax {
                    column: c,
                    message: m,
                }) => {
                    assert_eq!(c, column, "{text}: {m}");
                    assert!(m.contains(message), "{text}: {m}");
                }
                other => panic!("{text}: expected a syntax error, got {other:?}"),
            }
        }
    }
}
