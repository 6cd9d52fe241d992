//! Issue 31 item 13 on the real binary: `COMMITPOINT_LOG_FORMAT=json` gives one JSON object
//! per stderr line (for Loki/ELK), a value it does not know stops it before it logs, and a
//! JOURNAL_STREAM naming stderr itself drops the timestamp journald adds anyway.

use serde_json::Value;

use crate::util::{Server, run_to_end, serve_command, stderr, temp_dir};

#[test]
fn json_format_writes_one_object_per_stderr_line() {
    let dir = temp_dir();
    let server = Server::start_with_env(dir.path(), &[], &[("COMMITPOINT_LOG_FORMAT", "json")]);
    let (status, log) = server.terminate();
    assert_eq!(status.code(), Some(0), "{log}");
    let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "serve logged nothing");
    let events: Vec<Value> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{log}")))
        .collect();
    let shutdown = events
        .iter()
        .find(|e| e["fields"]["message"].as_str().is_some_and(|m| m.starts_with("shutting down")))
        .unwrap_or_else(|| panic!("no shutdown event in:\n{log}"));
    assert_eq!(shutdown["level"], "INFO", "{shutdown}");
    assert!(shutdown["timestamp"].is_string(), "JSON keeps its own timestamp: {shutdown}");
}

#[test]
fn an_unknown_log_format_is_a_configuration_error() {
    let dir = temp_dir();
    let mut cmd = serve_command(dir.path(), &[]);
    cmd.env("COMMITPOINT_LOG_FORMAT", "logfmt");
    let out = run_to_end(cmd);
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("COMMITPOINT_LOG_FORMAT=\"logfmt\"") && err.contains("\"json\""), "{err}");
}

/// Runs serve until it is ready, then SIGTERM; returns what it wrote to stderr (a file,
/// so that its device and inode are known before the start).
fn serve_stderr_to_file(journal_stream_matches: bool) -> String {
    use std::io::BufRead;
    use std::os::unix::fs::MetadataExt;

    let dir = temp_dir();
    let log_path = dir.path().join("stderr.log");
    let log = std::fs::File::create(&log_path).expect("create the stderr file");
    let meta = log.metadata().expect("stat the stderr file");
    let mut cmd = serve_command(&dir.path().join("data"), &[]);
    cmd.env_remove("JOURNAL_STREAM").env_remove("COMMITPOINT_LOG_FORMAT");
    if journal_stream_matches {
        cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()));
    }
    let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(log).spawn().expect("spawn serve");
    let mut ready = String::new();
    let stdout = child.stdout.take().expect("piped stdout");
    std::io::BufReader::new(stdout).read_line(&mut ready).expect("read the ready line");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let status = child.wait().expect("wait for serve");
    let written = std::fs::read_to_string(&log_path).expect("read the stderr file");
    assert!(ready.contains("listening"), "not ready: {ready:?}\n{written}");
    assert_eq!(status.code(), Some(0), "{written}");
    written
}

#[test]
fn under_journald_lines_carry_no_timestamp_or_colour() {
    let journald = serve_stderr_to_file(true);
    let shutdown = journald.lines().find(|l| l.contains("shutting down")).unwrap_or_else(|| panic!("{journald}"));
    assert!(shutdown.trim_start().starts_with("INFO"), "journald stamps lines itself: {shutdown:?}");
    assert!(!journald.contains('\u{1b}'), "no ANSI for the journal: {journald:?}");

    // The control: the same stderr without JOURNAL_STREAM keeps the timestamp.
    let plain = serve_stderr_to_file(false);
    let shutdown = plain.lines().find(|l| l.contains("shutting down")).unwrap_or_else(|| panic!("{plain}"));
    assert!(shutdown.starts_with(|c: char| c.is_ascii_digit()), "a timestamp first: {shutdown:?}");
}
