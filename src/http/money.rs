//! Cost endpoints: a tenant's totals over a range, and one extraction's attempts.

use axum::Extension;
use axum::extract::{Path, State};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::CallerExt;
use super::error::ApiError;
use super::extract::{IdPath, QueryParams};
use super::handlers::{Reply, ok};
use crate::ledger::{CostQuery, GroupBy};
use crate::service::Service;
use crate::store::{ChargeKind, CostSource, LedgerRecord};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostsQuery {
    from: Option<String>,
    to: Option<String>,
    group_by: Option<GroupBy>,
}

/// RFC 3339 (`2026-11-01T00:00:00Z`) or a plain UTC date (`2026-11-01`).
pub fn parse_time(field: &'static str, text: &str) -> Result<u64, ApiError> {
    let full = if text.len() == 10 { format!("{text}T00:00:00Z") } else { text.to_string() };
    humantime::parse_rfc3339_weak(&full)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64)
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid_query",
                format!("{field}: {text:?} is not a date like 2026-11-01 or an RFC 3339 time"),
            )
        })
}

pub async fn tenant_costs(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    Path(tenant): Path<String>,
    QueryParams(q): QueryParams<CostsQuery>,
) -> Reply {
    caller.may_reach(&tenant)?;
    let now = crate::clock::now_ms();
    // Without a range: the current UTC month so far.
    let from_ms = match &q.from {
        Some(text) => parse_time("from", text)?,
        None => crate::ledger::Budgets::default().period_start_day(now) * crate::store::store_day_ms(),
    };
    let to_ms = match &q.to {
        Some(text) => parse_time("to", text)?,
        None => now + 1,
    };
    let report = service.costs(CostQuery { tenant, from_ms, to_ms, group_by: q.group_by }).await?;
    let mut body = serde_json::to_value(&report).unwrap_or(Value::Null);
    body["from"] = json!(crate::clock::format_ms(from_ms));
    body["to"] = json!(crate::clock::format_ms(to_ms));
    ok(body)
}

pub async fn extraction_costs(
    State(service): State<Service>,
    Extension(caller): CallerExt,
    IdPath(id): IdPath,
) -> Reply {
    let (tenant, entries) = service.extraction_costs(id).await?;
    caller.may_reach(&tenant)?;
    let charged: u64 = entries.iter().map(|e| e.cost_micros).sum();
    ok(json!({
        "extraction_id": id.to_hex(),
        "tenant": tenant,
        "charged_micros": charged,
        "attempts": entries.iter().map(entry).collect::<Vec<_>>(),
    }))
}

pub fn entry(e: &LedgerRecord) -> Value {
    json!({
        "kind": match e.kind {
            ChargeKind::Fresh => "fresh",
            ChargeKind::Replay => "replay",
            ChargeKind::FailedValidation => "failed_validation",
        },
        "attempt": e.attempt,
        "provider": e.provider,
        "model": e.usage.model,
        "job_id": e.job_id,
        "request_id": e.usage.request_id,
        "input_tokens": e.usage.input_tokens,
        "cached_input_tokens": e.usage.cached_input_tokens,
        "cache_write_tokens": e.usage.cache_write_tokens,
        "output_tokens": e.usage.output_tokens,
        "reasoning_tokens": e.usage.reasoning_tokens,
        "latency_ms": e.latency_ms,
        "cost_micros": e.cost_micros,
        "list_cost_micros": e.list_cost_micros,
        "cost_source": match e.cost_source {
            CostSource::PriceTable => "price_table",
            CostSource::Provider => "provider",
            CostSource::Unpriced => "unpriced",
        },
        "at": crate::clock::format_ms(e.at_ms),
    })
}
