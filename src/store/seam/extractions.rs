//! Intake, reads of extractions, workers' claims and results, and what they answer.

use super::*;
use crate::domain::identity::IdPrefix;
use crate::domain::lifecycle::Event;
use async_trait::async_trait;
use serde_json::Value;

/// Intake, reads of extractions, and workers' claims and results (the service).
#[async_trait]
pub trait Extractions: Send + Sync + std::fmt::Debug {
    /// Inserts unless the identity exists; a known identity is answered without a write.
    async fn intake(&self, new: NewExtraction) -> Result<IntakeOutcome, Error>;
    /// Intake keyed by a webhook delivery id too, in one transaction.
    async fn intake_delivery(
        &self,
        endpoint: String,
        delivery_id: String,
        new: NewExtraction,
    ) -> Result<DeliveryOutcome, Error>;
    /// The extraction a webhook delivery created, if it was seen.
    async fn delivered(&self, endpoint: String, delivery_id: String) -> Result<Option<ExtractionRecord>, Error>;
    async fn get(&self, id: ExtractionId) -> Result<Option<ExtractionRecord>, Error>;
    async fn get_by_seq(&self, seq: u64) -> Result<Option<ExtractionRecord>, Error>;
    /// Up to `limit` extractions (of `tenant` only, if given) whose id starts with
    /// `prefix`, in id order.
    async fn with_id_prefix(
        &self,
        prefix: IdPrefix,
        tenant: Option<String>,
        limit: usize,
    ) -> Result<Vec<ExtractionRecord>, Error>;
    async fn list(&self, filter: ListFilter) -> Result<ListPage, Error>;
    async fn findings(&self, id: ExtractionId) -> Result<Option<Vec<FindingRecord>>, Error>;
    async fn findings_page(
        &self,
        id: ExtractionId,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Option<(Vec<FindingRecord>, bool)>, Error>;
    /// The raw output a committed extraction was committed with.
    async fn result(&self, id: ExtractionId) -> Result<Option<ResultRecord>, Error>;
    /// How many extractions are in each state, and since when the oldest waits.
    async fn counts_by_state(&self) -> Result<Vec<StateCount>, Error>;
    /// Each tenant's work by schema and state, ordered by (tenant, schema): kept by the
    /// writes that move states on redb, so a read costs the number of (tenant, schema)
    /// pairs, not of extractions.
    async fn depth_by_tenant(&self) -> Result<Vec<TenantDepth>, Error>;
    /// Hands out leases with fencing tokens.
    async fn claim(&self, request: ClaimRequest) -> Result<Vec<Grant>, Error>;
    /// Commits (or fails) an output under a lease or a batch's authority, re-checked
    /// in the same transaction as the findings, raw result, ledger and outbox writes.
    async fn post_result(&self, post: PostResult) -> Result<PostOutcome, Error>;
    async fn retry(&self, id: ExtractionId) -> Result<RetryOutcome, Error>;
    /// Moves the current lease's expiry (`rules::lease`), fenced by its token.
    async fn extend_lease(&self, extension: LeaseExtension) -> Result<ExtendOutcome, Error>;
    /// Moves a pending, claimed, submitted or failed extraction to `Cancelled`.
    async fn cancel(&self, id: ExtractionId) -> Result<CancelOutcome, Error>;
    /// Moves up to `limit` matching failed extractions back to pending, in bounded
    /// transactions; returns how many moved.
    async fn retry_failed(&self, filter: RetryFilter, limit: u64) -> Result<u64, Error>;
    /// A tenant's committed extractions in commit order, from one snapshot.
    async fn export_to(&self, filter: ExportFilter, sink: ExportSink) -> Result<(), Error>;
    /// What retention dropped of each of `seqs` (`RETIRED_*` bits; absent: nothing).
    async fn retired(&self, seqs: Vec<u64>) -> Result<HashMap<u64, u8>, Error>;
    /// The sources of `ids` as they were submitted (source id and content), from one
    /// snapshot: what an answer's findings are grounded in. An unknown id, or one whose
    /// content retention dropped, is left out.
    async fn sources(&self, ids: Vec<ExtractionId>) -> Result<HashMap<ExtractionId, SourceContent>, Error>;
}

/// An extraction's source as submitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceContent {
    pub source_id: String,
    pub content: String,
}

#[derive(Debug, Clone)]
pub struct IntakeOutcome {
    pub created: bool,
    pub record: ExtractionRecord,
}

#[derive(Debug, Clone)]
pub enum DeliveryOutcome {
    /// The first delivery of this id: an intake (which may itself be a duplicate identity).
    First(IntakeOutcome),
    /// This delivery id was seen before; here is what it created.
    Redelivery(ExtractionRecord),
}

#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub worker: String,
    pub limit: usize,
    pub lease_ms: u64,
    pub schema: Option<String>,
    /// What a claimed member will cost the worker (it declared its model), reserved
    /// against its tenant's budget like a batch member; `None`: nothing is reserved, and
    /// only a spent budget holds the tenant's work back.
    pub estimate: Option<crate::store::MemberEstimate>,
    /// The tenants and schemas the worker's token may take work of.
    pub scope: WorkScope,
}

/// Which work a worker may claim: every tenant's and every schema's unless its token
/// names some (`[access] worker_tokens_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkScope {
    pub tenants: Option<Vec<String>>,
    pub schemas: Option<Vec<String>>,
}

impl WorkScope {
    pub fn covers(&self, tenant: &str, schema: &str) -> bool {
        let has = |names: &Option<Vec<String>>, name: &str| names.as_ref().is_none_or(|n| n.iter().any(|x| x == name));
        has(&self.tenants, tenant) && has(&self.schemas, schema)
    }

    pub fn covers_schema(&self, schema: &str) -> bool {
        self.schemas.as_ref().is_none_or(|n| n.iter().any(|x| x == schema))
    }
}

#[derive(Debug, Clone)]
pub struct Grant {
    pub record: ExtractionRecord,
    pub content: String,
    pub lease_token: LeaseToken,
    pub lease_expires_at_ms: u64,
}

/// A worker's output, already checked against the extraction's schema.
#[derive(Debug, Clone)]
pub enum Submission {
    Valid {
        findings: Vec<ValidatedFinding>,
        output: Value,
    },
    /// `issues` say what to fix, one per problem (`{path, message}`), for a re-ask;
    /// `reason` sums them up for the failure record; `output` is the refused answer as
    /// given. `reask_limit`: how many re-asks the extraction may use (the schema's, or its
    /// provider's override) before an invalid answer fails it.
    Invalid {
        reason: String,
        issues: Vec<ValidationIssue>,
        output: String,
        reask_limit: u32,
    },
}

impl Submission {
    /// Whether this invalid answer is asked again rather than failing `record`.
    pub(crate) fn reasks_left(&self, record: &ExtractionRecord) -> bool {
        matches!(self, Submission::Invalid { reask_limit, .. } if record.reasks < *reask_limit)
    }

    /// The same verdict under `limit` instead of the schema's re-ask limit, when there is
    /// one (a provider's override, or a worker declining re-asks).
    pub fn with_reask_limit(mut self, limit: Option<u32>) -> Self {
        if let (Submission::Invalid { reask_limit, .. }, Some(limit)) = (&mut self, limit) {
            *reask_limit = limit;
        }
        self
    }
}

/// An answer in the form it is stored: its output and findings already serialised, so
/// that work (and the parsed trees, which take many times the text's memory) stays off the
/// writer thread. Ingestion judges whole chunks of answers into this form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judged {
    Valid { output_json: String, findings: Vec<EncodedFinding> },
    Invalid { reason: String, issues: Vec<ValidationIssue>, output: String, reask_limit: u32 },
}

/// A validated finding's identity and its body as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedFinding {
    pub canonical_identity: String,
    pub body_json: String,
}

impl Judged {
    /// Whether this invalid answer is asked again rather than failing `record`.
    pub(crate) fn reasks_left(&self, record: &ExtractionRecord) -> bool {
        matches!(self, Judged::Invalid { reask_limit, .. } if record.reasks < *reask_limit)
    }
}

impl From<&Submission> for Judged {
    fn from(submission: &Submission) -> Self {
        match submission {
            Submission::Valid { findings, output } => Judged::Valid {
                output_json: output.to_string(),
                findings: findings
                    .iter()
                    .map(|f| EncodedFinding {
                        canonical_identity: f.canonical_identity.clone(),
                        body_json: f.body.to_string(),
                    })
                    .collect(),
            },
            Submission::Invalid { reason, issues, output, reask_limit } => Judged::Invalid {
                reason: reason.clone(),
                issues: issues.clone(),
                output: output.clone(),
                reask_limit: *reask_limit,
            },
        }
    }
}

/// Who is entitled to commit: the worker holding the current lease, or the batch the
/// extraction currently belongs to. Either one fences out late and stale reporters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    Lease(LeaseToken),
    Batch(BatchKey),
}

#[derive(Debug, Clone)]
pub struct PostResult {
    pub id: ExtractionId,
    pub authority: Authority,
    pub submission: Submission,
    /// The model call that produced the answer, when its usage is known: the ledger
    /// entry is written in the same transaction as the outcome.
    pub charge: Option<Charge>,
}

impl PostResult {
    /// The lifecycle event this post asks for, and the fence its commit is recorded under;
    /// the same for every backend, so both judge a late or stale reporter alike.
    pub(crate) fn event_and_fence(&self, record: &ExtractionRecord) -> (Event, Fence) {
        let reask = self.submission.reasks_left(record);
        let event = match (&self.authority, &self.submission) {
            (Authority::Lease(token), Submission::Valid { .. }) => Event::ValidResult { lease_token: token.clone() },
            (Authority::Lease(token), Submission::Invalid { reason, .. }) => {
                Event::InvalidResult { lease_token: token.clone(), reason: reason.clone(), reask }
            }
            (Authority::Batch(key), Submission::Valid { .. }) => Event::ReadyValid { batch_key: key.clone() },
            (Authority::Batch(key), Submission::Invalid { reason, .. }) => {
                Event::ReadyInvalid { batch_key: key.clone(), reason: reason.clone(), reask }
            }
        };
        let fence = match &self.authority {
            Authority::Lease(token) => Fence::Lease(token.clone()),
            Authority::Batch(key) => Fence::Batch(key.clone()),
        };
        (event, fence)
    }
}

/// Who produced an answer, as the result record names it: the worker holding the lease or
/// the provider whose batch answered.
pub(crate) fn producer_of(state: &State) -> String {
    match state {
        State::Claimed { worker, .. } => worker.clone(),
        State::Ready { provider, .. } => provider.to_string(),
        _ => String::new(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostOutcome {
    Committed {
        findings: u64,
    },
    Replay {
        findings: u64,
    },
    Failed {
        reason: String,
    },
    /// The answer was invalid and the extraction goes back to the queue to be asked again
    /// with its issues (`reask`: which re-ask this is, from 1).
    Reasked {
        reason: String,
        reask: u32,
    },
    NotFound,
    Rejected(TransitionError),
}

/// A worker's request for more time on the lease it holds.
#[derive(Debug, Clone)]
pub struct LeaseExtension {
    pub id: ExtractionId,
    pub lease_token: LeaseToken,
    /// How long the lease runs from now.
    pub lease_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtendOutcome {
    /// The lease now runs until then, under the same token.
    Extended {
        expires_at_ms: u64,
    },
    NotFound,
    Rejected(TransitionError),
}

#[derive(Debug, Clone)]
pub enum RetryOutcome {
    Retried(Box<ExtractionRecord>),
    NotFound,
    Rejected(TransitionError),
}

#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub tenant: Option<String>,
    pub state: Option<StateName>,
    pub limit: usize,
    /// Exclusive cursor: the sequence number of the last record of the previous page (0:
    /// the first page, in either order).
    pub after: u64,
    /// Only each source's current revision: no newer intake of the same tenant, source id
    /// and schema name exists.
    pub latest: bool,
    /// Newest intake first (pages then move to lower sequence numbers); otherwise intake
    /// order.
    pub newest_first: bool,
}

impl ListFilter {
    /// The sequence numbers a page may hold, both ends included, given the cursor and the
    /// order: what each backend's range or `WHERE` walks.
    pub fn seq_bounds(&self) -> (u64, u64) {
        match (self.newest_first, self.after) {
            (false, after) => (after.saturating_add(1), u64::MAX),
            (true, 0) => (0, u64::MAX),
            (true, before) => (0, before - 1),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateCount {
    pub state: StateName,
    pub count: u64,
    pub oldest_since_ms: Option<u64>,
}

/// One tenant's work under one schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantDepth {
    pub tenant: String,
    pub schema: String,
    /// Non-zero counts only, in `StateName::ALL` order.
    pub counts: Vec<(StateName, u64)>,
    /// When the first pending extraction in intake order (the next a claim or a batch of
    /// this tenant and schema takes) became pending.
    pub oldest_pending_since_ms: Option<u64>,
}

impl TenantDepth {
    pub fn count(&self, state: StateName) -> u64 {
        self.counts.iter().find(|(s, _)| *s == state).map_or(0, |(_, n)| *n)
    }

    /// Work waiting or in flight: what the busiest tenants are ranked by.
    pub fn unfinished(&self) -> u64 {
        self.counts.iter().filter(|(s, _)| !s.is_terminal()).map(|(_, n)| n).sum()
    }
}

#[derive(Debug, Clone)]
pub struct ListPage {
    pub records: Vec<ExtractionRecord>,
    pub next: Option<u64>,
}

/// Most extractions one bulk-retry job moves back to pending.
pub const RETRY_CHUNK: usize = 500;

#[derive(Debug, Clone)]
pub enum CancelOutcome {
    /// Cancelled now, or already cancelled before (nothing written then).
    Cancelled(Box<ExtractionRecord>),
    NotFound,
    Rejected(TransitionError),
}

/// Which failed extractions a bulk retry takes; `None` matches anything.
#[derive(Debug, Clone, Default)]
pub struct RetryFilter {
    pub tenant: Option<String>,
    pub schema: Option<String>,
    pub failure_class: Option<FailureClass>,
}

impl RetryFilter {
    pub(crate) fn matches(&self, record: &ExtractionRecord) -> bool {
        let State::Failed { class, .. } = &record.state else {
            return false;
        };
        self.tenant.as_ref().is_none_or(|t| *t == record.tenant)
            && self.schema.as_ref().is_none_or(|s| *s == record.schema)
            && self.failure_class.is_none_or(|c| c == *class)
    }
}

#[derive(Debug, Clone)]
pub struct ExportFilter {
    pub tenant: String,
    pub schema: Option<String>,
    /// Commit time window, `since_ms <= committed < until_ms`.
    pub since_ms: u64,
    pub until_ms: u64,
    /// Leave out the extractions a newer revision superseded.
    pub latest: bool,
}

/// One committed extraction and its findings (in key order).
#[derive(Debug, Clone)]
pub struct Exported {
    pub record: ExtractionRecord,
    pub committed_at_ms: u64,
    pub findings: Vec<FindingRecord>,
    /// The committed raw output, while retention keeps it: what the export shows of the
    /// output besides its findings is read from it.
    pub output_json: Option<String>,
}
