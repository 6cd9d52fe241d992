//! `commitpoint backup --out FILE`: ask the running server for a consistent snapshot,
//! download it with a progress bar, make it durable, and check it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use futures_util::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use super::EXIT_PROBLEMS;

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Where to write the backup (must not exist).
    #[arg(long)]
    out: PathBuf,
    #[command(flatten)]
    admin: super::AdminUrl,
    /// Leave the server's copy in its data directory (by default it is removed once downloaded).
    #[arg(long)]
    keep_on_server: bool,
}

pub(super) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.out.exists() {
        bail!("{}: already exists; choose a new file name", args.out.display());
    }
    let base = args.admin.resolve();
    let client = args.admin.client()?;
    let response =
        client.post(format!("{base}/v1/admin/backup")).send().await.with_context(|| format!("cannot reach {base}"))?;
    let status = response.status();
    let made: Value = response.json().await.context("the server sent a non-JSON answer")?;
    if !status.is_success() {
        bail!("the server could not take a backup: {}", made["error"]["message"].as_str().unwrap_or("no message"));
    }
    let name = made["name"].as_str().unwrap_or_default().to_string();
    eprintln!("snapshot {name}: {} entries, {} bytes", made["entries"], made["bytes"]);
    download(&client, &format!("{base}/v1/admin/backups/{name}"), &args.out).await?;
    if !args.keep_on_server {
        let _ = client.delete(format!("{base}/v1/admin/backups/{name}")).send().await;
    }
    let out = args.out.clone();
    let report = tokio::task::spawn_blocking(move || crate::store::verify_file(&out)).await??;
    println!("{}\n{report}", args.out.display());
    Ok(if report.is_ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_PROBLEMS) })
}

/// Streams to `FILE.partial` (mode 0600, never through a planted link), fsyncs, renames,
/// fsyncs the directory: never a torn file under the final name.
async fn download(client: &reqwest::Client, url: &str, out: &Path) -> anyhow::Result<()> {
    let response = client.get(url).send().await.context("cannot download the snapshot")?;
    if !response.status().is_success() {
        bail!("downloading the snapshot failed: {}", response.status());
    }
    let bar = ProgressBar::new(response.content_length().unwrap_or(0));
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let partial = crate::domain::private_file::partial_path(out);
    let mut file = crate::domain::private_file::replace(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let mut body = response.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("the download broke off")?;
        file.write_all(&chunk).with_context(|| format!("cannot write {}", partial.display()))?;
        bar.inc(chunk.len() as u64);
    }
    file.sync_all().context("cannot sync the backup file")?;
    drop(file);
    bar.finish_and_clear();
    std::fs::rename(&partial, out).with_context(|| format!("cannot move the backup to {}", out.display()))?;
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir).and_then(|d| d.sync_all()).context("cannot sync the backup's directory")?;
    Ok(())
}
