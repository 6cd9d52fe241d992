//! Intake: input checks, identity, and the store's exactly-once create (also on behalf
//! of verified webhook deliveries).

use serde_json::Value;
use tracing::Instrument;
use tracing::field::Empty;

use super::{Error, IntakeRequest, Service, invalid};
use crate::domain::identity::{ExtractionId, SourceHash};
use crate::domain::schema::Registry;
use crate::domain::trace::{self, TraceRoot};
use crate::store::{DeliveryOutcome, IntakeOutcome, NewExtraction};

impl Service {
    pub async fn intake(&self, request: IntakeRequest) -> Result<IntakeOutcome, Error> {
        let new = Self::prepare_intake(self.judge.registry(), self.max_metadata_bytes, request)?;
        let span = intake_span(&new);
        let outcome = self.store.intake(new).instrument(span.clone()).await;
        record_intake(&span, outcome.as_ref().map(|o| o.created));
        let outcome = outcome?;
        self.count_intake(&outcome);
        Ok(outcome)
    }

    /// Intake for a verified webhook delivery: the delivery id is stored in the same
    /// transaction, and a redelivery returns what the first delivery created.
    pub async fn intake_delivery(
        &self,
        endpoint: &str,
        delivery_id: &str,
        request: IntakeRequest,
    ) -> Result<(IntakeOutcome, bool), Error> {
        // A redelivery is answered before the payload is even checked: it may be a
        // retry of a request whose content we accepted under an older schema set.
        if let Some(record) = self.store.delivered(endpoint.to_string(), delivery_id.to_string()).await? {
            metrics::counter!(crate::domain::metric_names::WEBHOOK_REDELIVERIES_TOTAL).increment(1);
            return Ok((IntakeOutcome { created: false, record }, true));
        }
        let new = Self::prepare_intake(self.judge.registry(), self.max_metadata_bytes, request)?;
        let span = intake_span(&new);
        let delivered = self.store.intake_delivery(endpoint.to_string(), delivery_id.to_string(), new);
        let delivered = delivered.instrument(span.clone()).await;
        record_intake(&span, delivered.as_ref().map(|d| matches!(d, DeliveryOutcome::First(o) if o.created)));
        match delivered? {
            DeliveryOutcome::First(outcome) => {
                self.count_intake(&outcome);
                Ok((outcome, false))
            }
            DeliveryOutcome::Redelivery(record) => {
                metrics::counter!(crate::domain::metric_names::WEBHOOK_REDELIVERIES_TOTAL).increment(1);
                Ok((IntakeOutcome { created: false, record }, true))
            }
        }
    }

    fn count_intake(&self, outcome: &IntakeOutcome) {
        let result = if outcome.created { "created" } else { "duplicate" };
        metrics::counter!(crate::domain::metric_names::INTAKES_TOTAL, "result" => result).increment(1);
        if outcome.created {
            self.signals.arrived();
        }
    }

    /// The input checks and identity of an intake, without the store (also run by the fuzzers).
    pub(crate) fn prepare_intake(
        registry: &Registry,
        max_metadata_bytes: usize,
        request: IntakeRequest,
    ) -> Result<NewExtraction, Error> {
        check_tenant(&request.tenant)?;
        check_text("source_id", &request.source_id, 1024)?;
        if request.content.is_empty() {
            return Err(invalid("content", "must not be empty"));
        }
        let metadata_json = match request.metadata {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.to_string()),
            Some(_) => return Err(invalid("metadata", "must be a JSON object")),
        };
        // Measured as stored (compact JSON), so what is refused does not depend on how
        // the sender spaced it.
        if let Some(bytes) = metadata_json.as_ref().map(String::len).filter(|&n| n > max_metadata_bytes) {
            return Err(Error::MetadataTooLarge { bytes, max: max_metadata_bytes });
        }
        let schema = registry.get(&request.schema)?;
        let source_hash = SourceHash::compute(request.content.as_bytes(), schema.name());
        let id = ExtractionId::compute(&request.tenant, &request.source_id, &source_hash, schema.name());
        Ok(NewExtraction {
            id,
            tenant: request.tenant,
            source_id: request.source_id,
            source_hash,
            schema: request.schema,
            metadata_json,
            content: request.content,
        })
    }
}

/// The intake's span in the extraction's trace (docs/OPERATIONS.md, "Traces"): identities
/// and sizes, never the content or the metadata.
fn intake_span(new: &NewExtraction) -> tracing::Span {
    let span = tracing::trace_span!(
        target: trace::TARGET, "intake",
        extraction = %new.id, tenant = %new.tenant, schema = %new.schema,
        content_bytes = new.content.len(), outcome = Empty, "commitpoint.root" = Empty,
    );
    TraceRoot::of_extraction(&new.id).adopt(&span);
    span
}

/// The first intake of an extraction is its trace's root; a duplicate is a child of it.
fn record_intake<E>(span: &tracing::Span, created: Result<bool, &E>) {
    let outcome = match created {
        Ok(true) => "created",
        Ok(false) => "duplicate",
        Err(_) => "error",
    };
    span.record("outcome", outcome);
    if created.is_ok_and(|c| c) {
        span.record(trace::ROOT_FIELD, true);
    }
}

/// Tenants appear in URLs and metrics labels, so they are kept to a safe alphabet.
pub(super) fn check_tenant(tenant: &str) -> Result<(), Error> {
    let ok = !tenant.is_empty()
        && tenant.len() <= 128
        && tenant.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok { Ok(()) } else { Err(invalid("tenant", "must be 1-128 characters of [A-Za-z0-9._-]")) }
}

/// Limits count bytes of UTF-8, as the API documents: they bound what the store keeps.
/// (The OpenAPI `maxLength`, which counts characters, is the same number, so it is an
/// upper bound; a value within it may still be over in bytes.)
pub(super) fn check_text(field: &'static str, value: &str, max_bytes: usize) -> Result<(), Error> {
    if value.is_empty() {
        return Err(invalid(field, "must not be empty"));
    }
    if value.len() > max_bytes {
        return Err(invalid(field, format!("must be at most {max_bytes} bytes of UTF-8")));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(field, "must not contain control characters"));
    }
    if let Some(c) = value.chars().find(|c| reorders_text(*c)) {
        return Err(invalid(
            field,
            format!(
                "must not contain U+{:04X}, a character that breaks or reorders the text it is shown in",
                u32::from(c)
            ),
        ));
    }
    Ok(())
}

/// Bidirectional formatting characters and the Unicode line and paragraph separators: in a
/// listing, a log line or a spreadsheet they make one value look like another (U+202E before
/// `fdp.exe` shows it as `exe.pdf`) or start a new line, though none of them is a
/// control character to `char::is_control`.
fn reorders_text(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{2028}' | '\u{2029}')
}
