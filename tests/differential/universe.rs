//! The fixed world every sequence draws from: a few identities (some sharing a source or a
//! content), the providers and sinks, how answers are judged and what calls cost. Both the
//! stores and the model are given exactly these, so their answers can be compared.

use commitpoint::domain::batch::Usage;
use commitpoint::domain::identity::{ExtractionId, SourceHash};
use commitpoint::domain::schema::{ValidatedFinding, ValidationIssue};
use commitpoint::store::{CostSource, Judged, NewExtraction, Pricing, Submission};
use serde_json::{Value, json};

pub const TENANTS: [&str; 2] = ["acme", "bolt"];
pub const SCHEMAS: [&str; 2] = ["review@1", "triage@1"];
pub const PROVIDERS: [&str; 2] = ["p-one", "p-two"];
/// Every terminal state change makes one event per sink.
pub const SINKS: [&str; 2] = ["downstream", "audit"];
/// The time a `Retry` delivery report asks for: fixed, so both sides store the same.
pub const RETRY_AT_MS: u64 = 1_000;
/// `acme` has a budget (bolt has none); each batch member is reserved at `ESTIMATE`, so a
/// few fit at a time and charged answers make room.
pub const BUDGETED: &str = "acme";
pub const BUDGET_MICROS: u64 = 150;
pub const ESTIMATE: u64 = 60;

/// (tenant, source, schema, content, metadata): 1 is 0 with a changed content (a new
/// identity), 3 is 0 for another tenant, 4 is larger than a small batch's byte cap.
const IDENTITIES: [(usize, &str, usize, &str, Option<&str>); 8] = [
    (0, "pr-1", 0, "fn a() {}", Some(r#"{"repo":"x"}"#)),
    (0, "pr-1", 0, "fn a() { b() }", None),
    (0, "pr-2", 1, "issue: it crashes", None),
    (1, "pr-1", 0, "fn a() {}", None),
    (1, "pr-3", 0, "fn big() { one(); two(); three(); four(); }", None),
    (1, "pr-4", 1, "x", Some(r#"{"n":1}"#)),
    (0, "pr-5", 0, "fn c() {}", None),
    (1, "pr-6", 0, "fn d() {}", None),
];

pub const IDENTITY_COUNT: usize = IDENTITIES.len();

pub fn new_extraction(identity: usize) -> NewExtraction {
    let (tenant, source, schema, content, metadata) = IDENTITIES[identity % IDENTITY_COUNT];
    let (tenant, schema) = (TENANTS[tenant], SCHEMAS[schema]);
    let source_hash = SourceHash::compute(content.as_bytes(), schema);
    NewExtraction {
        id: ExtractionId::compute(tenant, source, &source_hash, schema),
        tenant: tenant.into(),
        source_id: source.into(),
        source_hash,
        schema: schema.into(),
        metadata_json: metadata.map(str::to_string),
        content: content.into(),
    }
}

/// The identity a label names, and a stranger's (never taken in) past the end.
pub fn id_of(identity: usize) -> ExtractionId {
    if identity >= IDENTITY_COUNT {
        let hash = SourceHash::compute(b"nobody's", SCHEMAS[0]);
        return ExtractionId::compute("nobody", "pr-0", &hash, SCHEMAS[0]);
    }
    new_extraction(identity).id
}

pub fn label_of(id: &ExtractionId) -> Option<usize> {
    (0..IDENTITY_COUNT).find(|&i| id_of(i) == *id)
}

/// A model's answer as its text: `ok` decides validity, `findings` lists identities
/// (repeats allowed: a finding is stored once per key).
pub fn answer_text(ok: bool, findings: &[u8]) -> String {
    json!({ "ok": ok, "findings": findings.iter().map(|f| json!({ "id": f })).collect::<Vec<_>>() }).to_string()
}

/// Re-asks an extraction of this world gets.
pub const REASK_LIMIT: u32 = 1;

/// The judge of this world, standing in for schema validation: both sides judge alike.
pub fn judge(text: &str) -> Submission {
    // One re-ask per extraction, as the schemas' default: an invalid answer is asked again
    // once, and the next invalid one fails.
    let refused = |path: &str, message: &str| Submission::Invalid {
        reason: format!("{path}: {message}"),
        issues: vec![ValidationIssue { path: path.into(), message: message.into() }],
        output: text.to_string(),
        reask_limit: REASK_LIMIT,
    };
    let Ok(output) = serde_json::from_str::<Value>(text) else {
        return refused("", "not JSON");
    };
    if output["ok"] != json!(true) {
        return refused("/ok", "the answer says it is not ok");
    }
    let findings = output["findings"].as_array().cloned().unwrap_or_default();
    let findings = findings
        .into_iter()
        .map(|body| ValidatedFinding { canonical_identity: format!("[{}]", body["id"]), body })
        .collect();
    Submission::Valid { findings, output }
}

pub fn judged(text: &str) -> Judged {
    Judged::from(&judge(text))
}

/// What a call used; `request_id` is the provider's id for it, charged once per extraction.
pub fn usage(model: &str, input_tokens: u64, output_tokens: u64, request_id: String) -> Usage {
    Usage { model: model.into(), input_tokens, output_tokens, request_id: Some(request_id), ..Usage::default() }
}

/// The request id of a batch's answer for one member: a duplicate line or a re-fetched
/// file repeats it, another batch does not.
pub fn line_request(batch: usize, identity: usize, kind: char) -> String {
    format!("req-b{batch}-{identity}-{kind}")
}

/// The paid calls behind a post: one, or two with consecutive request ids (`again`).
pub fn post_requests(paid: Option<(bool, u8)>, again: bool) -> Vec<Option<(bool, u8)>> {
    let mut calls = vec![paid];
    if again {
        calls.push(paid.map(|(latency, request)| (latency, (request + 1) % 3)));
    }
    calls
}

/// A price table: the `free` model is unpriced, batch calls cost half.
#[derive(Debug, Default)]
pub struct TestPricing;

impl Pricing for TestPricing {
    fn price(&self, _provider: &str, usage: &Usage, batch: bool) -> (u64, CostSource) {
        price(usage, batch)
    }
}

pub fn price(usage: &Usage, batch: bool) -> (u64, CostSource) {
    if usage.model == "free" {
        return (0, CostSource::Unpriced);
    }
    let list = usage.input_tokens * 3 + usage.output_tokens * 5;
    (if batch { list / 2 } else { list }, CostSource::PriceTable)
}
