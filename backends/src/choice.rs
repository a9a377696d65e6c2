//! Which backend runs the ranks: the one choice `pipeweave run`, `pipeweave train` and
//! `train_gpt` offer (`--backend threads|mpi`), named here, below every front end that takes it.

use clap::ValueEnum;

/// Where the ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// One OS thread per rank in this process, channels as links.
    Threads,
    /// One process per rank under `mpirun` (needs the cargo feature `mpi`).
    Mpi,
}

impl Backend {
    /// The name the command line gives it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Threads => "threads",
            Backend::Mpi => "mpi",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_command_lines() {
        for backend in Backend::value_variants() {
            let parsed = Backend::from_str(backend.name(), false).unwrap();
            assert_eq!(parsed, *backend);
        }
        assert!(Backend::from_str("nccl", false).is_err());
    }
}
