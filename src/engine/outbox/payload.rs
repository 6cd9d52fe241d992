//! The JSON body of an outbox event. Built at delivery time from the store: a committed
//! extraction's findings never change, and a failed event carries its own reason, so the
//! body is the same on every attempt.

use serde_json::{Value, json};

use crate::domain::clock;
use crate::domain::schema::Registry;
use crate::store::seam::Backend;
use crate::store::{self, OutboxKind, OutboxRecord};

/// A finding as the API and exports show it, `{"finding_key", …its fields}`, plus the shape
/// events had before (`key` and the body under `finding`), kept for one release where the
/// body has no field of those names (docs/API.md, "Outbox").
fn finding(key: &str, body_json: &str) -> Value {
    let body = serde_json::from_str::<Value>(body_json).unwrap_or(Value::Null);
    let mut shown = match &body {
        Value::Object(fields) => fields.clone(),
        _ => serde_json::Map::new(),
    };
    shown.insert("finding_key".into(), json!(key));
    for (old, value) in [("key", json!(key)), ("finding", body)] {
        shown.entry(old).or_insert(value);
    }
    Value::Object(shown)
}

pub(crate) async fn event_body(
    store: &dyn Backend,
    registry: &Registry,
    event: &OutboxRecord,
) -> Result<Vec<u8>, store::Error> {
    let record = store.get_by_seq(event.extraction_seq).await?;
    let (kind, mut data) = match &event.kind {
        OutboxKind::Committed | OutboxKind::Revision { .. } => {
            let findings = store.findings(event.extraction_id).await?.unwrap_or_default();
            let findings: Vec<Value> = findings.iter().map(|f| finding(&f.key.to_string(), &f.body_json)).collect();
            // A revision names the one it superseded and the findings diff against it
            // (`null` across schema versions); a first revision supersedes nothing.
            let (supersedes, diff) = match &event.kind {
                OutboxKind::Revision { supersedes, diff } => (
                    json!(supersedes.to_string()),
                    diff.map_or(
                        Value::Null,
                        |d| json!({ "introduced": d.introduced, "resolved": d.resolved, "unchanged": d.unchanged }),
                    ),
                ),
                _ => (Value::Null, Value::Null),
            };
            // What the output says besides its findings, from the raw result (null once
            // retention dropped it, or when its schema is no longer loaded).
            let fields = match (&record, store.result(event.extraction_id).await?) {
                (Some(record), Some(result)) => registry.output_fields(&record.schema, &result.output_json),
                _ => None,
            };
            let data = json!({ "findings": findings, "output_fields": fields, "supersedes": supersedes, "diff": diff });
            ("extraction.committed", data)
        }
        OutboxKind::Superseded { by } => ("extraction.superseded", json!({ "superseded_by": by.to_string() })),
        OutboxKind::Failed { class, reason } => {
            ("extraction.failed", json!({ "failure": { "class": class.as_str(), "reason": reason } }))
        }
        OutboxKind::Cancelled => ("extraction.cancelled", json!({})),
    };
    data["id"] = json!(event.extraction_id.to_string());
    data["tenant"] = json!(event.tenant);
    data["attempt"] = json!(event.attempt);
    if let Some(record) = record {
        data["source_id"] = json!(record.source_id);
        data["schema"] = json!(record.schema);
    }
    let body = json!({ "type": kind, "timestamp": clock::format_ms(event.created_at_ms), "data": data });
    serde_json::to_vec(&body).map_err(|e| store::Error::Encode { kind: "event body", reason: e.to_string() })
}
