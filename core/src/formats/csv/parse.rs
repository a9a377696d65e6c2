//! Reading PyTorch's cells and rows: one action per cell (`<stage><NAME>[<microbatch>]`, or an
//! overlapped `(<F>;<B>)OVERLAP_F_B`), one row per rank; every error names its line and column.

use super::{csv_error, Action, CommAction, COMM_NAMES};
use crate::error::CoreError;
use crate::ir::ids::{MicrobatchId, StageId};
use crate::ir::op::Task;
use crate::spmd::program::ParamAction;

fn parse_number(text: &str, what: &str, line: usize, column: usize) -> Result<u32, CoreError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(csv_error(
            line,
            column,
            format!("the {what} must be a decimal number"),
        ));
    }
    text.parse()
        .map_err(|_| csv_error(line, column, format!("the {what} {text} is too large")))
}

/// PyTorch's compute names that follow a stage number (`OVERLAP_F_B` wraps its sub-actions).
const COMPUTE_NAMES: [&str; 4] = ["F", "I", "W", "B"];

/// What a name after the stage number stands for.
#[derive(Clone, Copy)]
enum Named {
    Compute,
    Comm(CommAction),
    Param(ParamAction),
}

/// The action a name of PyTorch's `_ComputationType` stands for.
fn named(name: &str) -> Option<Named> {
    if COMPUTE_NAMES.contains(&name) {
        return Some(Named::Compute);
    }
    COMM_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, a)| Named::Comm(a))
        .or_else(|| {
            ParamAction::ALL
                .into_iter()
                .find(|a| a.pytorch_name() == name)
                .map(Named::Param)
        })
}

/// The names PyTorch's cells may hold, for the error on one that is none of them.
fn known_names() -> String {
    let mut names: Vec<&str> = COMPUTE_NAMES.to_vec();
    names.push("OVERLAP_F_B");
    names.extend(COMM_NAMES.iter().map(|(n, _)| *n));
    names.extend(ParamAction::ALL.iter().map(|a| a.pytorch_name()));
    names.join(", ")
}

/// Parses one cell.
pub fn parse_action(cell: &str, line: usize, column: usize) -> Result<Action, CoreError> {
    let compute = |text: &str| {
        text.parse::<Task>()
            .map(Action::Compute)
            .map_err(|e| match e {
                CoreError::Notation { reason, .. } => {
                    csv_error(line, column, format!("`{cell}`: {reason}"))
                }
                other => other,
            })
    };
    if cell.starts_with('(') {
        return compute(cell);
    }
    let digits = cell.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(csv_error(
            line,
            column,
            format!("`{cell}`: an action starts with its stage number, e.g. 2F0 or 1UNSHARD"),
        ));
    }
    let rest = &cell[digits..];
    let length = rest
        .bytes()
        .take_while(|b| b.is_ascii_uppercase() || *b == b'_')
        .count();
    let name = &rest[..length];
    let Some(what) = named(name) else {
        if name.is_empty() {
            return Err(csv_error(
                line,
                column,
                format!(
                    "`{cell}`: no action name after the stage number; PyTorch's actions are {}",
                    known_names()
                ),
            ));
        }
        return Err(csv_error(
            line,
            column,
            format!(
                "`{cell}`: unknown action `{name}`; PyTorch's actions are {}",
                known_names()
            ),
        ));
    };
    let stage = parse_number(&cell[..digits], "stage", line, column)?;
    let microbatch = &rest[length..];
    match what {
        Named::Compute => compute(cell),
        Named::Param(action) => {
            // PyTorch writes none; it reads and ignores one.
            if !microbatch.is_empty() {
                parse_number(microbatch, "microbatch", line, column)?;
            }
            Ok(Action::Param {
                action,
                stage: StageId::new(stage),
            })
        }
        Named::Comm(action) => {
            let microbatch = parse_number(microbatch, "microbatch", line, column)?;
            Ok(Action::Comm {
                action,
                stage: StageId::new(stage),
                microbatch: MicrobatchId::new(microbatch),
            })
        }
    }
}

/// Parses a whole file into one row of actions per rank (empty cells dropped).
pub fn parse_rows(text: &str) -> Result<Vec<Vec<Action>>, CoreError> {
    // A UTF-8 byte-order mark, which PyTorch's reader (and spreadsheet tools) accept.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let raw = raw.trim_end_matches('\r');
        if raw.trim().is_empty() {
            if text.lines().skip(i).all(|l| l.trim().is_empty()) {
                break;
            }
            return Err(csv_error(
                line,
                1,
                "empty line: every rank needs one row, in rank order",
            ));
        }
        let mut row = Vec::new();
        for (c, cell) in raw.split(',').enumerate() {
            let cell = unquoted(cell.trim());
            if cell.is_empty() {
                continue;
            }
            row.push(parse_action(cell, line, c + 1)?);
        }
        rows.push(row);
    }
    if rows.is_empty() {
        return Err(csv_error(1, 1, "the file has no rows"));
    }
    Ok(rows)
}

/// A cell without the double quotes a CSV writer may put around it.
fn unquoted(cell: &str) -> &str {
    cell.strip_prefix('"')
        .and_then(|c| c.strip_suffix('"'))
        .map_or(cell, str::trim)
}
