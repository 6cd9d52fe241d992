//! The seam between the store and the layers above it: the reads and writes the service
//! and the engine need, as traits a second backend can implement. The redb [`Store`] is
//! the one implementation today; each method hands its work to the store's own method
//! of the same name, so the traits add no behaviour, only the boundary.
//!
//! Methods return boxed futures rather than using `async fn`, so the traits stay usable
//! as `dyn` objects (a backend chosen at start, not at compile time).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use super::{
    BackupReport, BatchRecord, CancelOutcome, ClaimRequest, CloseReport, DeliveryOutcome, DeliveryReport,
    ErasureReport, Error, ExportFilter, Exported, ExtractionRecord, FindingRecord, Flush, Grant, IngestLine,
    IntakeOutcome, IntentOutcome, IntentRequest, LedgerRecord, Leftover, ListFilter, ListPage, MemberRules,
    NewExtraction, OutboxFilter, OutboxRecord, PostOutcome, PostResult, ProviderDriver, ReadyItem, ResultRecord,
    RetentionPolicy, RetentionStep, RetryFilter, RetryOutcome, StageReport, StateCount, Store,
};
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::cursor::CursorKey;
use crate::domain::identity::ExtractionId;

/// What every seam method returns: the store's answer, once it is durable for a write.
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send + 'a>>;

/// Visits ledger entries one at a time, so a report over a long period needs no list.
pub type LedgerVisitor = Box<dyn FnMut(LedgerRecord) + Send + 'static>;

/// Takes exported extractions one at a time on a blocking thread (it may block to pass
/// them on); `None` marks the end of a complete walk. Returning `false` stops the walk.
pub type ExportSink = Box<dyn FnMut(Option<Exported>) -> bool + Send + 'static>;

/// Declares a seam trait and implements it for [`Store`] by calling the store's own
/// method of the same name with the same arguments.
macro_rules! seam {
    ($(#[$meta:meta])* pub trait $name:ident {
        $( $(#[$fmeta:meta])* fn $method:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty; )*
    }) => {
        $(#[$meta])*
        pub trait $name: Send + Sync + std::fmt::Debug {
            $( $(#[$fmeta])* fn $method(&self $(, $arg: $ty)*) -> StoreFuture<'_, $ret>; )*
        }

        impl $name for Store {
            $( fn $method(&self $(, $arg: $ty)*) -> StoreFuture<'_, $ret> {
                Box::pin(Store::$method(self $(, $arg)*))
            } )*
        }
    };
}

seam! {
    /// Intake, reads of extractions, and workers' claims and results (the service).
    pub trait Extractions {
        /// Inserts unless the identity exists; a known identity is answered without a write.
        fn intake(&self, new: NewExtraction) -> IntakeOutcome;
        /// Intake keyed by a webhook delivery id too, in one transaction.
        fn intake_delivery(&self, endpoint: String, delivery_id: String, new: NewExtraction) -> DeliveryOutcome;
        /// The extraction a webhook delivery created, if it was seen.
        fn delivered(&self, endpoint: String, delivery_id: String) -> Option<ExtractionRecord>;
        fn get(&self, id: ExtractionId) -> Option<ExtractionRecord>;
        fn get_by_seq(&self, seq: u64) -> Option<ExtractionRecord>;
        fn list(&self, filter: ListFilter) -> ListPage;
        fn findings(&self, id: ExtractionId) -> Option<Vec<FindingRecord>>;
        fn findings_page(&self, id: ExtractionId, after: Option<[u8; 32]>, limit: usize)
            -> Option<(Vec<FindingRecord>, bool)>;
        /// The raw output a committed extraction was committed with.
        fn result(&self, id: ExtractionId) -> Option<ResultRecord>;
        /// How many extractions are in each state, and since when the oldest waits.
        fn counts_by_state(&self) -> Vec<StateCount>;
        /// Hands out leases with fencing tokens.
        fn claim(&self, request: ClaimRequest) -> Vec<Grant>;
        /// Commits (or fails) an output under a lease or a batch's authority, re-checked
        /// in the same transaction as the findings, raw result, ledger and outbox writes.
        fn post_result(&self, post: PostResult) -> PostOutcome;
        fn retry(&self, id: ExtractionId) -> RetryOutcome;
        /// Moves a pending, claimed, submitted or failed extraction to `Cancelled`.
        fn cancel(&self, id: ExtractionId) -> CancelOutcome;
        /// Moves up to `limit` matching failed extractions back to pending, in bounded
        /// transactions; returns how many moved.
        fn retry_failed(&self, filter: RetryFilter, limit: u64) -> u64;
        /// A tenant's committed extractions in commit order, from one snapshot.
        fn export_to(&self, filter: ExportFilter, sink: ExportSink) -> ();
        /// What retention dropped of each of `seqs` (`RETIRED_*` bits; absent: nothing).
        fn retired(&self, seqs: Vec<u64>) -> HashMap<u64, u8>;
    }
}

seam! {
    /// Provider batches: intents, job ids, polling schedule, staged answers (the scheduler).
    pub trait Batches {
        /// Commits a submit intent (members → `Submitted`, a batch key) before any call.
        fn create_intent(&self, request: IntentRequest) -> IntentOutcome;
        /// Releases members past `keep` from an intent the provider found too large.
        fn shrink_intent(&self, batch: u64, keep: usize) -> u64;
        /// Persists the provider's job id before anything else is done with it.
        fn record_job(&self, batch: u64, job_id: String, next_poll_at_ms: u64) -> BatchRecord;
        fn open_batches(&self) -> Vec<BatchRecord>;
        fn batch_members(&self, batch: u64) -> Vec<BatchMember>;
        fn stage_results(&self, batch: u64, lines: Vec<(ExtractionId, LineResult)>, rules: MemberRules)
            -> StageReport;
        /// Result lines with the engine's verdicts: judged answers commit in the same
        /// transaction, flushed to disk now or with a later commit as `flush` says.
        fn ingest_results(&self, batch: u64, lines: Vec<IngestLine>, rules: MemberRules, flush: Flush) -> StageReport;
        /// Returns once every write committed so far, flushed or not, is on disk.
        fn flush(&self) -> ();
        fn ready_items(&self, provider: String, limit: usize) -> Vec<ReadyItem>;
        fn close_batch(&self, batch: u64, outcome: String, leftover: Leftover, rules: MemberRules) -> CloseReport;
        fn reschedule_batch(&self, batch: u64, next_action_at_ms: u64, note: Option<String>, count_failure: bool)
            -> ();
        fn note_not_found(&self, batch: u64, since_ms: u64, next_action_at_ms: u64, note: String) -> ();
        /// Job ids recorded for `provider` since a time: what an orphan lookup may skip.
        fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Vec<String>;
        fn provider_paused(&self, provider: String) -> bool;
        fn set_provider_paused(&self, provider: String, paused: bool) -> ();
    }
}

seam! {
    /// The ledger read back: budgets, cost reports, one extraction's attempts.
    pub trait Ledger {
        /// Spend per tenant from a UTC day on, from the per-day totals.
        fn spend_since(&self, tenants: Vec<String>, from_day: u64) -> Vec<(String, u64)>;
        fn extraction_ledger(&self, id: ExtractionId) -> Option<Vec<LedgerRecord>>;
        /// Every entry of `tenant` in `[from_ms, to_ms)`, oldest first, to `visit`.
        fn visit_ledger(&self, tenant: String, from_ms: u64, to_ms: u64, visit: LedgerVisitor) -> ();
        /// What erased ledger entries of `tenant` had charged in `[from_ms, to_ms)`.
        fn erased_spend(&self, tenant: String, from_ms: u64, to_ms: u64) -> u64;
    }
}

seam! {
    /// Outbox events and their delivery (the deliverer and the operator's calls).
    pub trait Outbox {
        fn due_events(&self, now_ms: u64, limit: usize) -> Vec<OutboxRecord>;
        fn record_delivery(&self, seq: u64, report: DeliveryReport) -> Option<OutboxRecord>;
        fn next_event_due(&self) -> Option<u64>;
        fn list_outbox(&self, filter: OutboxFilter, after: u64, limit: usize) -> Vec<OutboxRecord>;
        /// (pending, dead, oldest pending's due time).
        fn outbox_counts(&self) -> (u64, u64, Option<u64>);
        fn redeliver(&self, seq: u64) -> Option<OutboxRecord>;
        fn set_sink_disabled(&self, sink: String, disabled: bool) -> ();
        fn sink_disabled(&self, sink: String) -> bool;
    }
}

seam! {
    /// Keeping the store itself: backups and the writer's pulse.
    pub trait Upkeep {
        /// A consistent copy while serving.
        fn backup(&self, dest: PathBuf) -> BackupReport;
        fn last_backup_ms(&self) -> Option<u64>;
        /// Answers once the writer has committed an empty job: it is alive.
        fn ping_writer(&self) -> ();
        /// Looks at up to `scan` committed extractions after `after` and drops what
        /// `policy` no longer keeps.
        fn retention_step(&self, policy: RetentionPolicy, after: u64, scan: usize) -> RetentionStep;
        /// Erases everything of a tenant but its spend totals, in bounded transactions.
        fn erase_tenant(&self, tenant: String) -> ErasureReport;
        /// The instance driving each of `providers`' batches now, if one is.
        fn provider_drivers(&self, providers: Vec<String>) -> Vec<ProviderDriver>;
    }
}

/// Everything the layers above need from a store backend.
pub trait Backend: Extractions + Batches + Ledger + Outbox + Upkeep {
    /// The key list cursors are sealed with; the same for every reader of this store.
    fn cursor_key(&self) -> &CursorKey;
    /// The size of the store's file, where it has one.
    fn file_size(&self) -> Option<u64>;
    /// `redb` or `postgres`, as `[store] backend` names it.
    fn backend_name(&self) -> &'static str;
    /// Changes with every commit, where this process sees every commit (redb: the file
    /// is locked to one process); `None` where other processes write too.
    fn commits(&self) -> Option<tokio::sync::watch::Receiver<u64>>;
}

impl Backend for Store {
    fn cursor_key(&self) -> &CursorKey {
        Store::cursor_key(self)
    }

    fn file_size(&self) -> Option<u64> {
        Store::file_size(self)
    }

    fn backend_name(&self) -> &'static str {
        "redb"
    }

    fn commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(Store::commits(self))
    }
}

/// The store as the service and the engine hold it.
pub type SharedStore = Arc<dyn Backend>;
