//! The commit point's storage: one seam, two backends.
//!
//! What is neutral lives here: the seam traits and every type they pass (`seam/`), the
//! stored records and their codec (a format byte on every value), the policies the store
//! is handed, and the rules both backends decide by (`rules/`). `redb/` is the default
//! backend and the only code that imports redb; `postgres/` is the second, the only code
//! that speaks SQL. A reader finds one backend's code in the other by the same file name.

pub(crate) mod codec;
mod error;
pub mod evaluation;
mod evaluation_steps;
mod migrate_compare;
mod policies;
pub mod postgres;
mod records;
pub mod redb;
mod rules;
pub mod seam;
mod staged;

pub use self::redb::{
    CompactReport, FILE_NAME, MigrateError, MigrateProgress, MigrateReport, Store, WriterGuard, compact_file,
    dump_file, migrate_store, verify_file,
};
pub use error::{Error, chain as error_chain};
pub use migrate_compare::Comparison;
pub use policies::{Policies, Pricing, ProviderReportedOnly};
#[cfg(feature = "fuzzing")] // only the fuzz entry points decode it from outside the store
pub(crate) use records::StoredContent;
pub use records::{
    BatchRecord, BatchState, ChargeKind, CostSource, DeliveryState, DiffCounts, ExtractionRecord, Fence, FindingRecord,
    LedgerRecord, NewExtraction, OutboxKind, OutboxRecord, ResultRecord,
};
pub use rules::fair::{BudgetHold, DEFAULT_QUANTUM_BYTES, Fairness, Priority, TenantShare};
pub use rules::intent::{IntentOutcome, IntentRequest, Minimum, WorkFilter};
pub use rules::member::MemberRules;
pub use rules::reserve::MemberEstimate;
pub use rules::retention::{RETIRED_CONTENT, RETIRED_RAW_RESULT, RetentionPolicy, RetentionStep};
pub use rules::revision::{FindingsDiff, diff as findings_diff, schema_family};
pub use rules::verify::Report;
pub use seam::{
    Authority, Backend, BackupReport, CancelOutcome, Charge, ClaimRequest, CloseReport, DeliveryOutcome,
    DeliveryReport, DriverTerm, Drivers, EncodedFinding, ErasureReport, EvaluationCreated, ExportFilter, Exported,
    ExtendOutcome, Flush, Grant, IngestLine, IntakeOutcome, Judged, LeaseExtension, Leftover, ListFilter, ListPage,
    NewEvaluation, OutboxFilter, PostOutcome, PostResult, Promotion, ProviderDriver, RETRY_CHUNK, ReadyItem,
    RetryFilter, RetryOutcome, Selection, SharedStore, SourceContent, StageReport, StateCount, Submission, TenantDepth,
    TrialAnswer, TrialsWritten, WorkScope, store_day_ms, this_instance,
};
pub use staged::StagedAnswer;
