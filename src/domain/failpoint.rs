//! Fault points for the kill tests: `COMMITPOINT_FAILPOINTS=name[,name…]` makes the
//! process SIGKILL itself (`hit`) or panic (`panic_if`) when it reaches a named point.
//! Compiled only into debug builds, so a release binary ignores the variable entirely.

#[cfg(debug_assertions)]
fn armed(name: &str) -> bool {
    let armed = std::env::var("COMMITPOINT_FAILPOINTS").unwrap_or_default();
    armed.split(',').any(|n| n.trim() == name)
}

/// Dies on the spot (SIGKILL, as a crash would) if `name` is armed. Inert in release.
#[cfg(debug_assertions)]
pub fn hit(name: &str) {
    if !armed(name) {
        return;
    }
    eprintln!("commitpoint: failpoint {name} reached: killing the process");
    let pid = std::process::id().to_string();
    // SIGKILL through the kill(1) utility: no unsafe code, and no cleanup runs, as in a crash.
    let _ = std::process::Command::new("kill").args(["-KILL", &pid]).status();
    std::process::abort();
}

#[cfg(not(debug_assertions))]
pub fn hit(_name: &str) {}

/// Panics if `name` is armed: stands for a bug in a background task, which supervision
/// must turn into a non-zero exit. Inert in release.
#[cfg(debug_assertions)]
pub fn panic_if(name: &str) {
    if armed(name) {
        panic!("failpoint {name} reached");
    }
}

#[cfg(not(debug_assertions))]
pub fn panic_if(_name: &str) {}
