//! Figures a bench hands to `cargo bench --bench targets`, which runs the benches one after
//! another and prints every issue-14 target against what was measured. A bench run on its
//! own (no `COMMITPOINT_BENCH_FIGURES`) records nothing.

use std::io::Write as _;

/// Where the runner collects figures: one `key<TAB>value` line each.
pub const FILE_ENV: &str = "COMMITPOINT_BENCH_FIGURES";

/// Appends one figure. A figure that cannot be written is reported, not fatal: the bench's
/// own printout still has it.
pub fn record(key: &str, value: f64) {
    let Some(path) = std::env::var_os(FILE_ENV) else { return };
    let line = format!("{key}\t{value}\n");
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("cannot record figure {key} in {}: {e}", std::path::Path::new(&path).display());
    }
}
