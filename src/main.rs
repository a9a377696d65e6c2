//! The `pipeweave` command-line tool; see `pipeweave --help` and ../shared/CLI.md.

fn main() {
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let code = pipeweave::cli::run(std::env::args_os(), &mut stdout.lock(), &mut stderr.lock());
    std::process::exit(code);
}
