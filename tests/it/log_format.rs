//! Issue 31 item 13 on the real binary: `COMMITPOINT_LOG_FORMAT=json` gives one JSON object
//! per stderr line (for Loki/ELK), and a value it does not know stops it before it logs.

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
