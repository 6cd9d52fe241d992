//! Entry points for the fuzz targets in `fuzz/` and their stable-toolchain replay in
//! `tests/fuzz_smoke.rs`, and the router's route table for the integration test that
//! trickles a body to every route. Not an API: nothing else should call these, and the
//! product is built without them (the `fuzzing` feature, which only the tests turn on).
//!
//! Each takes raw bytes, hands them to the private parsers the way the adapters, the
//! webhook intake, the HTTP intake and the store do, and asserts properties that hold
//! for every input. A panic is a finding: a parser panicked or a property broke.
//! Structured inputs are plain text with one field per line, so seeds stay readable.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::domain::batch::LineResult;
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::Registry;
use crate::engine::webhook::{
    self, GITHUB_DELIVERY, GITHUB_SIGNATURE, MAX_DELIVERY_ID_LEN, Scheme, SignatureError, StandardHeaders, WEBHOOK_ID,
    WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP, WebhookSecret,
};
use crate::http::handlers::IntakeBody;
use crate::providers::ResultLine;
use crate::providers::anthropic::wire as anthropic;
use crate::providers::bedrock::wire as bedrock;
use crate::providers::chat::wire as chat;
use crate::providers::gemini::wire as gemini;
use crate::providers::generic::GenericFields;
use crate::providers::generic::wire as generic;
use crate::providers::lines;
use crate::providers::mistral::wire as mistral;
use crate::providers::openai::wire as openai;
use crate::providers::vertex::wire as vertex;
use crate::providers::{classify_status, parse_retry_after};
use crate::service::Service;
use crate::store::codec::{Versioned, decode, encode};
use crate::store::{
    BatchRecord, ExtractionRecord, FindingRecord, LedgerRecord, OutboxRecord, ResultRecord, StagedAnswer, StoredContent,
};

/// Every route the server has, as (method, path template), from the router's own lists.
pub fn route_table() -> Vec<(String, String)> {
    crate::http::route_table()
}

/// A fuzz target's entry point: any bytes in, a panic only for a finding.
pub type Target = fn(&[u8]);

/// Every entry point under the name of its fuzz target, which is also its corpus directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("openai_response", openai_response),
    ("anthropic_response", anthropic_response),
    ("generic_response", generic_response),
    ("chat_response", chat_response),
    ("gemini_response", gemini_response),
    ("mistral_response", mistral_response),
    ("bedrock_response", bedrock_response),
    ("vertex_response", vertex_response),
    ("webhook_verify", webhook_verify),
    ("store_decode", store_decode),
    ("intake_body", intake_body),
];

/// The statuses the adapters classify most; each input is classified under all of them.
const STATUSES: [u16; 12] = [200, 400, 401, 402, 403, 404, 408, 409, 422, 429, 500, 529];

/// A downloaded result file, line by line through the adapters' own reader: the text of
/// each line that is not blank, as the parsers are handed it.
fn result_lines(data: &[u8]) -> impl Iterator<Item = String> + use<> {
    lines::split(data).into_iter().filter_map(|line| line.parse(|text| Ok(text.to_string()))).filter_map(Result::ok)
}

/// What the OpenAI adapter makes of each line of a downloaded result file.
pub fn openai_result_file(data: &[u8]) -> Vec<Result<ResultLine, String>> {
    result_lines(data).map(|line| openai::parse_line(&line)).collect()
}

/// What the Anthropic adapter makes of each line of a downloaded results file.
pub fn anthropic_result_file(data: &[u8]) -> Vec<Result<ResultLine, String>> {
    result_lines(data).map(|line| anthropic::parse_line(&line)).collect()
}

/// What the generic adapter makes of each line of a JSONL result file (default fields).
pub fn generic_result_file(data: &[u8]) -> Vec<Result<ResultLine, String>> {
    let fields = GenericFields::default();
    let item = |line: &str| serde_json::from_str::<Value>(line).map_err(|e| format!("unreadable result line: {e}"));
    result_lines(data).map(|line| item(&line).and_then(|item| generic::parse_item(&item, &fields))).collect()
}

/// What the Gemini adapter makes of each line of a responses file: the key it names (if
/// any) and the result.
pub fn gemini_result_file(data: &[u8]) -> Vec<Result<(Option<String>, LineResult), String>> {
    result_lines(data).map(|line| gemini::file_row(&line)).collect()
}

/// What the Mistral adapter makes of each line of an output or error file.
pub fn mistral_result_file(data: &[u8]) -> Vec<Result<ResultLine, String>> {
    result_lines(data).map(|line| mistral::parse_line(&line)).collect()
}

/// What the Bedrock adapter makes of each record of a `.jsonl.out` file.
pub fn bedrock_result_file(data: &[u8]) -> Vec<Result<ResultLine, String>> {
    result_lines(data).map(|line| bedrock::parse_line(&line)).collect()
}

/// What the Vertex adapter makes of each line of a predictions file.
pub fn vertex_result_file(data: &[u8]) -> Vec<Result<ResultLine, String>> {
    result_lines(data).map(|line| vertex::parse_line(&line)).collect()
}

/// What the chat adapter makes of a 2xx completion body.
pub fn chat_completion(body: &[u8]) -> Result<LineResult, String> {
    let parsed =
        serde_json::from_str(&String::from_utf8_lossy(body)).map_err(|e| format!("unreadable completion: {e}"));
    parsed.and_then(|body| chat::parse_completion(&body, None))
}

/// The delay every adapter reads from a `Retry-After` (seconds or HTTP date) or
/// `retry-after-ms` value, at a fixed clock of 2023-11-14T22:13:20Z.
pub fn retry_after(name: &str, value: &[u8]) -> Option<Duration> {
    let mut headers = HeaderMap::new();
    headers.insert(HeaderName::from_bytes(name.as_bytes()).ok()?, HeaderValue::from_bytes(value).ok()?);
    parse_retry_after(&headers, SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
}

/// An intake body through the handler's deserialization and the service's checks: the
/// extraction id it would get, or why not, prefixed with the API's error code for it
/// (`malformed_json` 400 and `invalid_input` 422 split as `http::extract::JsonBody` does;
/// `service:` for the checks, whose codes the HTTP layer picks).
pub fn intake(data: &[u8]) -> Result<ExtractionId, String> {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    let registry = REGISTRY.get_or_init(Registry::builtin);
    let body = serde_json::from_slice::<IntakeBody>(data).map_err(|e| {
        let code = if e.is_data() { "invalid_input" } else { "malformed_json" };
        format!("{code}: {e}")
    })?;
    let new = Service::prepare_intake(registry, crate::service::DEFAULT_MAX_METADATA_BYTES, body.into())
        .map_err(|e| format!("service: {e}"))?;
    let tenant_ok = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
    assert!((1..=128).contains(&new.tenant.len()) && new.tenant.bytes().all(tenant_ok), "{:?}", new.tenant);
    assert!((1..=1024).contains(&new.source_id.len()) && !new.source_id.chars().any(char::is_control));
    assert!(!new.content.is_empty());
    if let Some(metadata) = &new.metadata_json {
        assert!(
            serde_json::from_str::<Value>(metadata).is_ok_and(|v| v.is_object()),
            "metadata is stored as an object"
        );
    }
    let hash = SourceHash::compute(new.content.as_bytes(), &new.schema);
    assert_eq!(new.source_hash, hash);
    assert_eq!(new.id, ExtractionId::compute(&new.tenant, &new.source_id, &hash, &new.schema));
    Ok(new.id)
}

/// An OpenAI batch output or error file, and the same bytes as each JSON body the
/// adapter reads (batch, batch list, error).
pub fn openai_response(data: &[u8]) {
    for (line, parsed) in result_lines(data).zip(openai_result_file(data)) {
        if let Ok((custom_id, _)) = parsed {
            let value: Option<Value> = serde_json::from_str(&line).ok();
            let echoed = value.as_ref().and_then(|v| v["custom_id"].as_str());
            assert_eq!(echoed, Some(custom_id.as_str()), "the id parse_line joined on is the line's custom_id");
        }
    }
    let _ = serde_json::from_slice::<openai::Batch>(data);
    let _ = serde_json::from_slice::<openai::BatchList>(data);
    let _ = chat::ErrorParts::parse(&String::from_utf8_lossy(data));
}

/// An Anthropic results file, its timestamps, and the same bytes as each JSON body the
/// adapter reads (message batch, batch page, error).
pub fn anthropic_response(data: &[u8]) {
    for (line, parsed) in result_lines(data).zip(anthropic_result_file(data)) {
        let cheap_id = anthropic::custom_id(&line);
        if let Ok((custom_id, result)) = parsed {
            // find_job matches lines by the cheap read; it must agree with the full one.
            assert_eq!(cheap_id.as_deref(), Some(custom_id.as_str()));
            if let LineResult::Answer { usage: Some(usage), .. } | LineResult::Unusable { usage: Some(usage), .. } =
                &result
            {
                assert!(usage.input_tokens >= usage.cached_input_tokens, "cached tokens are part of the prompt");
                assert!(usage.input_tokens >= usage.cache_write_tokens, "written tokens are part of the prompt");
            }
        }
        let _ = anthropic::unix_ms(&line);
    }
    let batch_facts = |batch: &anthropic::MessageBatch| {
        let _ = batch.request_counts.total();
        let _ = batch.created_at.as_deref().and_then(anthropic::unix_ms);
    };
    if let Ok(batch) = serde_json::from_slice::<anthropic::MessageBatch>(data) {
        batch_facts(&batch);
    }
    if let Ok(page) = serde_json::from_slice::<anthropic::BatchPage>(data) {
        page.data.iter().for_each(batch_facts);
    }
    if let Ok(error) = serde_json::from_slice::<anthropic::ErrorBody>(data) {
        let _ = error.error.is_budget();
    }
}

/// A generic-contract JSONL result file, and the same bytes as a status envelope: its
/// error class under every status, its phase and its inline result items.
pub fn generic_response(data: &[u8]) {
    let fields = GenericFields::default();
    let check_item = |item: &Value| {
        if let Ok((custom_id, _)) = generic::parse_item(item, &fields) {
            assert_eq!(item.get(&fields.item_id).and_then(Value::as_str), Some(custom_id.as_str()));
        }
    };
    for line in result_lines(data) {
        if let Ok(item) = serde_json::from_str::<Value>(&line) {
            check_item(&item);
        }
    }
    let Ok(envelope) = serde_json::from_slice::<generic::Envelope>(data) else {
        return;
    };
    for status in STATUSES {
        let _ = generic::classify(Some(status), &HeaderMap::new(), envelope.error.as_ref());
    }
    let _ = envelope.error.as_ref().map(generic::ErrorObject::describe);
    let _ = generic::phase(&envelope.data, &fields);
    if let Some(items) = envelope.data.pointer(&fields.results).and_then(Value::as_array) {
        items.iter().for_each(check_item);
    }
    if let Some(usd) = envelope.metadata.and_then(|m| m.cost_usd) {
        let _ = generic::cost_micros(usd);
    }
}

/// A Google answer (Gemini, Vertex) as committed: only a candidate that stopped
/// (`finishReason: STOP`) with text is an answer, and thinking is billed as output.
fn check_google_answer(response: &Value, result: &LineResult) {
    if let LineResult::Answer { output, .. } = result {
        assert_eq!(response["candidates"][0]["finishReason"], "STOP", "only a finished candidate is committed");
        assert!(!output.is_empty() && output.trim() == output, "an answer is trimmed text: {output:?}");
    }
    if let LineResult::Answer { usage: Some(usage), .. } | LineResult::Unusable { usage: Some(usage), .. } = result {
        assert!(usage.output_tokens >= usage.reasoning_tokens, "thoughts are part of the output");
    }
}

/// A Gemini responses file, the same lines as `inlinedResponses` entries, and the same bytes
/// as each JSON body the adapter reads (operation, operation list, error): states, files,
/// error classes under every status, retry delays, and the refusal built from the body.
pub fn gemini_response(data: &[u8]) {
    for (line, parsed) in result_lines(data).zip(gemini_result_file(data)) {
        let value: Option<Value> = serde_json::from_str(&line).ok();
        let Some(value) = value else {
            assert!(parsed.is_err(), "an unreadable line is an error");
            continue;
        };
        if let Ok((key, result)) = &parsed {
            assert_eq!(key.as_deref(), value["key"].as_str(), "the key a row is joined on is its own");
            check_google_answer(&value["response"], result);
        }
        if let Ok((key, result)) = gemini::inline_row(&value) {
            assert_eq!(key.as_deref(), value["metadata"]["key"].as_str());
            check_google_answer(&value["response"], &result);
        }
    }
    let operation_facts = |operation: &gemini::Operation| {
        let _ = gemini::state(operation.state());
        let _ = (operation.display_name(), operation.files());
        if let Some(error) = &operation.error {
            let _ = (error.describe(), gemini::errored(error));
        }
        let inlined = operation.output().and_then(|o| o.inlined_responses.as_ref());
        for entry in inlined.map(|i| i.inlined_responses.as_slice()).unwrap_or_default() {
            if let Ok((_, result)) = gemini::inline_row(entry) {
                check_google_answer(&entry["response"], &result);
            }
        }
    };
    if let Ok(operation) = serde_json::from_slice::<gemini::Operation>(data) {
        operation_facts(&operation);
    }
    if let Ok(page) = serde_json::from_slice::<gemini::ListPage>(data) {
        page.operations.iter().for_each(operation_facts);
    }
    let body = String::from_utf8_lossy(data);
    if let Ok(error) = serde_json::from_slice::<gemini::ErrorBody>(data) {
        let status = &error.error;
        let _ = (status.describe(), status.retry_delay(), status.is_bad_key(), status.is_daily_quota());
        for code in STATUSES {
            let _ = gemini::classify(code, &HeaderMap::new(), Some(status));
        }
    }
    // The class under every status is read above; the refusal's message (redacted, which
    // is the costly part) and delay need only a refusal and a rate limit.
    for code in [400, 429] {
        let refused = gemini::refusal("gemini", code, &HeaderMap::new(), &body, "", "");
        assert_eq!(refused.status, Some(code));
    }
}

/// A Mistral output or error file, and the same bytes as each JSON body the adapter reads
/// (job, job list, error).
pub fn mistral_response(data: &[u8]) {
    for (line, parsed) in result_lines(data).zip(mistral_result_file(data)) {
        let Ok((custom_id, result)) = parsed else { continue };
        // A field the parser skips may hold what a `Value` cannot (a number past f64).
        let Ok(value) = serde_json::from_str::<Value>(&line) else { continue };
        assert_eq!(value["custom_id"].as_str(), Some(custom_id.as_str()), "joined on the line's own custom_id");
        if matches!(result, LineResult::Answer { .. }) {
            assert_eq!(value["response"]["status_code"], 200, "only a 200 response is an answer");
        }
    }
    let job_facts = |job: &mistral::Job| {
        let _ = (mistral::state(&job.status), job.batch_key());
    };
    if let Ok(job) = serde_json::from_slice::<mistral::Job>(data) {
        job_facts(&job);
    }
    if let Ok(list) = serde_json::from_slice::<mistral::JobList>(data) {
        list.data.iter().for_each(job_facts);
    }
    let _ = mistral::ErrorParts::parse(&String::from_utf8_lossy(data));
}

/// A Bedrock `.jsonl.out` file, and the same bytes as each JSON body the control plane
/// answers (created job, job, job list, error): states and error classes.
pub fn bedrock_response(data: &[u8]) {
    for (line, parsed) in result_lines(data).zip(bedrock_result_file(data)) {
        let Ok((record_id, result)) = parsed else { continue };
        // A field the parser skips may hold what a `Value` cannot (a number past f64).
        let Ok(value) = serde_json::from_str::<Value>(&line) else { continue };
        assert_eq!(value["recordId"].as_str(), Some(record_id.as_str()), "joined on the record's own recordId");
        if value["error"].is_object() {
            assert!(
                matches!(result, LineResult::Refused { .. } | LineResult::Retry { .. }),
                "a record that errored is never an answer: {result:?}"
            );
        }
        if let LineResult::Answer { usage: Some(usage), .. } | LineResult::Unusable { usage: Some(usage), .. } = &result
        {
            // Claude's usage on Bedrock is read as Anthropic's: the same sums.
            assert!(usage.input_tokens >= usage.cached_input_tokens, "cached tokens are part of the prompt");
            assert!(usage.input_tokens >= usage.cache_write_tokens, "written tokens are part of the prompt");
        }
    }
    let _ = serde_json::from_slice::<bedrock::Created>(data);
    let job_facts = |job: &bedrock::Job| {
        let _ = bedrock::state(&job.status);
    };
    if let Ok(job) = serde_json::from_slice::<bedrock::Job>(data) {
        job_facts(&job);
    }
    if let Ok(list) = serde_json::from_slice::<bedrock::JobList>(data) {
        list.invocation_job_summaries.iter().for_each(job_facts);
    }
    if let Ok(error) = serde_json::from_slice::<bedrock::ErrorBody>(data)
        && let Some(kind) = &error.kind
    {
        let _ = bedrock::classify(bedrock::error_name(kind));
    }
    let _ = bedrock::classify(bedrock::error_name(&String::from_utf8_lossy(data)));
}

/// A Vertex predictions file, and the same bytes as a job and a job list: states and the
/// input files a job names.
pub fn vertex_response(data: &[u8]) {
    for (line, parsed) in result_lines(data).zip(vertex_result_file(data)) {
        let Ok((key, result)) = parsed else { continue };
        // A field the parser skips may hold what a `Value` cannot (a number past f64).
        let Ok(value) = serde_json::from_str::<Value>(&line) else { continue };
        assert_eq!(value["key"].as_str(), Some(key.as_str()), "joined on the line's own key");
        if value["status"].as_str().is_some_and(|s| !s.trim().is_empty()) {
            assert!(!matches!(result, LineResult::Answer { .. }), "a line with a status ran no answer");
        } else {
            check_google_answer(&value["response"], &result);
        }
    }
    let job_facts = |job: &vertex::Job| {
        let _ = (vertex::state(job.state()), job.input_uris());
        if let Some(error) = &job.error {
            let _ = error.describe();
        }
    };
    if let Ok(job) = serde_json::from_slice::<vertex::Job>(data) {
        job_facts(&job);
    }
    if let Ok(list) = serde_json::from_slice::<vertex::JobList>(data) {
        list.batch_prediction_jobs.iter().for_each(job_facts);
    }
}

/// One HTTP answer of a chat completions server: the first line is the value of every
/// retry header (`retry-after`, `retry-after-ms`, `x-should-retry`), the rest the body,
/// read as a completion and as an error body.
pub fn chat_response(data: &[u8]) {
    let (header, body) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (&[][..], data),
    };
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(header) {
        for name in ["retry-after", "retry-after-ms", "x-should-retry"] {
            headers.insert(HeaderName::from_static(name), value.clone());
        }
    }
    let _ = parse_retry_after(&headers, SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
    let _ = chat_completion(body);
    let error = chat::ErrorParts::parse(&String::from_utf8_lossy(body));
    for status in STATUSES {
        let _ = classify_status(status, &headers, error.code.as_deref());
    }
}

/// A webhook delivery, one field per line: secret, id, timestamp, signature, our clock
/// (Unix seconds), tolerance (seconds), then the raw body. A missing line is a missing
/// header. Checks both verifiers against `Scheme::verify`, and that a delivery signed
/// with the secret verifies, and stops verifying when tampered with or late.
pub fn webhook_verify(data: &[u8]) {
    let parts: Vec<&[u8]> = data.splitn(7, |b| *b == b'\n').collect();
    let text = |i: usize| parts.get(i).map(|p| String::from_utf8_lossy(p).into_owned());
    let number = |i: usize| text(i).and_then(|t| t.trim().parse::<u64>().ok());
    let secret = text(0).unwrap_or_default();
    let (id, timestamp, signature) = (text(1), text(2), text(3));
    let now = number(4).unwrap_or(0);
    let tolerance = Duration::from_secs(number(5).unwrap_or(300));
    let body = parts.get(6).copied().unwrap_or_default();
    let secrets: Vec<WebhookSecret> =
        [WebhookSecret::standard(&secret).ok(), WebhookSecret::github(&secret).ok()].into_iter().flatten().collect();

    let headers =
        StandardHeaders { id: id.as_deref(), timestamp: timestamp.as_deref(), signature: signature.as_deref() };
    let standard = webhook::verify_standard(&secrets, headers, body, now, tolerance);
    let pairs = [(WEBHOOK_ID, &id), (WEBHOOK_TIMESTAMP, &timestamp), (WEBHOOK_SIGNATURE, &signature)];
    let lookup = |name: &str| pairs.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).and_then(|(_, v)| v.as_deref());
    assert_eq!(Scheme::Standard.verify(&secrets, &lookup, body, now, tolerance), standard);
    if let Ok(delivery) = &standard {
        assert_eq!(Some(delivery.id.as_str()), id.as_deref());
        let sent = timestamp.as_deref().and_then(|t| t.parse::<u64>().ok()).unwrap_or(u64::MAX);
        assert!(sent.abs_diff(now) <= tolerance.as_secs(), "accepted outside the window");
    }
    let github = webhook::verify_github(&secrets, signature.as_deref(), id.as_deref(), body);
    let pairs = [(GITHUB_SIGNATURE, &signature), (GITHUB_DELIVERY, &id)];
    let lookup = |name: &str| pairs.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).and_then(|(_, v)| v.as_deref());
    assert_eq!(Scheme::Github.verify(&secrets, &lookup, body, now, tolerance), github);

    let Some(id) = id.as_deref() else { return };
    let id_fits = !id.is_empty() && id.len() <= MAX_DELIVERY_ID_LEN;
    let mut tampered = body.to_vec();
    tampered.push(b'x');
    for secret in &secrets {
        let signed = webhook::sign_standard(secret, id, now, body);
        let sent = now.to_string();
        let verify = |body: &[u8], at: u64| {
            let headers = StandardHeaders { id: Some(id), timestamp: Some(&sent), signature: Some(&signed) };
            webhook::verify_standard(&secrets, headers, body, at, tolerance)
        };
        assert_eq!(verify(body, now).is_ok(), id_fits && !id.contains('.'), "a signed delivery verifies");
        if id_fits && !id.contains('.') {
            assert_eq!(verify(&tampered, now), Err(SignatureError::SignatureMismatch));
            if let Some(late) = now.checked_add(tolerance.as_secs()).and_then(|t| t.checked_add(1)) {
                assert!(matches!(verify(body, late), Err(SignatureError::TimestampTooOld { .. })));
            }
            if let Some(early) = now.checked_sub(tolerance.as_secs()).and_then(|t| t.checked_sub(1)) {
                assert!(matches!(verify(body, early), Err(SignatureError::TimestampInFuture { .. })));
            }
        }
        let signed = webhook::sign_github(secret, body);
        let verify = |body: &[u8]| webhook::verify_github(&secrets, Some(&signed), Some(id), body);
        assert_eq!(verify(body).is_ok(), id_fits, "a signed GitHub delivery verifies");
        if id_fits {
            assert_eq!(verify(&tampered), Err(SignatureError::SignatureMismatch));
        }
    }
}

/// A stored value: the first byte picks the record type, the rest is the value as redb
/// holds it (format version byte, then bincode). Whatever decodes must re-encode and
/// decode to itself.
pub fn store_decode(data: &[u8]) {
    let Some((&kind, bytes)) = data.split_first() else { return };
    match kind % 8 {
        0 => round_trip::<ExtractionRecord>(bytes),
        1 => round_trip::<StoredContent>(bytes),
        2 => round_trip::<FindingRecord>(bytes),
        3 => round_trip::<ResultRecord>(bytes),
        4 => round_trip::<BatchRecord>(bytes),
        5 => round_trip::<LedgerRecord>(bytes),
        6 => round_trip::<StagedAnswer>(bytes),
        _ => round_trip::<OutboxRecord>(bytes),
    }
}

fn round_trip<T: Versioned + PartialEq + std::fmt::Debug>(bytes: &[u8]) {
    let Ok(value) = decode::<T>(bytes) else { return };
    let encoded = encode(&value);
    assert!(encoded.is_ok(), "{}: a decoded value does not encode: {encoded:?}", T::KIND);
    let again = encoded.map_err(|e| e.to_string()).and_then(|bytes| decode::<T>(&bytes).map_err(|e| e.to_string()));
    assert_eq!(again.as_ref(), Ok(&value), "{}: decode(encode(x)) != x", T::KIND);
}

/// A `POST /v1/extractions` body: deserialized as the handler does, then put through the
/// service's input checks and identity computation against the built-in schemas.
pub fn intake_body(data: &[u8]) {
    let _ = intake(data);
}
