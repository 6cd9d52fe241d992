//! The values the store persists. Each implements `Versioned`; changing a field means a
//! new version, a migration in the codec, and a new golden fixture.

use serde::{Deserialize, Serialize};

use crate::domain::batch::{PreviousAttempt, Usage};
use crate::domain::identity::{ExtractionId, FindingKey, SourceHash};
use crate::domain::lifecycle::{FailureClass, State};
use crate::domain::names::{BatchKey, LeaseToken, ProviderName};
use crate::store::codec::{Versioned, decode_body};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtractionRecord {
    pub id: ExtractionId,
    pub seq: u64,
    pub tenant: String,
    pub source_id: String,
    pub source_hash: SourceHash,
    pub schema: String,
    /// Caller metadata as compact JSON text (bincode cannot carry `serde_json::Value`).
    pub metadata_json: Option<String>,
    pub state: State,
    /// 1 at intake, +1 for every retry of a failed extraction.
    pub attempt: u32,
    /// How many leases have been handed out for this extraction.
    pub claims: u32,
    pub content_bytes: u64,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Provider attempts that ended without a usable answer and went back to the queue,
    /// since intake or the last operator retry. Once `requeues + 1` reaches the configured
    /// `max_attempts`, the next would-be requeue fails the extraction `attempts_exhausted`.
    pub requeues: u32,
    /// The output token budget providers are asked for (`max_completion_tokens`,
    /// `max_tokens`); `None` is the provider's configured default. Raised after a truncated
    /// answer and kept from then on: it only grows.
    pub output_budget: Option<u32>,
    /// The one automatic retry of a truncated answer was used (since intake or the last
    /// operator retry): a second truncation fails the extraction `truncated`.
    pub truncation_retried: bool,
    /// Answers that failed validation or grounding and were asked again with their issues,
    /// since intake or the last operator retry; at the schema's (or provider's) re-ask
    /// limit the next invalid answer fails the extraction `validation`.
    pub reasks: u32,
    /// The last refused answer and its issues while a re-ask is pending, shown to the model
    /// (or a worker's claim) when it is asked again; cleared when an answer commits.
    pub previous_attempt: Option<PreviousAttempt>,
    /// The newer revision of the same (tenant, source_id, schema name) that committed
    /// after this one did: this one stays committed, it is no longer current.
    pub superseded_by: Option<ExtractionId>,
    /// Why earlier attempts failed, oldest first, kept when an operator retries a failed
    /// extraction (the state itself then forgets): the last `MAX_PAST_FAILURES`.
    pub past_failures: Vec<PastFailure>,
}

/// One failure an operator retried past.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastFailure {
    pub attempt: u32,
    pub class: FailureClass,
    pub reason: String,
    pub failed_at_ms: u64,
}

/// Past failures a record keeps; an extraction retried more often than this drops the
/// oldest, so a record cannot grow without bound.
pub(crate) const MAX_PAST_FAILURES: usize = 16;

impl Versioned for ExtractionRecord {
    const KIND: &'static str = "extraction";
    /// 3: `reasks`, `previous_attempt` and `superseded_by`. 4: `past_failures`.
    const VERSION: u8 = 4;

    fn upgrade(version: u8, body: &[u8]) -> Option<Result<Self, String>> {
        match version {
            1 => Some(decode_body::<legacy::ExtractionRecordV1>(body).map(Into::into)),
            2 => Some(decode_body::<legacy::ExtractionRecordV2>(body).map(Into::into)),
            3 => Some(decode_body::<legacy::ExtractionRecordV3>(body).map(Into::into)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredContent {
    pub text: String,
}

impl Versioned for StoredContent {
    const KIND: &'static str = "content";
    const VERSION: u8 = 1;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FindingRecord {
    pub key: FindingKey,
    /// Canonical JSON of the identifying fields; `verify` recomputes the key from it.
    pub canonical_identity: String,
    pub body_json: String,
    pub committed_at_ms: u64,
}

impl Versioned for FindingRecord {
    const KIND: &'static str = "finding";
    const VERSION: u8 = 1;
}

/// The authority a result was committed under: a worker's lease or a provider batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fence {
    Lease(LeaseToken),
    Batch(BatchKey),
    /// Promoted from an evaluation's trial (its name).
    Evaluation(String),
}

impl Fence {
    pub fn as_str(&self) -> &str {
        match self {
            Fence::Lease(token) => token.as_str(),
            Fence::Batch(key) => key.as_str(),
            Fence::Evaluation(name) => name.as_str(),
        }
    }
}

/// The raw output a committed extraction was committed with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultRecord {
    pub output_json: String,
    /// The worker, or the provider (by its table name), that produced the output.
    pub producer: String,
    pub fence: Fence,
    pub usage: Option<Usage>,
    /// From the call (or batch submission) to the answer, where known.
    pub latency_ms: Option<u64>,
    pub received_at_ms: u64,
}

impl Versioned for ResultRecord {
    const KIND: &'static str = "result";
    /// 3: `producer` and a typed `fence` instead of `worker` and a `lease_token` that held
    /// a batch key when a provider's answer was committed.
    const VERSION: u8 = 3;

    fn upgrade(version: u8, body: &[u8]) -> Option<Result<Self, String>> {
        match version {
            1 => Some(decode_body::<legacy::ResultRecordV1>(body).map(|v1| legacy::ResultRecordV2::from(v1).into())),
            2 => Some(decode_body::<legacy::ResultRecordV2>(body).map(Into::into)),
            _ => None,
        }
    }
}

/// Shapes earlier format versions wrote, kept only to read old files.
mod legacy {
    use serde::Deserialize;

    use crate::domain::batch::PreviousAttempt;
    use crate::domain::identity::{ExtractionId, SourceHash};
    use crate::domain::lifecycle::State;

    /// Before the attempt cap and truncation retries (format 1).
    #[derive(Debug, Deserialize)]
    pub struct ExtractionRecordV1 {
        id: ExtractionId,
        seq: u64,
        tenant: String,
        source_id: String,
        source_hash: SourceHash,
        schema: String,
        metadata_json: Option<String>,
        state: State,
        attempt: u32,
        claims: u32,
        content_bytes: u64,
        created_at_ms: u64,
        updated_at_ms: u64,
    }

    impl From<ExtractionRecordV1> for crate::store::ExtractionRecord {
        /// An old record has used none of its requeues and asks for the default budget.
        fn from(v1: ExtractionRecordV1) -> Self {
            Self {
                id: v1.id,
                seq: v1.seq,
                tenant: v1.tenant,
                source_id: v1.source_id,
                source_hash: v1.source_hash,
                schema: v1.schema,
                metadata_json: v1.metadata_json,
                state: v1.state,
                attempt: v1.attempt,
                claims: v1.claims,
                content_bytes: v1.content_bytes,
                created_at_ms: v1.created_at_ms,
                updated_at_ms: v1.updated_at_ms,
                requeues: 0,
                output_budget: None,
                truncation_retried: false,
                reasks: 0,
                previous_attempt: None,
                superseded_by: None,
                past_failures: Vec::new(),
            }
        }
    }

    /// Format 2: before re-asks and revisions.
    #[derive(Debug, Deserialize)]
    pub struct ExtractionRecordV2 {
        id: ExtractionId,
        seq: u64,
        tenant: String,
        source_id: String,
        source_hash: SourceHash,
        schema: String,
        metadata_json: Option<String>,
        state: State,
        attempt: u32,
        claims: u32,
        content_bytes: u64,
        created_at_ms: u64,
        updated_at_ms: u64,
        requeues: u32,
        output_budget: Option<u32>,
        truncation_retried: bool,
    }

    impl From<ExtractionRecordV2> for crate::store::ExtractionRecord {
        /// An old record has used no re-asks and is nobody's older revision.
        fn from(v2: ExtractionRecordV2) -> Self {
            Self {
                id: v2.id,
                seq: v2.seq,
                tenant: v2.tenant,
                source_id: v2.source_id,
                source_hash: v2.source_hash,
                schema: v2.schema,
                metadata_json: v2.metadata_json,
                state: v2.state,
                attempt: v2.attempt,
                claims: v2.claims,
                content_bytes: v2.content_bytes,
                created_at_ms: v2.created_at_ms,
                updated_at_ms: v2.updated_at_ms,
                requeues: v2.requeues,
                output_budget: v2.output_budget,
                truncation_retried: v2.truncation_retried,
                reasks: 0,
                previous_attempt: None,
                superseded_by: None,
                past_failures: Vec::new(),
            }
        }
    }

    /// Format 3: before past failures were kept across retries.
    #[derive(Debug, Deserialize)]
    pub struct ExtractionRecordV3 {
        id: ExtractionId,
        seq: u64,
        tenant: String,
        source_id: String,
        source_hash: SourceHash,
        schema: String,
        metadata_json: Option<String>,
        state: State,
        attempt: u32,
        claims: u32,
        content_bytes: u64,
        created_at_ms: u64,
        updated_at_ms: u64,
        requeues: u32,
        output_budget: Option<u32>,
        truncation_retried: bool,
        reasks: u32,
        previous_attempt: Option<PreviousAttempt>,
        superseded_by: Option<ExtractionId>,
    }

    impl From<ExtractionRecordV3> for crate::store::ExtractionRecord {
        /// Failures retried past before format 4 were not kept.
        fn from(v3: ExtractionRecordV3) -> Self {
            Self {
                id: v3.id,
                seq: v3.seq,
                tenant: v3.tenant,
                source_id: v3.source_id,
                source_hash: v3.source_hash,
                schema: v3.schema,
                metadata_json: v3.metadata_json,
                state: v3.state,
                attempt: v3.attempt,
                claims: v3.claims,
                content_bytes: v3.content_bytes,
                created_at_ms: v3.created_at_ms,
                updated_at_ms: v3.updated_at_ms,
                requeues: v3.requeues,
                output_budget: v3.output_budget,
                truncation_retried: v3.truncation_retried,
                reasks: v3.reasks,
                previous_attempt: v3.previous_attempt,
                superseded_by: v3.superseded_by,
                past_failures: Vec::new(),
            }
        }
    }

    #[derive(Debug, Deserialize)]
    pub(super) struct UsageV1 {
        model: String,
        input_tokens: u64,
        output_tokens: u64,
    }

    #[derive(Debug, Deserialize)]
    pub struct ResultRecordV1 {
        output_json: String,
        worker: String,
        lease_token: String,
        usage: Option<UsageV1>,
        received_at_ms: u64,
    }

    #[derive(Debug, Deserialize)]
    #[cfg_attr(test, derive(serde::Serialize))]
    pub struct BatchRecordV1 {
        pub seq: u64,
        pub batch_key: String,
        pub provider: String,
        pub schema: String,
        pub members: Vec<u64>,
        pub state: crate::store::BatchState,
        pub next_action_at_ms: u64,
        pub failures: u32,
        pub last_error: Option<String>,
        pub created_at_ms: u64,
        pub updated_at_ms: u64,
    }

    impl From<BatchRecordV1> for crate::store::BatchRecord {
        fn from(v1: BatchRecordV1) -> Self {
            Self {
                seq: v1.seq,
                batch_key: v1.batch_key.into(),
                provider: v1.provider.into(),
                schema: v1.schema,
                members: v1.members,
                state: v1.state,
                next_action_at_ms: v1.next_action_at_ms,
                failures: v1.failures,
                last_error: v1.last_error,
                created_at_ms: v1.created_at_ms,
                updated_at_ms: v1.updated_at_ms,
                not_found_since_ms: None,
            }
        }
    }

    /// Format 2: the fence was a string, a lease token or (for a provider's answer) a
    /// batch key.
    #[derive(Debug, Deserialize)]
    #[cfg_attr(test, derive(serde::Serialize))]
    pub struct ResultRecordV2 {
        pub output_json: String,
        pub worker: String,
        pub lease_token: String,
        pub usage: Option<crate::domain::batch::Usage>,
        pub latency_ms: Option<u64>,
        pub received_at_ms: u64,
    }

    impl From<ResultRecordV2> for crate::store::ResultRecord {
        /// Batch keys are the only fences made by `identity::batch_key` (`cpb-…`); lease
        /// tokens start `lt-`.
        fn from(v2: ResultRecordV2) -> Self {
            let fence = if v2.lease_token.starts_with("cpb-") {
                crate::store::Fence::Batch(v2.lease_token.into())
            } else {
                crate::store::Fence::Lease(v2.lease_token.into())
            };
            Self {
                output_json: v2.output_json,
                producer: v2.worker,
                fence,
                usage: v2.usage,
                latency_ms: v2.latency_ms,
                received_at_ms: v2.received_at_ms,
            }
        }
    }

    impl From<ResultRecordV1> for ResultRecordV2 {
        fn from(v1: ResultRecordV1) -> Self {
            Self {
                output_json: v1.output_json,
                worker: v1.worker,
                lease_token: v1.lease_token,
                usage: v1.usage.map(|u| crate::domain::batch::Usage {
                    model: u.model,
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                    ..Default::default()
                }),
                latency_ms: None,
                received_at_ms: v1.received_at_ms,
            }
        }
    }
}

/// Where a provider batch stands. Its members' states say the same thing per extraction;
/// this record is what the scheduler drives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchState {
    /// The submit intent is durable; the provider may or may not have the job.
    Intent,
    /// The provider accepted the batch under this job id.
    Submitted { job_id: String },
    /// Results were ingested (or the batch was given up); nothing left to drive.
    Closed { job_id: Option<String>, outcome: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchRecord {
    pub seq: u64,
    /// Derived from (provider, schema, intent sequence, members and their attempts): how the job is
    /// found again at the provider after a crash.
    pub batch_key: BatchKey,
    pub provider: ProviderName,
    pub schema: String,
    /// Extraction sequence numbers, in submit order.
    pub members: Vec<u64>,
    pub state: BatchState,
    /// When the scheduler should next act on it (submit retry or poll), persisted so that
    /// polling resumes on time after a restart.
    pub next_action_at_ms: u64,
    /// Consecutive failed provider calls, for backoff.
    pub failures: u32,
    pub last_error: Option<String>,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Since when polls of its job have answered 404 (cleared once a poll finds the job).
    /// Persisted so that a restart neither resets the window after which the job is
    /// declared gone nor forgets it (v2).
    pub not_found_since_ms: Option<u64>,
}

impl Versioned for BatchRecord {
    const KIND: &'static str = "batch";
    const VERSION: u8 = 2;

    fn upgrade(version: u8, body: &[u8]) -> Option<Result<Self, String>> {
        (version == 1).then(|| decode_body::<legacy::BatchRecordV1>(body).map(Into::into))
    }
}

/// How a ledger entry counts. Replays are counted but never charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChargeKind {
    /// A paid attempt whose answer was committed (or refused as stale).
    Fresh,
    /// The same answer seen again: a re-posted result, a re-fetched result file.
    Replay,
    /// A paid attempt whose answer failed schema validation.
    FailedValidation,
    /// A paid answer that could not be used whatever it said: cut off at its output budget
    /// (truncated) or declined by the model (refused). Never committed.
    Unusable,
    /// A trial of an evaluation (docs/EVALUATIONS.md): paid, never committed by itself; a
    /// promotion commits it later without a second entry.
    Evaluation,
}

/// Where an entry's cost came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostSource {
    /// Computed from the configured price table.
    PriceTable,
    /// Reported by the provider with the answer.
    Provider,
    /// No price known for this provider and model: tokens are kept, cost is zero.
    Unpriced,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRecord {
    pub seq: u64,
    pub tenant: String,
    pub extraction_id: ExtractionId,
    pub extraction_seq: u64,
    /// The extraction's attempt number the call belonged to.
    pub attempt: u32,
    pub kind: ChargeKind,
    pub provider: String,
    pub job_id: Option<String>,
    pub usage: Usage,
    pub latency_ms: Option<u64>,
    /// Charged micro-dollars: zero for replays.
    pub cost_micros: u64,
    /// What the call cost (or would have cost, for a replay) before the replay rule.
    pub list_cost_micros: u64,
    pub cost_source: CostSource,
    pub at_ms: u64,
}

impl Versioned for LedgerRecord {
    const KIND: &'static str = "ledger";
    const VERSION: u8 = 1;
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum OutboxKind {
    Committed,
    Failed {
        class: crate::domain::lifecycle::FailureClass,
        reason: String,
    },
    /// Appended: the encodings of the kinds before it do not move.
    Cancelled,
    /// Appended: `extraction.committed` of a revision that superseded the source's
    /// previous committed revision, with the findings diff against it (`None` across
    /// schema versions). Its event id is a committed event's.
    Revision {
        supersedes: ExtractionId,
        diff: Option<DiffCounts>,
    },
    /// Appended: `extraction.superseded`, about the revision a newer one superseded.
    Superseded {
        by: ExtractionId,
    },
}

/// How many findings a revision introduced, resolved and kept against the one before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffCounts {
    pub introduced: u64,
    pub resolved: u64,
    pub unchanged: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryState {
    Pending,
    Delivered { at_ms: u64, status: u16 },
    Dead { reason: String },
}

/// One event for one sink. `event_id` is the same for every sink and every attempt: it
/// is the `webhook-id` receivers deduplicate on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxRecord {
    pub seq: u64,
    pub event_id: String,
    pub sink: String,
    pub kind: OutboxKind,
    pub extraction_seq: u64,
    pub extraction_id: ExtractionId,
    pub tenant: String,
    pub attempt: u32,
    pub state: DeliveryState,
    pub deliveries: u32,
    pub next_attempt_at_ms: u64,
    pub last_error: Option<String>,
    pub created_at_ms: u64,
}

impl Versioned for OutboxRecord {
    const KIND: &'static str = "outbox";
    const VERSION: u8 = 1;
}

impl OutboxRecord {
    /// A new event of `kind` about `record` for `sink`: undelivered and due at once.
    pub(crate) fn due_now(
        seq: u64,
        event_id: String,
        sink: String,
        kind: OutboxKind,
        record: &ExtractionRecord,
        now_ms: u64,
    ) -> Self {
        OutboxRecord {
            seq,
            event_id,
            sink,
            kind,
            extraction_seq: record.seq,
            extraction_id: record.id,
            tenant: record.tenant.clone(),
            attempt: record.attempt,
            state: DeliveryState::Pending,
            deliveries: 0,
            next_attempt_at_ms: now_ms,
            last_error: None,
            created_at_ms: now_ms,
        }
    }
}

/// What intake asks the store to create.
#[derive(Debug, Clone)]
pub struct NewExtraction {
    pub id: ExtractionId,
    pub tenant: String,
    pub source_id: String,
    pub source_hash: SourceHash,
    pub schema: String,
    pub metadata_json: Option<String>,
    pub content: String,
}

impl NewExtraction {
    /// The pending first attempt this intake creates, numbered `seq`; its content is
    /// stored beside it, so only its size is kept here.
    pub(crate) fn pending(self, seq: u64, content_bytes: u64, now_ms: u64) -> ExtractionRecord {
        ExtractionRecord {
            id: self.id,
            seq,
            tenant: self.tenant,
            source_id: self.source_id,
            source_hash: self.source_hash,
            schema: self.schema,
            metadata_json: self.metadata_json,
            state: State::Pending,
            attempt: 1,
            claims: 0,
            content_bytes,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            requeues: 0,
            output_budget: None,
            truncation_retried: false,
            reasks: 0,
            previous_attempt: None,
            superseded_by: None,
            past_failures: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Golden bytes: the fixtures under tests/fixtures/codec were written by the format
    //! version their name starts with.
    //! If one of these fails, an encoding changed: bump the version and add a migration
    //! instead of editing the fixture. `COMMITPOINT_WRITE_GOLDEN=1` rewrites them.

    use std::path::PathBuf;

    use super::*;
    use crate::domain::lifecycle::FailureClass;
    use crate::store::codec::{decode, encode};

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codec").join(name)
    }

    fn check_golden<T: Versioned + PartialEq + std::fmt::Debug>(name: &str, value: &T) {
        let bytes = encode(value).unwrap();
        let path = fixture(name);
        if std::env::var_os("COMMITPOINT_WRITE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let golden = std::fs::read(&path).unwrap();
        assert_eq!(bytes, golden, "{name}: encoding changed");
        assert_eq!(&decode::<T>(&golden).unwrap(), value);
    }

    fn record(state: State) -> ExtractionRecord {
        ExtractionRecord {
            id: ExtractionId([7; 32]),
            seq: 42,
            tenant: "acme".into(),
            source_id: "PR-17".into(),
            source_hash: SourceHash([9; 32]),
            schema: "code-review@1".into(),
            metadata_json: Some(r#"{"repo":"x"}"#.into()),
            state,
            attempt: 2,
            claims: 3,
            content_bytes: 1234,
            created_at_ms: 1_764_000_000_000,
            updated_at_ms: 1_764_000_000_500,
            requeues: 0,
            output_budget: None,
            truncation_retried: false,
            reasks: 0,
            previous_attempt: None,
            superseded_by: None,
            past_failures: Vec::new(),
        }
    }

    /// Format 2's fixtures, read by this build: no re-asks used, nobody's older revision.
    #[test]
    fn version_2_extractions_are_upgraded_on_read() {
        for name in [
            "v2_extraction_pending.bin",
            "v2_extraction_claimed.bin",
            "v2_extraction_committed.bin",
            "v2_extraction_cancelled.bin",
            "v2_extraction_failed.bin",
            "v2_extraction_truncated.bin",
            "v2_extraction_refused.bin",
            "v2_extraction_exhausted.bin",
        ] {
            let golden = std::fs::read(fixture(name)).unwrap();
            assert_eq!(golden[0], 2, "{name} is a format 2 file");
            let read = decode::<ExtractionRecord>(&golden).unwrap();
            assert_eq!((read.reasks, read.previous_attempt, read.superseded_by), (0, None, None), "{name}");
            assert_eq!((read.id, read.seq, read.attempt), (ExtractionId([7; 32]), 42, 2), "{name}");
        }
        let truncated = decode::<ExtractionRecord>(&std::fs::read(fixture("v2_extraction_truncated.bin")).unwrap());
        let truncated = truncated.unwrap();
        assert_eq!((truncated.requeues, truncated.output_budget, truncated.truncation_retried), (1, Some(8192), true));
    }

    /// Format 3's fixtures, read by this build: no past failures kept.
    #[test]
    fn version_3_extractions_are_upgraded_on_read() {
        for name in [
            "v3_extraction_pending.bin",
            "v3_extraction_claimed.bin",
            "v3_extraction_committed.bin",
            "v3_extraction_cancelled.bin",
            "v3_extraction_failed.bin",
            "v3_extraction_truncated.bin",
            "v3_extraction_refused.bin",
            "v3_extraction_exhausted.bin",
            "v3_extraction_reasked_superseded.bin",
        ] {
            let golden = std::fs::read(fixture(name)).unwrap();
            assert_eq!(golden[0], 3, "{name} is a format 3 file");
            let read = decode::<ExtractionRecord>(&golden).unwrap();
            assert!(read.past_failures.is_empty(), "{name}");
            assert_eq!((read.id, read.seq, read.attempt), (ExtractionId([7; 32]), 42, 2), "{name}");
        }
        let reasked =
            decode::<ExtractionRecord>(&std::fs::read(fixture("v3_extraction_reasked_superseded.bin")).unwrap())
                .unwrap();
        assert_eq!((reasked.reasks, reasked.superseded_by), (2, Some(ExtractionId([8; 32]))));
        assert!(reasked.previous_attempt.is_some_and(|p| p.issues.len() == 1));
    }

    #[test]
    fn golden_extraction_records_with_reasks_and_a_newer_revision() {
        check_golden(
            "v4_extraction_reasked_superseded.bin",
            &ExtractionRecord {
                reasks: 2,
                previous_attempt: Some(PreviousAttempt {
                    output: r#"{"findings":[{"file":"b.rs"}]}"#.into(),
                    issues: vec![crate::domain::schema::ValidationIssue {
                        path: "/findings/0/file".into(),
                        message: "b.rs is not a file of the source".into(),
                    }],
                }),
                superseded_by: Some(ExtractionId([8; 32])),
                past_failures: vec![PastFailure {
                    attempt: 1,
                    class: FailureClass::Validation,
                    reason: "line: 0 < 1".into(),
                    failed_at_ms: 1_764_000_000_500,
                }],
                ..record(State::Committed { at_ms: 1_764_000_001_000 })
            },
        );
    }

    #[test]
    fn golden_extraction_records() {
        check_golden("v4_extraction_pending.bin", &record(State::Pending));
        check_golden(
            "v4_extraction_claimed.bin",
            &record(State::Claimed {
                worker: "w1".into(),
                lease_token: "lt-1-abc".into(),
                expires_at_ms: 1_764_000_060_000,
            }),
        );
        check_golden("v4_extraction_committed.bin", &record(State::Committed { at_ms: 1_764_000_001_000 }));
        // Appended after format 2 was fixed (its cancelled state kept the others' bytes).
        check_golden("v4_extraction_cancelled.bin", &record(State::Cancelled { at_ms: 1_764_000_002_000 }));
        check_golden(
            "v4_extraction_failed.bin",
            &record(State::Failed { class: FailureClass::Validation, reason: "line: 0 < 1".into() }),
        );
        // The classes appended in format 2, and a record that used a truncation retry.
        check_golden(
            "v4_extraction_truncated.bin",
            &ExtractionRecord {
                requeues: 1,
                output_budget: Some(8192),
                truncation_retried: true,
                ..record(State::Failed { class: FailureClass::Truncated, reason: "cut off".into() })
            },
        );
        for (name, class) in [
            ("v4_extraction_refused.bin", FailureClass::Refused),
            ("v4_extraction_exhausted.bin", FailureClass::AttemptsExhausted),
        ] {
            check_golden(
                name,
                &ExtractionRecord { requeues: 4, ..record(State::Failed { class, reason: "r".into() }) },
            );
        }
    }

    /// Files written before the attempt cap still read: no requeues used, default budget.
    #[test]
    fn version_1_extractions_are_upgraded_on_read() {
        let cases = [
            ("v1_extraction_pending.bin", State::Pending),
            ("v1_extraction_committed.bin", State::Committed { at_ms: 1_764_000_001_000 }),
            (
                "v1_extraction_failed.bin",
                State::Failed { class: FailureClass::Validation, reason: "line: 0 < 1".into() },
            ),
        ];
        for (name, state) in cases {
            let golden = std::fs::read(fixture(name)).unwrap();
            assert_eq!(golden[0], 1, "{name} is a format 1 file");
            assert_eq!(decode::<ExtractionRecord>(&golden).unwrap(), record(state), "{name}");
        }
    }

    #[test]
    fn golden_finding_result_and_content() {
        check_golden(
            "v1_finding.bin",
            &FindingRecord {
                key: FindingKey([3; 32]),
                canonical_identity: r#"["R1","a.rs",3]"#.into(),
                body_json: r#"{"line":3}"#.into(),
                committed_at_ms: 5,
            },
        );
        let usage = Usage {
            model: "m".into(),
            input_tokens: 10,
            output_tokens: 20,
            cached_input_tokens: 4,
            cache_write_tokens: 1,
            reasoning_tokens: 2,
            provider_cost_micros: Some(77),
            request_id: Some("req_1".into()),
        };
        let result = |fence| ResultRecord {
            output_json: r#"{"findings":[]}"#.into(),
            producer: "w".into(),
            fence,
            usage: Some(usage.clone()),
            latency_ms: Some(1500),
            received_at_ms: 6,
        };
        check_golden("v3_result_lease.bin", &result(Fence::Lease("lt-1-abc".into())));
        check_golden("v3_result_batch.bin", &result(Fence::Batch("cpb-0123".into())));
        // Format 2 stored the fence as a string: `t` was a lease token.
        let v2 = std::fs::read(fixture("v2_result.bin")).unwrap();
        assert_eq!(v2[0], 2);
        assert_eq!(decode::<ResultRecord>(&v2).unwrap(), result(Fence::Lease("t".into())));
        // A provider's answer committed by format 2 held its batch key there.
        let v2_batch = legacy::ResultRecordV2 {
            output_json: r#"{"findings":[]}"#.into(),
            worker: "w".into(),
            lease_token: "cpb-0123".into(),
            usage: Some(usage.clone()),
            latency_ms: Some(1500),
            received_at_ms: 6,
        };
        let mut bytes = vec![2u8];
        bytes.extend(bincode::serde::encode_to_vec(&v2_batch, bincode::config::standard()).unwrap());
        assert_eq!(decode::<ResultRecord>(&bytes).unwrap(), result(Fence::Batch("cpb-0123".into())));
        check_golden("v1_content.bin", &StoredContent { text: "fn main() {}".into() });
    }

    #[test]
    fn golden_ledger_and_outbox() {
        check_golden(
            "v1_ledger.bin",
            &LedgerRecord {
                seq: 3,
                tenant: "acme".into(),
                extraction_id: ExtractionId([7; 32]),
                extraction_seq: 42,
                attempt: 1,
                kind: ChargeKind::FailedValidation,
                provider: "openai".into(),
                job_id: Some("batch_1".into()),
                usage: Usage { model: "gpt".into(), input_tokens: 100, output_tokens: 50, ..Usage::default() },
                latency_ms: Some(900),
                cost_micros: 125,
                list_cost_micros: 125,
                cost_source: CostSource::PriceTable,
                at_ms: 7,
            },
        );
        check_golden(
            "v1_ledger_unusable.bin",
            &LedgerRecord {
                seq: 4,
                tenant: "acme".into(),
                extraction_id: ExtractionId([7; 32]),
                extraction_seq: 42,
                attempt: 1,
                kind: ChargeKind::Unusable,
                provider: "openai".into(),
                job_id: Some("batch_1".into()),
                usage: Usage { model: "gpt".into(), input_tokens: 100, output_tokens: 4096, ..Usage::default() },
                latency_ms: None,
                cost_micros: 1300,
                list_cost_micros: 1300,
                cost_source: CostSource::PriceTable,
                at_ms: 8,
            },
        );
        check_golden(
            "v1_outbox.bin",
            &OutboxRecord {
                seq: 9,
                event_id: "msg_abc".into(),
                sink: "downstream".into(),
                kind: OutboxKind::Failed { class: FailureClass::Validation, reason: "no".into() },
                extraction_seq: 42,
                extraction_id: ExtractionId([7; 32]),
                tenant: "acme".into(),
                attempt: 2,
                state: DeliveryState::Delivered { at_ms: 11, status: 204 },
                deliveries: 3,
                next_attempt_at_ms: 10,
                last_error: Some("HTTP 500".into()),
                created_at_ms: 8,
            },
        );
        check_golden(
            "v1_outbox_revision.bin",
            &OutboxRecord {
                seq: 11,
                event_id: "msg_rev".into(),
                sink: "downstream".into(),
                kind: OutboxKind::Revision {
                    supersedes: ExtractionId([8; 32]),
                    diff: Some(DiffCounts { introduced: 1, resolved: 2, unchanged: 3 }),
                },
                extraction_seq: 43,
                extraction_id: ExtractionId([9; 32]),
                tenant: "acme".into(),
                attempt: 1,
                state: DeliveryState::Pending,
                deliveries: 0,
                next_attempt_at_ms: 13,
                last_error: None,
                created_at_ms: 13,
            },
        );
        check_golden(
            "v1_outbox_superseded.bin",
            &OutboxRecord {
                seq: 12,
                event_id: "msg_sup".into(),
                sink: "downstream".into(),
                kind: OutboxKind::Superseded { by: ExtractionId([9; 32]) },
                extraction_seq: 42,
                extraction_id: ExtractionId([8; 32]),
                tenant: "acme".into(),
                attempt: 1,
                state: DeliveryState::Pending,
                deliveries: 0,
                next_attempt_at_ms: 13,
                last_error: None,
                created_at_ms: 13,
            },
        );
        check_golden(
            "v1_outbox_cancelled.bin",
            &OutboxRecord {
                seq: 10,
                event_id: "msg_def".into(),
                sink: "downstream".into(),
                kind: OutboxKind::Cancelled,
                extraction_seq: 42,
                extraction_id: ExtractionId([7; 32]),
                tenant: "acme".into(),
                attempt: 1,
                state: DeliveryState::Pending,
                deliveries: 0,
                next_attempt_at_ms: 12,
                last_error: None,
                created_at_ms: 12,
            },
        );
    }

    /// Files written before usage grew cache and cost fields still read, with those at zero.
    #[test]
    fn version_1_results_are_upgraded_on_read() {
        let golden = std::fs::read(fixture("v1_result.bin")).unwrap();
        let record = decode::<ResultRecord>(&golden).unwrap();
        let usage = record.usage.unwrap();
        assert_eq!((usage.model.as_str(), usage.input_tokens, usage.output_tokens), ("m", 10, 20));
        assert_eq!((usage.cached_input_tokens, usage.provider_cost_micros), (0, None));
        assert_eq!((record.producer.as_str(), record.received_at_ms), ("w", 6));
        assert_eq!(record.fence, Fence::Lease("t".into()));
    }

    #[test]
    fn golden_batch_records_and_the_v1_upgrade() {
        let v1 = legacy::BatchRecordV1 {
            seq: 5,
            batch_key: "cpb-0123".into(),
            provider: "openai".into(),
            schema: "code-review@1".into(),
            members: vec![42, 43],
            state: BatchState::Submitted { job_id: "batch_1".into() },
            next_action_at_ms: 9,
            failures: 1,
            last_error: Some("503".into()),
            created_at_ms: 7,
            updated_at_ms: 8,
        };
        let path = fixture("v1_batch.bin");
        if std::env::var_os("COMMITPOINT_WRITE_GOLDEN").is_some() {
            let mut bytes = vec![1u8];
            bincode::serde::encode_into_std_write(&v1, &mut bytes, bincode::config::standard()).unwrap();
            std::fs::write(&path, bytes).unwrap();
        }
        let upgraded = decode::<BatchRecord>(&std::fs::read(&path).unwrap()).unwrap();
        let expected = BatchRecord { not_found_since_ms: None, ..BatchRecord::from(v1) };
        assert_eq!(upgraded, expected, "a v1 batch reads with no 404 window open");
        check_golden("v2_batch.bin", &BatchRecord { not_found_since_ms: Some(1_764_000_000_000), ..expected });
    }

    #[test]
    fn wrong_version_and_truncation_are_corruption_not_panics() {
        let mut bytes = encode(&record(State::Pending)).unwrap();
        assert!(decode::<ExtractionRecord>(&bytes[..bytes.len() - 3]).is_err());
        bytes[0] = 99;
        let err = decode::<ExtractionRecord>(&bytes).unwrap_err();
        assert!(err.to_string().contains("format version 99"), "{err}");
        assert!(decode::<ExtractionRecord>(&[]).is_err());
    }

    proptest::proptest! {
        #[test]
        fn records_round_trip(tenant in ".{0,40}", source in ".{0,40}", attempt in 0u32..9, reason in ".{0,60}") {
            let rec = ExtractionRecord {
                tenant,
                source_id: source,
                attempt,
                ..record(State::Failed { class: FailureClass::Gone, reason })
            };
            proptest::prop_assert_eq!(decode::<ExtractionRecord>(&encode(&rec).unwrap()).unwrap(), rec);
        }
    }
}
