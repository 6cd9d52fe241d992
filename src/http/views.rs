//! How stored records look in JSON. States are lowercase words; timestamps RFC 3339.
//! Each view is a type, so the OpenAPI document describes exactly what is sent.

use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::domain::clock::format_ms;
use crate::domain::lifecycle::State;
use crate::store::{ExtractionRecord, FindingRecord, Grant};

/// Every state an extraction can be in.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum StateView {
    Pending,
    Claimed,
    Committed,
    Failed,
    /// Part of a batch submitted to a provider.
    Submitted,
    /// The provider answered; the answer waits to be validated and committed.
    Ready,
    /// Stopped for good (`POST /v1/extractions/{id}/cancel`).
    Cancelled,
}

impl StateView {
    pub(super) fn of(state: &State) -> Self {
        use crate::domain::lifecycle::StateName as N;
        match state.name() {
            N::Pending => Self::Pending,
            N::Claimed => Self::Claimed,
            N::Committed => Self::Committed,
            N::Failed => Self::Failed,
            N::Submitted => Self::Submitted,
            N::Ready => Self::Ready,
            N::Cancelled => Self::Cancelled,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Extraction {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    tenant: String,
    source_id: String,
    source_hash: String,
    schema: String,
    state: StateView,
    /// Set while failed: `rate_limited`, `transient`, `auth`, `invalid_request`, `validation`,
    /// `gone`, `truncated`, `refused` or `attempts_exhausted`.
    failure_class: Option<&'static str>,
    failure_reason: Option<String>,
    /// Set while claimed.
    worker: Option<String>,
    lease_expires_at: Option<String>,
    /// 1 at intake; grows with each retry and each re-ask.
    attempts: u32,
    /// Invalid answers asked again with their issues since intake or the last retry
    /// (capped by the schema's `x-commitpoint-reask` or the provider's `reask`).
    reasks: u32,
    /// Provider attempts sent back to the queue since intake or the last retry (capped by
    /// `scheduler.max_attempts`).
    requeues: u32,
    /// The output token budget providers are asked for, once raised after a truncated
    /// answer; null means the provider's configured default.
    output_budget: Option<u32>,
    /// Leases handed out so far.
    claims: u32,
    content_bytes: u64,
    #[schema(value_type = Option<Object>)]
    metadata: Option<Value>,
    created_at: String,
    updated_at: String,
    committed_at: Option<String>,
    /// False once retention (`[retention] content_after_commit`) dropped the stored
    /// content. The identity and hash stay: the same source is still a duplicate.
    content_retained: bool,
    /// False once retention (`[retention] raw_results_after_commit`) dropped the raw
    /// result; the findings stay.
    raw_result_retained: bool,
    /// The newer revision of the same source (and schema name) that superseded this one
    /// (see `GET /v1/sources/{tenant}/{source_id}`); null while it is the latest committed.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    superseded_by: Option<String>,
    /// What the committed output holds besides its findings array (fields the schema
    /// requires next to it, such as a `language` or a `summary`). Shown by
    /// `GET /v1/extractions/{id}`, null in listings, before the commit, and once retention
    /// dropped the raw result.
    #[schema(value_type = Option<Object>)]
    output_fields: Option<Value>,
    /// Why earlier attempts failed, oldest first: failures an operator retried past (the
    /// latest 16), which the state no longer shows.
    earlier_failures: Vec<EarlierFailure>,
    /// While failed `validation`: the answer refused with no re-ask left, and its issues.
    rejected_answer: Option<PreviousAttemptView>,
}

/// A failure an operator retried past.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EarlierFailure {
    attempt: u32,
    failure_class: &'static str,
    failure_reason: String,
    failed_at: String,
}

impl Extraction {
    pub(super) fn with_output_fields(self, output_fields: Option<Value>) -> Self {
        Self { output_fields, ..self }
    }
}

/// The view of a record whose `RETIRED_*` bits are `retired` (see `store`).
pub(super) fn extraction_retained(r: &ExtractionRecord, retired: u8) -> Extraction {
    let mut view = extraction(r);
    view.content_retained = retired & crate::store::RETIRED_CONTENT == 0;
    view.raw_result_retained = retired & crate::store::RETIRED_RAW_RESULT == 0;
    view
}

pub(super) fn extraction(r: &ExtractionRecord) -> Extraction {
    let (failure_class, failure_reason) = match &r.state {
        State::Failed { class, reason } => (Some(class.as_str()), Some(reason.clone())),
        _ => (None, None),
    };
    let (worker, lease_expires_at) = match &r.state {
        State::Claimed { worker, expires_at_ms, .. } => (Some(worker.clone()), Some(format_ms(*expires_at_ms))),
        _ => (None, None),
    };
    let committed_at = match r.state {
        State::Committed { at_ms } => Some(format_ms(at_ms)),
        _ => None,
    };
    Extraction {
        extraction_id: r.id.to_hex(),
        tenant: r.tenant.clone(),
        source_id: r.source_id.clone(),
        source_hash: r.source_hash.to_hex(),
        schema: r.schema.clone(),
        state: StateView::of(&r.state),
        failure_class,
        failure_reason,
        worker,
        lease_expires_at,
        attempts: r.attempt,
        reasks: r.reasks,
        requeues: r.requeues,
        output_budget: r.output_budget,
        claims: r.claims,
        content_bytes: r.content_bytes,
        metadata: metadata(r),
        created_at: format_ms(r.created_at_ms),
        updated_at: format_ms(r.updated_at_ms),
        committed_at,
        content_retained: true,
        raw_result_retained: true,
        superseded_by: r.superseded_by.map(|id| id.to_hex()),
        output_fields: None,
        earlier_failures: r
            .past_failures
            .iter()
            .map(|p| EarlierFailure {
                attempt: p.attempt,
                failure_class: p.class.as_str(),
                failure_reason: p.reason.clone(),
                failed_at: format_ms(p.failed_at_ms),
            })
            .collect(),
        rejected_answer: match &r.state {
            State::Failed { .. } => r.previous_attempt.as_ref().map(previous_attempt),
            _ => None,
        },
    }
}

fn previous_attempt(p: &crate::domain::batch::PreviousAttempt) -> PreviousAttemptView {
    PreviousAttemptView {
        output: p.output.clone(),
        issues: p.issues.iter().map(|i| IssueView { path: i.path.clone(), message: i.message.clone() }).collect(),
    }
}

/// One unit of work handed to a worker, with the content to extract from.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ClaimGrant {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    extraction_id: String,
    /// The fencing token to post the result with.
    lease_token: String,
    lease_expires_at: String,
    tenant: String,
    source_id: String,
    schema: String,
    attempt: u32,
    #[schema(value_type = Option<Object>)]
    metadata: Option<Value>,
    content: String,
    /// What the model is asked to do (the schema's `x-commitpoint-instructions`).
    instructions: String,
    /// Where the JSON Schema the output must satisfy is served (`GET /v1/schemas/{name}`).
    schema_url: String,
    /// Present when this claim is a re-ask: the refused answer (its start, when long) and
    /// the issues to fix. Show both to the model and ask again.
    previous_attempt: Option<PreviousAttemptView>,
}

/// A refused answer and what was wrong with it.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PreviousAttemptView {
    /// The refused answer as given; cut after 16,384 characters with a `… [cut: N more bytes]` marker.
    output: String,
    issues: Vec<IssueView>,
}

/// One problem with an answer: where (a JSON Pointer into it; empty for the whole answer) and what.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct IssueView {
    path: String,
    message: String,
}

/// `instructions`: the claimed extraction's schema's, or `None` when the schema is no
/// longer registered (the worker can still read `schema_url`'s answer, a 404 then).
pub(super) fn grant(g: &Grant, instructions: Option<String>) -> ClaimGrant {
    ClaimGrant {
        extraction_id: g.record.id.to_hex(),
        lease_token: g.lease_token.to_string(),
        lease_expires_at: format_ms(g.lease_expires_at_ms),
        tenant: g.record.tenant.clone(),
        source_id: g.record.source_id.clone(),
        schema: g.record.schema.clone(),
        attempt: g.record.attempt,
        metadata: metadata(&g.record),
        content: g.content.clone(),
        instructions: instructions.unwrap_or_default(),
        schema_url: format!("/v1/schemas/{}", g.record.schema),
        previous_attempt: g.record.previous_attempt.as_ref().map(previous_attempt),
    }
}

/// A stored finding: its own fields (as the schema defines them) plus its key;
/// non-object findings are wrapped under `value`.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Finding {
    #[schema(pattern = "^[0-9a-f]{64}$")]
    finding_key: String,
    #[serde(flatten)]
    #[schema(ignore)]
    fields: Map<String, Value>,
}

pub(super) fn finding(f: &FindingRecord) -> Finding {
    let body: Value = serde_json::from_str(&f.body_json).unwrap_or(Value::Null);
    let fields = match body {
        Value::Object(fields) => fields.into_iter().filter(|(k, _)| k != "finding_key").collect(),
        other => Map::from_iter([("value".to_string(), other)]),
    };
    Finding { finding_key: f.key.to_hex(), fields }
}

fn metadata(r: &ExtractionRecord) -> Option<Value> {
    r.metadata_json.as_deref().and_then(|m| serde_json::from_str(m).ok())
}
