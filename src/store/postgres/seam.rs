//! The seam traits for [`PgStore`]. What PostgreSQL never does through commitpoint
//! (`backup`) answers a typed `NotOnBackend` error naming the operation and what to use
//! instead, never a panic or a silent nothing.

use std::collections::HashMap;
use std::path::PathBuf;

use super::PgStore;
use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::cursor::CursorKey;
use crate::domain::identity::ExtractionId;
use crate::store::seam::{
    Backend, Batches, ExportSink, Extractions, Ledger, LedgerVisitor, Outbox, StoreFuture, Upkeep,
};
use crate::store::{
    BackupReport, BatchRecord, CancelOutcome, ClaimRequest, CloseReport, DeliveryOutcome, DeliveryReport,
    ErasureReport, Error, ExportFilter, ExtractionRecord, FindingRecord, Flush, Grant, IngestLine, IntakeOutcome,
    IntentOutcome, IntentRequest, LedgerRecord, Leftover, ListFilter, ListPage, MemberRules, NewExtraction,
    OutboxFilter, OutboxRecord, PostOutcome, PostResult, ProviderDriver, ReadyItem, ResultRecord, RetentionPolicy,
    RetentionStep, RetryFilter, RetryOutcome, StageReport, StateCount,
};

/// Implements seam methods by delegating to `PgStore`'s own method of the same name.
macro_rules! pg_seam {
    (impl $trait:ident {
        $( fn $method:ident(&self $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty = $how:ident; )*
    }) => {
        impl $trait for PgStore {
            $( pg_seam!(@method $how $method ($($arg: $ty),*) -> $ret); )*
        }
    };
    (@method delegate $method:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        fn $method(&self $(, $arg: $ty)*) -> StoreFuture<'_, $ret> {
            Box::pin(PgStore::$method(self $(, $arg)*))
        }
    };
}

pg_seam! {
    impl Extractions {
        fn intake(&self, new: NewExtraction) -> IntakeOutcome = delegate;
        fn intake_delivery(&self, endpoint: String, delivery_id: String, new: NewExtraction) -> DeliveryOutcome = delegate;
        fn delivered(&self, endpoint: String, delivery_id: String) -> Option<ExtractionRecord> = delegate;
        fn get(&self, id: ExtractionId) -> Option<ExtractionRecord> = delegate;
        fn get_by_seq(&self, seq: u64) -> Option<ExtractionRecord> = delegate;
        fn list(&self, filter: ListFilter) -> ListPage = delegate;
        fn findings(&self, id: ExtractionId) -> Option<Vec<FindingRecord>> = delegate;
        fn findings_page(&self, id: ExtractionId, after: Option<[u8; 32]>, limit: usize)
            -> Option<(Vec<FindingRecord>, bool)> = delegate;
        fn result(&self, id: ExtractionId) -> Option<ResultRecord> = delegate;
        fn counts_by_state(&self) -> Vec<StateCount> = delegate;
        fn claim(&self, request: ClaimRequest) -> Vec<Grant> = delegate;
        fn post_result(&self, post: PostResult) -> PostOutcome = delegate;
        fn retry(&self, id: ExtractionId) -> RetryOutcome = delegate;
        fn cancel(&self, id: ExtractionId) -> CancelOutcome = delegate;
        fn retry_failed(&self, filter: RetryFilter, limit: u64) -> u64 = delegate;
        fn export_to(&self, filter: ExportFilter, sink: ExportSink) -> () = delegate;
        fn retired(&self, seqs: Vec<u64>) -> HashMap<u64, u8> = delegate;
    }
}

pg_seam! {
    impl Batches {
        fn create_intent(&self, request: IntentRequest) -> IntentOutcome = delegate;
        fn shrink_intent(&self, batch: u64, keep: usize) -> u64 = delegate;
        fn record_job(&self, batch: u64, job_id: String, next_poll_at_ms: u64) -> BatchRecord = delegate;
        fn open_batches(&self) -> Vec<BatchRecord> = delegate;
        fn batch_members(&self, batch: u64) -> Vec<BatchMember> = delegate;
        fn stage_results(&self, batch: u64, lines: Vec<(ExtractionId, LineResult)>, rules: MemberRules)
            -> StageReport = delegate;
        fn ingest_results(&self, batch: u64, lines: Vec<IngestLine>, rules: MemberRules, flush: Flush) -> StageReport = delegate;
        fn flush(&self) -> () = delegate;
        fn ready_items(&self, provider: String, limit: usize) -> Vec<ReadyItem> = delegate;
        fn close_batch(&self, batch: u64, outcome: String, leftover: Leftover, rules: MemberRules)
            -> CloseReport = delegate;
        fn reschedule_batch(&self, batch: u64, next_action_at_ms: u64, note: Option<String>, count_failure: bool)
            -> () = delegate;
        fn note_not_found(&self, batch: u64, since_ms: u64, next_action_at_ms: u64, note: String) -> () = delegate;
        fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Vec<String> = delegate;
        fn provider_paused(&self, provider: String) -> bool = delegate;
        fn set_provider_paused(&self, provider: String, paused: bool) -> () = delegate;
    }
}

pg_seam! {
    impl Ledger {
        fn spend_since(&self, tenants: Vec<String>, from_day: u64) -> Vec<(String, u64)> = delegate;
        fn extraction_ledger(&self, id: ExtractionId) -> Option<Vec<LedgerRecord>> = delegate;
        fn visit_ledger(&self, tenant: String, from_ms: u64, to_ms: u64, visit: LedgerVisitor) -> () = delegate;
        fn erased_spend(&self, tenant: String, from_ms: u64, to_ms: u64) -> u64 = delegate;
    }
}

pg_seam! {
    impl Outbox {
        fn due_events(&self, now_ms: u64, limit: usize) -> Vec<OutboxRecord> = delegate;
        fn record_delivery(&self, seq: u64, report: DeliveryReport) -> Option<OutboxRecord> = delegate;
        fn next_event_due(&self) -> Option<u64> = delegate;
        fn list_outbox(&self, filter: OutboxFilter, after: u64, limit: usize) -> Vec<OutboxRecord> = delegate;
        fn outbox_counts(&self) -> (u64, u64, Option<u64>) = delegate;
        fn redeliver(&self, seq: u64) -> Option<OutboxRecord> = delegate;
        fn set_sink_disabled(&self, sink: String, disabled: bool) -> () = delegate;
        fn sink_disabled(&self, sink: String) -> bool = delegate;
    }
}

pg_seam! {
    impl Upkeep {
        fn backup(&self, dest: PathBuf) -> BackupReport = delegate;
        fn last_backup_ms(&self) -> Option<u64> = delegate;
        fn ping_writer(&self) -> () = delegate;
        fn retention_step(&self, policy: RetentionPolicy, after: u64, scan: usize) -> RetentionStep = delegate;
        fn erase_tenant(&self, tenant: String) -> ErasureReport = delegate;
        fn provider_drivers(&self, providers: Vec<String>) -> Vec<ProviderDriver> = delegate;
    }
}

impl Backend for PgStore {
    fn cursor_key(&self) -> &CursorKey {
        PgStore::cursor_key(self)
    }

    fn file_size(&self) -> Option<u64> {
        None
    }

    fn backend_name(&self) -> &'static str {
        "postgres"
    }

    /// Other instances commit to the same database unseen.
    fn commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

impl PgStore {
    /// PostgreSQL is backed up with its own tools; commitpoint does not copy it.
    async fn backup(&self, _dest: PathBuf) -> Result<BackupReport, Error> {
        Err(Error::NotOnBackend {
            operation: "backup",
            backend: "postgres",
            hint: "back the database up with pg_dump or pg_basebackup (docs/SCALE-OUT.md)",
        })
    }

    /// commitpoint takes no backups of a PostgreSQL store, so it knows of none.
    async fn last_backup_ms(&self) -> Result<Option<u64>, Error> {
        Ok(None)
    }
}
