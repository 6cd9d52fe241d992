//! Every redb table, defined in one place.
//!
//! Random keys (blake3 identities) live only in `IDENTITY`, which maps them to a local,
//! monotonically increasing sequence number. Everything else is keyed by that sequence
//! so inserts append at the right edge of each B-tree instead of dirtying random pages
//! (DESIGN §8). Values are codec-encoded and carry a format version byte.

use redb::TableDefinition;

use super::Error;

/// Store-wide settings such as the file's format generation.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// extraction id → sequence number. The unique key that makes intake exactly-once.
pub(super) const IDENTITY: TableDefinition<&[u8; 32], u64> = TableDefinition::new("identity");
/// sequence → `ExtractionRecord`.
pub(super) const EXTRACTIONS: TableDefinition<u64, &[u8]> = TableDefinition::new("extractions");
/// sequence → `StoredContent`, kept apart so record reads stay small.
pub(super) const CONTENTS: TableDefinition<u64, &[u8]> = TableDefinition::new("contents");
/// (state code, sequence) → (): work queues and listings by state.
pub(super) const STATE_INDEX: TableDefinition<(u8, u64), ()> = TableDefinition::new("state_index");
/// state code → how many `STATE_INDEX` entries carry it, moved in the same write
/// (`store/state_counts.rs`), so status never counts the index.
pub(super) const STATE_COUNTS: TableDefinition<u8, u64> = TableDefinition::new("state_counts");
/// (tenant, schema, state code) → how many extractions of that tenant and schema are in
/// that state, moved by the same writes as `STATE_COUNTS` (`store/redb/tenant_counts.rs`);
/// a pair's counter is removed at 0. Built on open when absent or its sums disagree.
pub(super) const TENANT_COUNTS: TableDefinition<(&str, &str, u8), u64> = TableDefinition::new("tenant_counts");
/// (schema, tenant, sequence) → (): pending work by what a claim or a batch can take
/// (`store/pending_queue.rs`); built on open when absent or its count disagrees.
pub(super) const PENDING_QUEUE: TableDefinition<(&str, &str, u64), ()> = TableDefinition::new("pending_queue");
/// (lease expiry ms, sequence) → (): finds expired claims without a scan.
pub(super) const LEASE_INDEX: TableDefinition<(u64, u64), ()> = TableDefinition::new("lease_index");
/// (tenant, sequence) → (): listings by tenant.
pub(super) const TENANT_INDEX: TableDefinition<(&str, u64), ()> = TableDefinition::new("tenant_index");
/// (sequence, finding key) → `FindingRecord`. Upsert by finding key.
pub(super) const FINDINGS: TableDefinition<(u64, &[u8; 32]), &[u8]> = TableDefinition::new("findings");
/// sequence → `ResultRecord`: the raw validated output of a committed extraction.
pub(super) const RESULTS: TableDefinition<u64, &[u8]> = TableDefinition::new("results");
/// (tenant, commit ms, sequence) → (): a tenant's committed extractions in commit order,
/// for export. Written by the commit itself; rebuilt on open when its count disagrees.
pub(super) const COMMIT_INDEX: TableDefinition<(&str, u64, u64), ()> = TableDefinition::new("commit_index");

/// batch sequence → `BatchRecord`: one provider batch from submit intent to the end.
pub(super) const BATCHES: TableDefinition<u64, &[u8]> = TableDefinition::new("batches");
/// batch sequence → (): batches the scheduler still has to drive (intent, live job).
pub(super) const OPEN_BATCHES: TableDefinition<u64, ()> = TableDefinition::new("open_batches");
/// sequence → `StagedAnswer`: a provider's raw answer for a `Ready` extraction, awaiting
/// validation and commit.
pub(super) const STAGED: TableDefinition<u64, &[u8]> = TableDefinition::new("staged_results");

/// ledger sequence → `LedgerRecord`: one entry per paid (or replayed) model attempt.
pub(super) const LEDGER: TableDefinition<u64, &[u8]> = TableDefinition::new("ledger");
/// (tenant, at ms, ledger sequence) → (): a tenant's entries over a time range.
pub(super) const LEDGER_BY_TENANT: TableDefinition<(&str, u64, u64), ()> = TableDefinition::new("ledger_by_tenant");
/// (extraction sequence, ledger sequence) → (): the attempts of one extraction.
pub(super) const LEDGER_BY_EXTRACTION: TableDefinition<(u64, u64), ()> = TableDefinition::new("ledger_by_extraction");
/// (tenant, UTC day number) → micro-dollars charged that day: budget checks without scans.
pub(super) const SPEND: TableDefinition<(&str, u64), u64> = TableDefinition::new("spend");

/// outbox sequence → `OutboxRecord`: one event for one sink, from commit to delivery.
pub(super) const OUTBOX: TableDefinition<u64, &[u8]> = TableDefinition::new("outbox");
/// (next attempt ms, outbox sequence) → (): deliveries still to make, in due order.
pub(super) const OUTBOX_DUE: TableDefinition<(u64, u64), ()> = TableDefinition::new("outbox_due");
/// outbox sequence → (): deliveries given up on, for operators to inspect and redeliver.
pub(super) const OUTBOX_DEAD: TableDefinition<u64, ()> = TableDefinition::new("outbox_dead");

/// (endpoint, delivery id) → extraction sequence: a redelivered webhook is answered with
/// the extraction its first delivery created.
pub(super) const WEBHOOK_DELIVERIES: TableDefinition<(&str, &str), u64> = TableDefinition::new("webhook_deliveries");

/// (tenant, source_id, schema name without version, sequence) → (): the revisions of each
/// source in intake order (`store/redb/revisions.rs`); a file without it gets it built when
/// opened.
pub(super) const REVISIONS: TableDefinition<(&str, &str, &str, u64), ()> = TableDefinition::new("revisions");

/// `META` key holding the layout generation of the file.
pub(super) const META_LAYOUT: &str = "layout";
pub(super) const LAYOUT_V1: u64 = 1;
/// `META` key: 1 once `COMMIT_INDEX` holds every committed extraction.
pub(super) const META_COMMIT_INDEX: &str = "commit_index";
/// `META` key: 1 once `PENDING_QUEUE` holds every pending extraction.
pub(super) const META_PENDING_QUEUE: &str = "pending_queue";
/// `META` key: 1 once `TENANT_COUNTS` counts every extraction.
pub(super) const META_TENANT_COUNTS: &str = "tenant_counts";
/// `META` key: 1 once `REVISIONS` holds every extraction.
pub(super) const META_REVISIONS: &str = "revisions";
/// `META` key: the next trial batch sequence (`TRIAL_BATCHES`), never handed out twice.
pub(super) const META_TRIAL_BATCH_SEQ: &str = "trial_batch_seq";
/// `META` key: Unix ms of the last successful online backup.
pub(super) const META_LAST_BACKUP: &str = "last_backup_ms";
/// `META` key prefix: `pause:<provider>` = 1 while an operator has paused submissions.
pub(super) const META_PAUSE_PREFIX: &str = "pause:";
/// `META` key prefix: `sink-disabled:<sink>` = Unix ms when a receiver answered 410 Gone.
pub(super) const META_SINK_DISABLED_PREFIX: &str = "sink-disabled:";

/// The value an index entry points at; its absence means the file is corrupt.
pub(super) fn required(
    value: Option<redb::AccessGuard<'_, &'static [u8]>>,
    kind: &'static str,
    seq: u64,
) -> Result<Vec<u8>, Error> {
    value.map(|v| v.value().to_vec()).ok_or_else(|| Error::Corrupt {
        kind,
        reason: format!("index points at sequence {seq}, which has no {kind} value"),
    })
}
/// sequence → what retention dropped from a committed extraction (`RETIRED_*` bits).
/// `verify` accepts a missing content or raw result only where this says it was dropped.
pub(super) const RETIRED: TableDefinition<u64, u8> = TableDefinition::new("retired");
/// (tenant, UTC day number) → micro-dollars charged that day by ledger entries a tenant
/// erasure removed. `SPEND` keeps its totals, so `SPEND = ledger entries + ERASED_SPEND`.
pub(super) const ERASED_SPEND: TableDefinition<(&str, u64), u64> = TableDefinition::new("erased_spend");
/// (tenant, sequence) → micro-dollars reserved against the tenant's budget for a batch
/// member with the provider (`rules::reserve`); the entry at sequence `RESERVED_TOTAL`
/// is the tenant's sum, so a pick reads one value per budgeted tenant.
pub(super) const RESERVATIONS: TableDefinition<(&str, u64), u64> = TableDefinition::new("reservations");
/// evaluation name → `EvaluationRecord`: a frozen set and its candidates.
pub(super) const EVALUATIONS: TableDefinition<&str, &[u8]> = TableDefinition::new("evaluations");
/// (evaluation, candidate, member index) → `TrialRecord`, written when the trial is sent.
pub(super) const TRIALS: TableDefinition<(&str, &str, u32), &[u8]> = TableDefinition::new("trials");
/// trial batch sequence → `TrialBatchRecord`.
pub(super) const TRIAL_BATCHES: TableDefinition<u64, &[u8]> = TableDefinition::new("trial_batches");
/// The sequence no extraction takes, under which `RESERVATIONS` keeps a tenant's sum.
pub(super) const RESERVED_TOTAL: u64 = u64::MAX;
/// `META` key: the highest extraction sequence a tenant erasure removed. New extractions
/// are numbered above it, so a batch's old member list never names a stranger's work.
pub(super) const META_SEQ_FLOOR: &str = "erased_seq_floor";
