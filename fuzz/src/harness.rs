//! Fuzz harnesses of `pipeweave`: every call the fuzz targets make into the library lives in this
//! file and the modules beside it, so that a moved path is fixed in one place. It builds on stable
//! Rust and knows nothing of libFuzzer: the targets in `fuzz/fuzz_targets/` are one-line wrappers,
//! and the stable test `tests/fuzz_corpus.rs` includes this file with `#[path]` (its modules
//! with it) and replays the committed corpus.
//!
//! Every harness takes arbitrary bytes. Returning normally means "no bug"; a panic (a failed
//! assertion included) is a bug in the library. Library errors (`Err`) are expected for bad input
//! and are only formatted (their `Display` must not panic either).
//!
//! # `run_expression`: expression -> plan -> verify / simulate / project / check
//! Input: byte 0 chooses the ranks (1..=8), byte 1 the microbatches (1..=32), byte 2 the cost set,
//! the cross-rank latency and the projection options; the rest is the expression (UTF-8, lossy).
//! Inputs longer than [`MAX_INPUT`] are ignored (as in every harness).
//! Asserts, for every expression that `build_plan` accepts:
//! - `verify(&plan)` is `Ok` and `simulate(&plan)` is `Ok` (`build_plan` promises a verified plan);
//! - `project(&plan, ..)` is `Ok` with both receive policies, and `check_programs` accepts the
//!   programs (with the chosen `forward_only`);
//! - the compute-only CSV of the plan imports back (`import_csv`) into a plan that verifies, and
//!   the lowered CSV of the projected programs imports back into programs the checker accepts
//!   (`pipeweave check` must read our own files, see CLI.md).
//!
//! # `run_csv_import`: CSV -> import -> verify -> project -> check -> simulate
//! Input: the CSV text (UTF-8, lossy). `import_csv` and `verify` may fail. Asserts, for an
//! imported plan that verifies: `simulate` is `Ok`, `project` (early receives) is `Ok` and its
//! programs pass `check_programs`. Programs lowered in the file itself are checked too; they may be
//! rejected (they come from the file), but the checker must not panic.
//!
//! # `run_reference_json`: reference JSON -> plan -> verify -> project -> check -> simulate
//! Input: a reference schedule file (`../shared/reference/README.md`), UTF-8, lossy.
//! `read_reference` and `verify` may fail; for a plan that verifies the same assertions as for
//! CSV import hold.
//!
//! # `run_programs_checker`: the communication checker on mutated programs
//! Input: byte 0 chooses an expression of [`CHECKER_EXPRESSIONS`], byte 1 the ranks (1..=4),
//! byte 2 the microbatches (1..=8), byte 3 the projection options. The valid plan is built and
//! projected (both cached per thread); the checker must accept the unmutated programs. The rest of
//! the input is a list of mutations of the `ProgramSet` (swap, drop or duplicate instructions,
//! change a message's microbatch, stage, direction or peer, turn a send into a receive, move
//! an op between groups, change a compute task, renumber or drop a program, flip `semantics` or
//! `forward_only`). Asserts: `check_programs` returns (`Ok` or `Err`) without panicking. When it
//! accepts a mutated set whose non-communication instructions are those of the original (only
//! sends and receives were rearranged), the set is run on the threaded backend with the scalar
//! affine model: it must finish (no receive may time out) and give the single-device gradients.
//!
//! Files (beside this one, which the stable test includes alone): `expression.rs`,
//! `imports.rs` (CSV and reference JSON) and `programs_checker.rs` hold one harness each;
//! `mutation.rs` the byte-driven mutations of a `ProgramSet`. This file holds what they share.

mod expression;
mod imports;
mod mutation;
mod programs_checker;

pub use expression::run_expression;
pub use imports::{run_csv_import, run_reference_json};
pub use programs_checker::run_programs_checker;

use pipeweave::core_ir::{check_programs, project, ProgramSet, ProjectionOptions, RecvPolicy};
use pipeweave::Plan;

/// Inputs longer than this are ignored by every harness, so that one execution stays fast.
/// libFuzzer's default `-max_len` (4096 for these corpora) is far below it; raise `-max_len` to go
/// after deep nesting in expressions or large files.
pub const MAX_INPUT: usize = 64 * 1024;

/// The expressions the programs-checker harness builds its valid plans from.
pub const CHECKER_EXPRESSIONS: &[&str] = &[
    "gpipe",
    "f1b(gpipe)",
    "vpp(f1b(gpipe), chunks=2)",
    "vpp(f1b(gpipe), chunks=2, layout=v)",
    "zero_bubble(f1b(gpipe), policy=h1)",
    "zero_bubble(f1b(gpipe), policy=h2)",
    "dual(f1b(gpipe))",
    "zero_bubble(dual(vpp(f1b(gpipe), chunks=2)))",
];

/// The receive policy an input bit picks: just-in-time when set.
fn recv_policy(bit: bool) -> RecvPolicy {
    if bit {
        RecvPolicy::JustInTime
    } else {
        RecvPolicy::Early
    }
}

/// `project` then `check_programs`, both of which must succeed for a verified plan.
fn project_and_check(plan: &Plan, options: ProjectionOptions, context: &str) -> ProgramSet {
    let programs = project(plan, options).unwrap_or_else(|e| {
        panic!("{context}: projection of a verified plan failed ({options:?}): {e}")
    });
    if let Err(e) = check_programs(plan.problem(), &programs) {
        panic!(
            "{context}: the checker rejects the projection of a verified plan ({options:?}): {e}"
        );
    }
    programs
}
