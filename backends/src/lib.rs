//! `pipeweave-backends`: executors of per-rank programs.
//!
//! - [`interpreter`]: one interpreter of a checked rank program ([`CheckedRank`], only made by
//!   [`pipeweave_core::CheckedPrograms`]), generic over a [`transport::Transport`] (batched
//!   groups: post every send and receive, then complete them) and a [`compute::StageCompute`];
//!   every call into either is guarded, and a program needing a residency capability the compute
//!   does not declare ([`compute::Capabilities`]) is refused before its first instruction;
//! - [`threads`]: the threaded backend (a thread per rank, channels as links, abort on failure);
//! - `mpi` (cargo feature `mpi`): the MPI backend (a process per rank under `mpirun`, immediate
//!   sends and matched receives with a checked header, a fingerprint of the programs compared
//!   before the run, abort of the job on failure);
//! - [`numeric`]: a scalar affine stage model and its single-device reference, for end-to-end
//!   gradient checks (and, with delays, sleep kernels against the simulator);
//! - [`timing`]: precise sleeps (the thread's timer slack at its minimum).
//!
//! Architecture invariant: backends only consume checked per-rank programs (the types say so:
//! the interpreter takes a [`CheckedRank`], never a bare `RankProgram`); they never look at the
//! global plan's orders. Threads, MPI and NCCL differ only in the transport.
#![warn(missing_docs)]

pub mod choice;
pub mod compute;
pub mod error;
pub mod interpreter;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod numeric;
pub mod stage_error;
pub mod threads;
pub mod timing;
pub mod transport;

#[cfg(feature = "mpi")]
pub use crate::mpi::{agree_on_programs, run_mpi, Mailbox, MpiOptions, MpiTransport, WirePayload};
pub use choice::Backend;
pub use compute::{Capabilities, Capability, StageCompute};
pub use error::BackendError;
pub use interpreter::{run_rank, CheckedRank};
pub use numeric::{AffineModel, AffineStage};
pub use stage_error::StageError;
pub use threads::{run_threads, ThreadOptions};
pub use transport::{Incoming, Outgoing, Transport, TransportFailure};
