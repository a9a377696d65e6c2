//! Running the `pipeweave` binary from a test: a command line written as one string (its words
//! split at the spaces outside parentheses, so that an expression stays one argument) with
//! arguments taken as they are (paths, odd expressions) where need be, and the outcomes tests
//! check: its output, a JSON report of a run that exits 0, or the message of one that exits 2.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The words of `line`, split at the spaces outside parentheses:
/// `plan vpp(f1b(gpipe), chunks=2) -p 4` is `plan`, `vpp(f1b(gpipe), chunks=2)`, `-p`, `4`.
pub fn words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut depth = 0usize;
    for c in line.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ => {}
        }
        if c == ' ' && depth == 0 {
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
        } else {
            word.push(c);
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// A `pipeweave` command line, built from lines of words and single arguments.
#[derive(Clone, Debug)]
pub struct Cli {
    args: Vec<String>,
}

/// `pipeweave` with the words of `line`.
pub fn cli(line: &str) -> Cli {
    Cli { args: words(line) }
}

impl Cli {
    /// Then the words of `line`.
    pub fn line(mut self, line: &str) -> Cli {
        self.args.extend(words(line));
        self
    }

    /// Then `arg`, one argument as it is.
    pub fn arg(mut self, arg: impl AsRef<Path>) -> Cli {
        let arg = arg.as_ref();
        let text = arg
            .to_str()
            .unwrap_or_else(|| panic!("{}: not UTF-8", arg.display()));
        self.args.push(text.to_string());
        self
    }

    /// Then each of `args`, as they are.
    pub fn args(self, args: &[&str]) -> Cli {
        args.iter().fold(self, |cli, arg| cli.arg(arg))
    }

    /// Runs the command.
    pub fn output(&self) -> Output {
        Command::new(env!("CARGO_BIN_EXE_pipeweave"))
            .args(&self.args)
            .output()
            .unwrap()
    }

    /// Runs the command, asserts that it exits 0 (showing its stderr if not), and returns its
    /// stdout.
    pub fn ok(&self) -> String {
        let out = self.output();
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        stdout(&out)
    }

    /// [`Cli::ok`], its stdout parsed as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.ok()).unwrap()
    }

    /// Runs the command and parses its stdout as JSON, whatever its exit status.
    pub fn stdout_json(&self) -> Value {
        serde_json::from_str(&stdout(&self.output())).unwrap()
    }

    /// Runs the command, asserts that it exits 2, and returns its stderr.
    pub fn exit_2(&self) -> String {
        let out = self.output();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{:?}: {err}", self.args);
        err
    }

    /// [`Cli::exit_2`] with a message that contains `expected`.
    pub fn exit_2_with(&self, expected: &str) -> String {
        let err = self.exit_2();
        assert!(err.contains(expected), "{:?}: {err}", self.args);
        err
    }

    /// [`Cli::exit_2`] with a message of one line.
    pub fn error_line(&self) -> String {
        let err = self.exit_2();
        assert_eq!(err.lines().count(), 1, "{:?}: {err}", self.args);
        err
    }

    /// [`Cli::error_line`], a line that contains `expected`.
    pub fn refused(&self, expected: &str) -> String {
        let err = self.error_line();
        assert!(err.contains(expected), "{:?}: {err}", self.args);
        err
    }
}

/// A process's stdout (UTF-8).
pub fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// A process's stderr (UTF-8).
pub fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// The folder `pipeweave-NAME-PID` in the temporary directory, created.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pipeweave-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
