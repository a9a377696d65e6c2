//! Ops and tasks, and PyTorch's action notation for them.
//!
//! An [`Op`] is the atomic unit of a plan: a forward (F), an input-gradient backward (I) or a
//! weight-gradient backward (W) of one microbatch on one stage. A [`Task`] is what a rank runs as one
//! step: a single op, a fused full backward (I directly followed by its W, notation `B`), or one
//! forward overlapped with one full backward (`(<s>F<m>;<s>B<m>)OVERLAP_F_B`).
//!
//! Four tasks manage where a forward's activations live between the forward and the backward
//! (the residency tasks, added by the `recompute` and `offload` passes; they run no op of their
//! own): a recompute forward (`R`: the forward's activations were dropped after it, this task
//! runs the forward again before the backward), a recompute for the weight gradient (`RW`: what
//! a split backward's W keeps was dropped after its I, this task runs the forward and the I
//! again before the W), and the two transfers over the rank's host link,
//! `OFFLOAD` (device to host, after the forward) and `RELOAD` (host to device, before the
//! backward). Transfers run on the link, beside the rank's computes ([`Task::on_link`]).
//!
//! Notation: `<stage><kind><microbatch>`, kinds `F`, `I`, `W`, `B`, `R`, `RW`, `OFFLOAD`, `RELOAD`;
//! e.g. `4B12`, `2OFFLOAD5`.

use crate::error::CoreError;
use crate::ir::ids::{push_decimal, MicrobatchId, StageId};
use serde::{Deserialize, Serialize};
use smallvec::{smallvec, SmallVec};
use std::fmt;
use std::ops::ControlFlow;
use std::str::FromStr;

/// The kind of an atomic op.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub enum OpKind {
    /// Forward.
    Forward,
    /// Backward for the input gradient.
    InputGrad,
    /// Backward for the weight gradient.
    WeightGrad,
}

impl OpKind {
    /// All kinds, in dependency order.
    pub const ALL: [OpKind; 3] = [OpKind::Forward, OpKind::InputGrad, OpKind::WeightGrad];

    /// The letter of the notation.
    pub fn letter(self) -> char {
        match self {
            OpKind::Forward => 'F',
            OpKind::InputGrad => 'I',
            OpKind::WeightGrad => 'W',
        }
    }

    /// Dense index 0..3.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One atomic op: a kind on a (stage, microbatch).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct Op {
    /// What runs.
    pub kind: OpKind,
    /// On which stage.
    pub stage: StageId,
    /// For which microbatch.
    pub microbatch: MicrobatchId,
}

impl Op {
    /// Builds an op.
    pub fn new(kind: OpKind, stage: StageId, microbatch: MicrobatchId) -> Op {
        Op {
            kind,
            stage,
            microbatch,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.stage, self.kind.letter(), self.microbatch)
    }
}

/// A (stage, microbatch) pair: where and for what a task runs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Serialize, Deserialize)]
pub struct Work {
    /// The stage.
    pub stage: StageId,
    /// The microbatch.
    pub microbatch: MicrobatchId,
}

impl Work {
    /// Builds a pair from raw indices.
    pub fn new(stage: u32, microbatch: u32) -> Work {
        Work {
            stage: StageId::new(stage),
            microbatch: MicrobatchId::new(microbatch),
        }
    }
    /// The op of `kind` on this pair.
    pub fn op(self, kind: OpKind) -> Op {
        Op::new(kind, self.stage, self.microbatch)
    }

    /// The ops whose end issues an offload of this pair, in the order to look for them: its I
    /// where it ran already (the offload moves what the W keeps), else its F.
    pub fn offload_sources(self) -> [Op; 2] {
        [self.op(OpKind::InputGrad), self.op(OpKind::Forward)]
    }
}

/// One step of a rank's order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum Task {
    /// F.
    Forward(Work),
    /// I alone (its W runs later).
    InputGrad(Work),
    /// W alone.
    WeightGrad(Work),
    /// B: I directly followed by its W, run as one op.
    Backward(Work),
    /// One forward and one full backward run as one overlapped op.
    Overlapped {
        /// The forward.
        forward: Work,
        /// The full backward.
        backward: Work,
    },
    /// R: the forward of a pair whose activations were dropped after its F, run again before
    /// its backward to rebuild them.
    Recompute(Work),
    /// RW: what the W of a pair keeps, dropped after its I and rebuilt right before its W by
    /// running its forward and its input-gradient backward again (from the stage input and the
    /// output gradient its I received, both kept until here; the gradient it computes again is
    /// not sent).
    RecomputeWeightGrad(Work),
    /// The pair's activations (or, after its I, what its W keeps) move from device to host over
    /// the rank's link: issued when its F (or I) ends; its place in the order is where the device
    /// copy is freed.
    Offload(Work),
    /// The pair's activations move back from host to device (before its backward).
    Reload(Work),
}

/// The kinds of task, for costs and drawing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub enum TaskKind {
    /// F.
    Forward,
    /// I.
    InputGrad,
    /// W.
    WeightGrad,
    /// B.
    Backward,
    /// F&B.
    Overlapped,
    /// R.
    Recompute,
    /// OFFLOAD.
    Offload,
    /// RELOAD.
    Reload,
}

impl Task {
    /// The atomic ops this task runs, in order.
    pub fn ops(&self) -> SmallVec<[Op; 3]> {
        match *self {
            Task::Forward(w) => smallvec![w.op(OpKind::Forward)],
            Task::InputGrad(w) => smallvec![w.op(OpKind::InputGrad)],
            Task::WeightGrad(w) => smallvec![w.op(OpKind::WeightGrad)],
            Task::Backward(w) => smallvec![w.op(OpKind::InputGrad), w.op(OpKind::WeightGrad)],
            Task::Overlapped { forward, backward } => smallvec![
                forward.op(OpKind::Forward),
                backward.op(OpKind::InputGrad),
                backward.op(OpKind::WeightGrad)
            ],
            Task::Recompute(_)
            | Task::RecomputeWeightGrad(_)
            | Task::Offload(_)
            | Task::Reload(_) => SmallVec::new(),
        }
    }

    /// Calls `visit` with each op of the task in order until it breaks: [`Task::ops`] without a
    /// collection, for the analyses' inner loops (the ops stay in registers).
    #[inline]
    pub fn try_for_each_op<B>(
        &self,
        mut visit: impl FnMut(Op) -> ControlFlow<B>,
    ) -> ControlFlow<B> {
        match *self {
            Task::Forward(w) => visit(w.op(OpKind::Forward)),
            Task::InputGrad(w) => visit(w.op(OpKind::InputGrad)),
            Task::WeightGrad(w) => visit(w.op(OpKind::WeightGrad)),
            Task::Backward(w) => {
                visit(w.op(OpKind::InputGrad))?;
                visit(w.op(OpKind::WeightGrad))
            }
            Task::Overlapped { forward, backward } => {
                visit(forward.op(OpKind::Forward))?;
                visit(backward.op(OpKind::InputGrad))?;
                visit(backward.op(OpKind::WeightGrad))
            }
            Task::Recompute(_)
            | Task::RecomputeWeightGrad(_)
            | Task::Offload(_)
            | Task::Reload(_) => ControlFlow::Continue(()),
        }
    }

    /// Whether `op` is one of the task's ops.
    #[inline]
    pub fn runs(&self, op: Op) -> bool {
        let on = |w: Work| w.stage == op.stage && w.microbatch == op.microbatch;
        match (*self, op.kind) {
            (Task::Forward(w), OpKind::Forward)
            | (Task::InputGrad(w), OpKind::InputGrad)
            | (Task::WeightGrad(w), OpKind::WeightGrad)
            | (Task::Backward(w), OpKind::InputGrad | OpKind::WeightGrad)
            | (Task::Overlapped { forward: w, .. }, OpKind::Forward)
            | (Task::Overlapped { backward: w, .. }, OpKind::InputGrad | OpKind::WeightGrad) => {
                on(w)
            }
            _ => false,
        }
    }

    /// [`Task::ops`] as a fixed array and the number of its entries in use: for the analyses'
    /// inner loops, which visit every op of a plan.
    #[inline]
    pub fn op_array(&self) -> ([Op; 3], usize) {
        match *self {
            Task::Forward(w) => ([w.op(OpKind::Forward); 3], 1),
            Task::InputGrad(w) => ([w.op(OpKind::InputGrad); 3], 1),
            Task::WeightGrad(w) => ([w.op(OpKind::WeightGrad); 3], 1),
            Task::Backward(w) => {
                let (i, w) = (w.op(OpKind::InputGrad), w.op(OpKind::WeightGrad));
                ([i, w, w], 2)
            }
            Task::Overlapped { forward, backward } => (
                [
                    forward.op(OpKind::Forward),
                    backward.op(OpKind::InputGrad),
                    backward.op(OpKind::WeightGrad),
                ],
                3,
            ),
            Task::Recompute(w)
            | Task::RecomputeWeightGrad(w)
            | Task::Offload(w)
            | Task::Reload(w) => ([w.op(OpKind::Forward); 3], 0),
        }
    }

    /// The kind of task.
    pub fn kind(&self) -> TaskKind {
        match self {
            Task::Forward(_) => TaskKind::Forward,
            Task::InputGrad(_) => TaskKind::InputGrad,
            Task::WeightGrad(_) => TaskKind::WeightGrad,
            Task::Backward(_) => TaskKind::Backward,
            Task::Overlapped { .. } => TaskKind::Overlapped,
            Task::Recompute(_) | Task::RecomputeWeightGrad(_) => TaskKind::Recompute,
            Task::Offload(_) => TaskKind::Offload,
            Task::Reload(_) => TaskKind::Reload,
        }
    }

    /// The main (stage, microbatch) of the task; for an overlapped task, its forward.
    pub fn work(&self) -> Work {
        let mut task = *self;
        *task.work_mut()
    }

    /// [`Task::work`], to change in place (an overlapped task keeps its backward).
    pub fn work_mut(&mut self) -> &mut Work {
        match self {
            Task::Forward(w)
            | Task::InputGrad(w)
            | Task::WeightGrad(w)
            | Task::Backward(w)
            | Task::Recompute(w)
            | Task::RecomputeWeightGrad(w)
            | Task::Offload(w)
            | Task::Reload(w) => w,
            Task::Overlapped { forward, .. } => forward,
        }
    }

    /// Whether this task runs a forward.
    pub fn is_forward(&self) -> bool {
        matches!(self, Task::Forward(_))
    }

    /// Whether the task is a transfer on the rank's host link (offload or reload), which runs
    /// beside the rank's computes instead of between them.
    pub fn on_link(&self) -> bool {
        matches!(self, Task::Offload(_) | Task::Reload(_))
    }

    /// Whether the task manages where activations live (recompute, offload, reload) rather
    /// than running an op of the model's schedule: what PyTorch's schedule files cannot say.
    pub fn is_residency(&self) -> bool {
        matches!(
            self,
            Task::Recompute(_) | Task::RecomputeWeightGrad(_) | Task::Offload(_) | Task::Reload(_)
        )
    }

    /// Whether the task allocates activation memory on the device when it starts: a forward
    /// (alone or overlapped), a recompute, a reload.
    pub fn allocates(&self) -> bool {
        matches!(
            self,
            Task::Forward(_)
                | Task::Overlapped { .. }
                | Task::Recompute(_)
                | Task::RecomputeWeightGrad(_)
                | Task::Reload(_)
        )
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Task::Forward(w) => write!(f, "{}F{}", w.stage, w.microbatch),
            Task::InputGrad(w) => write!(f, "{}I{}", w.stage, w.microbatch),
            Task::WeightGrad(w) => write!(f, "{}W{}", w.stage, w.microbatch),
            Task::Backward(w) => write!(f, "{}B{}", w.stage, w.microbatch),
            Task::Overlapped { forward, backward } => write!(
                f,
                "({}F{};{}B{})OVERLAP_F_B",
                forward.stage, forward.microbatch, backward.stage, backward.microbatch
            ),
            Task::Recompute(w) => write!(f, "{}R{}", w.stage, w.microbatch),
            Task::RecomputeWeightGrad(w) => write!(f, "{}RW{}", w.stage, w.microbatch),
            Task::Offload(w) => write!(f, "{}OFFLOAD{}", w.stage, w.microbatch),
            Task::Reload(w) => write!(f, "{}RELOAD{}", w.stage, w.microbatch),
        }
    }
}

impl Work {
    /// Appends `<stage><letter><microbatch>`.
    fn push_action(self, letter: u8, out: &mut Vec<u8>) {
        self.push_named(&[letter], out);
    }

    /// Appends `<stage><name><microbatch>`.
    fn push_named(self, name: &[u8], out: &mut Vec<u8>) {
        push_decimal(out, self.stage.get());
        out.extend_from_slice(name);
        push_decimal(out, self.microbatch.get());
    }
}

impl Task {
    /// Appends the task's notation to `out` (ASCII): what `Display` writes, without the
    /// formatting machinery (the writers of whole plans call it once per task).
    pub fn push_notation(&self, out: &mut Vec<u8>) {
        match *self {
            Task::Forward(w) => w.push_action(b'F', out),
            Task::InputGrad(w) => w.push_action(b'I', out),
            Task::WeightGrad(w) => w.push_action(b'W', out),
            Task::Backward(w) => w.push_action(b'B', out),
            Task::Overlapped { forward, backward } => {
                out.push(b'(');
                forward.push_action(b'F', out);
                out.push(b';');
                backward.push_action(b'B', out);
                out.extend_from_slice(b")OVERLAP_F_B");
            }
            Task::Recompute(w) => w.push_action(b'R', out),
            Task::RecomputeWeightGrad(w) => w.push_named(b"RW", out),
            Task::Offload(w) => w.push_named(b"OFFLOAD", out),
            Task::Reload(w) => w.push_named(b"RELOAD", out),
        }
    }

    /// The task's notation: [`ToString::to_string`] without the formatting machinery.
    pub fn notation(&self) -> String {
        let mut out = Vec::with_capacity(24);
        self.push_notation(&mut out);
        String::from_utf8(out).expect("the notation is ASCII")
    }
}

fn notation_error(text: &str, reason: impl Into<String>) -> CoreError {
    CoreError::Notation {
        text: text.to_string(),
        reason: reason.into(),
    }
}

fn parse_index(text: &str, digits: &str, what: &str) -> Result<u32, CoreError> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(notation_error(
            text,
            format!("the {what} must be a decimal number"),
        ));
    }
    digits
        .parse::<u32>()
        .map_err(|_| notation_error(text, format!("the {what} {digits} is too large")))
}

/// Splits `<stage><name><microbatch>` into its name (a run of letters) and its pair.
fn parse_simple(text: &str) -> Result<(&str, Work), CoreError> {
    let name_at = text
        .find(|c: char| c.is_ascii_alphabetic())
        .ok_or_else(|| notation_error(text, "expected <stage><F|I|W|B><microbatch>"))?;
    let length = text[name_at..]
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(text.len() - name_at);
    let name = &text[name_at..name_at + length];
    let stage = parse_index(text, &text[..name_at], "stage")?;
    let microbatch = parse_index(text, &text[name_at + length..], "microbatch")?;
    Ok((name, Work::new(stage, microbatch)))
}

impl FromStr for Task {
    type Err = CoreError;

    fn from_str(raw: &str) -> Result<Task, CoreError> {
        let text = raw.trim();
        if let Some(inner) = text
            .strip_prefix('(')
            .and_then(|t| t.strip_suffix(")OVERLAP_F_B"))
        {
            let (a, b) = inner.split_once(';').ok_or_else(|| {
                notation_error(text, "an overlap needs `(<F action>;<B action>)`")
            })?;
            let (fa, forward) = parse_simple(a)?;
            let (fb, backward) = parse_simple(b)?;
            if fa != "F" || fb != "B" {
                return Err(notation_error(
                    text,
                    "an overlap pairs one forward (F) with one full backward (B)",
                ));
            }
            if forward == backward {
                return Err(notation_error(
                    text,
                    "a backward cannot overlap its own forward (it depends on it)",
                ));
            }
            return Ok(Task::Overlapped { forward, backward });
        }
        let (name, work) = parse_simple(text)?;
        match name {
            "F" => Ok(Task::Forward(work)),
            "I" => Ok(Task::InputGrad(work)),
            "W" => Ok(Task::WeightGrad(work)),
            "B" => Ok(Task::Backward(work)),
            "R" => Ok(Task::Recompute(work)),
            "RW" => Ok(Task::RecomputeWeightGrad(work)),
            "OFFLOAD" => Ok(Task::Offload(work)),
            "RELOAD" => Ok(Task::Reload(work)),
            other => Err(notation_error(
                text,
                format!(
                    "unknown action kind `{other}`; expected F, I, W, B, R, RW, OFFLOAD or RELOAD"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notation_round_trips() {
        let b: Task = "2B5".parse().unwrap();
        assert_eq!(b.ops().len(), 2);
        for text in [
            "0F0",
            "12B3",
            "4I7",
            "4W7",
            "(0F3;7B9)OVERLAP_F_B",
            "4095F1048575",
            "2R5",
            "2RW5",
            "2OFFLOAD5",
            "2RELOAD5",
            "3R1",
            "3OFFLOAD1",
            "3RELOAD1",
        ] {
            let task: Task = text.parse().unwrap();
            assert_eq!(task.to_string(), text);
            assert_eq!(task.notation(), text);
            let mut moved = task;
            moved.work_mut().stage = StageId::new(99);
            assert_eq!(
                moved.work(),
                Work {
                    stage: StageId::new(99),
                    ..task.work()
                }
            );
            let (ops, len) = task.op_array();
            assert_eq!(&ops[..len], task.ops().as_slice());
            assert_eq!(task.is_residency(), len == 0);
            let mut visited = Vec::new();
            let _ = task.try_for_each_op(|op| {
                visited.push(op);
                ControlFlow::<()>::Continue(())
            });
            assert_eq!(visited.as_slice(), task.ops().as_slice());
            for op in task.ops() {
                assert!(task.runs(op));
                let other = Op::new(op.kind, op.stage, (op.microbatch.get() + 1).into());
                assert!(!task.runs(other));
            }
        }
        assert_eq!(b.ops()[1].to_string(), "2W5");
    }

    #[test]
    fn bad_notation_says_why() {
        let cases = [
            ("", "expected <stage>"),
            ("F3", "the stage must be a decimal number"),
            ("3X1", "unknown action kind `X`"),
            ("3OFFLOADS1", "unknown action kind `OFFLOADS`"),
            ("3F", "the microbatch must be a decimal number"),
            ("3F99999999999", "too large"),
            ("(0F1;1F2)OVERLAP_F_B", "pairs one forward"),
            ("(0F1)OVERLAP_F_B", "needs"),
            ("1SEND_F2", "must be a decimal number"),
            ("(0F0;0B0)OVERLAP_F_B", "cannot overlap its own forward"),
        ];
        for (text, why) in cases {
            let err = text.parse::<Task>().unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
    }
}
