//! What the MPI tests share: the `mpirun` command line, and killing one rank of a running job and
//! timing how long the job survives it. Included by `tests/mpi.rs` and `tests/mpi_train.rs` with
//! `#[path]`.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// `mpirun -np np` (as root if need be, oversubscribing the cores), killed after two minutes;
/// the program and its arguments follow.
pub fn mpirun_command(np: usize) -> Command {
    let mut command = Command::new("timeout");
    command.args([
        "120",
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
    ]);
    command
        .arg(np.to_string())
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    command
}

/// Waits until a process whose command line matches `pattern` (a rank: its command line starts
/// with the binary, mpirun's does not) has run for `after`, kills it with SIGKILL, and asserts
/// that `job` ends, failing, within 10 s of the kill.
pub fn kill_a_rank_and_expect_the_job_to_end(job: &mut Child, pattern: &str, after: Duration) {
    let mut victim = None;
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(100));
        let found = Command::new("pgrep")
            .args(["-f", "--newest", pattern])
            .output()
            .expect("pgrep runs");
        let pid = String::from_utf8_lossy(&found.stdout).trim().to_string();
        if !pid.is_empty() {
            victim = Some(pid);
            break;
        }
    }
    let victim = victim.expect("the ranks started");
    std::thread::sleep(after);
    let killed = Instant::now();
    Command::new("kill")
        .args(["-9", &victim])
        .status()
        .expect("kill runs");
    let status = loop {
        if let Some(status) = job.try_wait().expect("the job can be waited for") {
            break status;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the job survived a killed rank for 10 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "a job with a killed rank must fail");
}
