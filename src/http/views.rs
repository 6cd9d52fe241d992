//! How stored records look in JSON. States are lowercase words; timestamps RFC 3339.

use serde_json::{Map, Value, json};

use crate::clock::format_ms;
use crate::lifecycle::State;
use crate::store::{ExtractionRecord, FindingRecord, Grant};

pub fn extraction(r: &ExtractionRecord) -> Value {
    let (failure_class, failure_reason) = match &r.state {
        State::Failed { class, reason } => (json!(class.as_str()), json!(reason)),
        _ => (Value::Null, Value::Null),
    };
    let (worker, lease_expires_at) = match &r.state {
        State::Claimed { worker, expires_at_ms, .. } => (json!(worker), json!(format_ms(*expires_at_ms))),
        _ => (Value::Null, Value::Null),
    };
    let committed_at = match r.state {
        State::Committed { at_ms } => json!(format_ms(at_ms)),
        _ => Value::Null,
    };
    json!({
        "extraction_id": r.id.to_hex(),
        "tenant": r.tenant,
        "source_id": r.source_id,
        "source_hash": r.source_hash.to_hex(),
        "schema": r.schema,
        "state": r.state.name().as_str(),
        "failure_class": failure_class,
        "failure_reason": failure_reason,
        "worker": worker,
        "lease_expires_at": lease_expires_at,
        "attempts": r.attempt,
        "claims": r.claims,
        "content_bytes": r.content_bytes,
        "metadata": metadata(r),
        "created_at": format_ms(r.created_at_ms),
        "updated_at": format_ms(r.updated_at_ms),
        "committed_at": committed_at,
    })
}

pub fn grant(g: &Grant) -> Value {
    json!({
        "extraction_id": g.record.id.to_hex(),
        "lease_token": g.lease_token,
        "lease_expires_at": format_ms(g.lease_expires_at_ms),
        "tenant": g.record.tenant,
        "source_id": g.record.source_id,
        "schema": g.record.schema,
        "attempt": g.record.attempt,
        "metadata": metadata(&g.record),
        "content": g.content,
    })
}

/// The stored finding with its key added; non-object findings are wrapped under `value`.
pub fn finding(f: &FindingRecord) -> Value {
    let body: Value = serde_json::from_str(&f.body_json).unwrap_or(Value::Null);
    let mut out = Map::new();
    out.insert("finding_key".into(), json!(f.key.to_hex()));
    match body {
        Value::Object(fields) => out.extend(fields.into_iter().filter(|(k, _)| k != "finding_key")),
        other => {
            out.insert("value".into(), other);
        }
    }
    Value::Object(out)
}

fn metadata(r: &ExtractionRecord) -> Value {
    r.metadata_json.as_deref().and_then(|m| serde_json::from_str(m).ok()).unwrap_or(Value::Null)
}
