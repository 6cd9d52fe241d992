//! The files `submit` sends and `estimate` prices: each argument file, or every file
//! under an argument directory (recursively, in name order).

use std::path::{Path, PathBuf};

use anyhow::Context;

/// One file; `source_id` is its path relative to the argument it came from.
pub(super) struct Source {
    pub(super) path: PathBuf,
    pub(super) source_id: String,
}

pub(super) fn collect(paths: &[PathBuf]) -> anyhow::Result<Vec<Source>> {
    let mut out = Vec::new();
    for root in paths {
        let meta = std::fs::metadata(root).with_context(|| format!("cannot read {}", root.display()))?;
        if meta.is_dir() {
            walk(root, root, &mut out)?;
        } else {
            out.push(Source { path: root.clone(), source_id: root.display().to_string() });
        }
    }
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<Source>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(root, &path, out)?;
        } else if path.is_file() {
            let source_id = path.strip_prefix(root).unwrap_or(&path).display().to_string();
            out.push(Source { path, source_id });
        }
    }
    Ok(())
}
