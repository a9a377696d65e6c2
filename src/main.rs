//! The `pipeweave` command-line tool; see `pipeweave --help` and ../shared/CLI.md.
fn main() {}
