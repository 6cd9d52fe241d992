//! Supervised background tasks: a panic in one of them ends the process with exit 70
//! (so systemd's `Restart=on-failure` restarts it) after an orderly shutdown, instead of
//! leaving it up with its provider work silently stopped.

use std::time::Duration;

use crate::util::{Server, assert_verifies, temp_dir};

/// Generous for a loaded machine; the failpoint fires on the scheduler's first step.
const EXIT_WITHIN: Duration = Duration::from_secs(30);

#[test]
fn a_panicking_scheduler_makes_the_process_exit_70_naming_the_task_and_the_panic() {
    let dir = temp_dir();
    let env = [("COMMITPOINT_FAILPOINTS", "scheduler-panic")];
    let mut server = Server::start_with_env(dir.path(), &["--provider", "simulator"], &env);
    let Some((status, stderr)) = server.wait_exit(EXIT_WITHIN) else {
        let stderr = server.kill9();
        panic!("the server is still up {EXIT_WITHIN:?} after its scheduler panicked:\n{stderr}");
    };
    assert_eq!(status.code(), Some(70), "{stderr}");
    let named =
        stderr.lines().any(|l| l.contains("scheduler simulator") && l.contains("failpoint scheduler-panic reached"));
    assert!(named, "no line names the task and the panic:\n{stderr}");
    // Orderly: the writer closed the file, which verifies clean.
    assert_verifies(&server.db_path());
}

#[test]
fn without_the_failpoint_the_same_server_stays_up_and_stops_with_0() {
    let dir = temp_dir();
    let mut server = Server::start_with_env(dir.path(), &["--provider", "simulator"], &[]);
    assert!(server.wait_exit(Duration::from_secs(2)).is_none(), "the server exited by itself");
    let (status, stderr) = server.terminate();
    assert_eq!(status.code(), Some(0), "{stderr}");
}
