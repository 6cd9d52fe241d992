//! Offline maintenance of a database file, with the server stopped: `compact` and the
//! hidden `debug-dump`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use super::EXIT_PROBLEMS;

/// `compact` and `debug-dump` read a redb file. A PostgreSQL store is given a
/// clear refusal: it is kept with the database's own tools.
pub(super) fn redb_only(path: &Path, command: &str) -> anyhow::Result<()> {
    let text = path.to_string_lossy();
    if text.starts_with("postgres://") || text.starts_with("postgresql://") {
        anyhow::bail!(
            "{command} needs a redb file (commitpoint.redb); a PostgreSQL store is backed up, compacted \
             (VACUUM) and inspected with PostgreSQL's own tools, see docs/SCALE-OUT.md"
        );
    }
    Ok(())
}

/// A missing file is an I/O error (74), not a new empty database.
fn existing(path: &Path) -> anyhow::Result<String> {
    let shown = path.display().to_string();
    if !path.exists() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        return Err(anyhow::Error::new(missing).context(shown));
    }
    Ok(shown)
}

pub(super) async fn compact(path: PathBuf) -> anyhow::Result<ExitCode> {
    redb_only(&path, "compact")?;
    let shown = existing(&path)?;
    let report = tokio::task::spawn_blocking(move || crate::store::compact_file(&path))
        .await?
        .with_context(|| format!("{shown}: cannot compact (is a server still running on it?)"))?;
    println!("{shown}");
    println!("size before: {} bytes", report.bytes_before);
    println!("size after:  {} bytes", report.bytes_after);
    print!("{}", report.verify);
    Ok(if report.verify.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) })
}

pub(super) async fn dump(path: PathBuf) -> anyhow::Result<ExitCode> {
    redb_only(&path, "debug-dump")?;
    let shown = existing(&path)?;
    let text = tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        crate::store::dump_file(&path, &mut out).map(|_| out)
    })
    .await?
    .with_context(|| format!("{shown}: cannot dump (is a server still running on it?)"))?;
    std::io::stdout().write_all(&text).context("cannot write to stdout")?;
    Ok(ExitCode::SUCCESS)
}
