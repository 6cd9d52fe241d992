//! Keeping the store itself: backups, the writer's pulse, retention, erasure.

use super::*;
use async_trait::async_trait;
use std::sync::OnceLock;

/// Keeping the store itself: backups and the writer's pulse.
#[async_trait]
pub trait Upkeep: Send + Sync + std::fmt::Debug {
    /// A consistent copy while serving.
    async fn backup(&self, dest: PathBuf) -> Result<BackupReport, Error>;
    async fn last_backup_ms(&self) -> Result<Option<u64>, Error>;
    /// Answers once the writer has committed an empty job: it is alive.
    async fn ping_writer(&self) -> Result<(), Error>;
    /// Looks at up to `scan` committed extractions after `after` and drops what
    /// `policy` no longer keeps.
    async fn retention_step(&self, policy: RetentionPolicy, after: u64, scan: usize) -> Result<RetentionStep, Error>;
    /// Erases everything of a tenant but its spend totals, in bounded transactions.
    async fn erase_tenant(&self, tenant: String) -> Result<ErasureReport, Error>;
}

/// What an erasure removed. Counts add up over its transactions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ErasureReport {
    pub extractions: u64,
    pub contents: u64,
    pub findings: u64,
    pub raw_results: u64,
    pub staged_answers: u64,
    pub ledger_entries: u64,
    pub outbox_events: u64,
    pub webhook_deliveries: u64,
    /// Submit intents left with no member, closed before reaching the provider.
    pub intents_closed: u64,
}

impl ErasureReport {
    pub(crate) fn add(&mut self, o: &ErasureReport) {
        self.extractions += o.extractions;
        self.contents += o.contents;
        self.findings += o.findings;
        self.raw_results += o.raw_results;
        self.staged_answers += o.staged_answers;
        self.ledger_entries += o.ledger_entries;
        self.outbox_events += o.outbox_events;
        self.webhook_deliveries += o.webhook_deliveries;
        self.intents_closed += o.intents_closed;
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub path: PathBuf,
    pub bytes: u64,
    pub entries: u64,
}

/// This process as other instances and the database see it: `host:pid`. A host name
/// that cannot be read is shown as `unknown-host` rather than failing the start.
pub fn this_instance() -> &'static str {
    static LABEL: OnceLock<String> = OnceLock::new();
    LABEL.get_or_init(|| {
        let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok());
        format!("{}:{}", host.as_deref().unwrap_or("unknown-host"), std::process::id())
    })
}
