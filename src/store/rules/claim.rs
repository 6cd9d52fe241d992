//! What a worker's claim does to each candidate its backend found (expired leases first,
//! then pending work in intake order): the lease it is handed, with its fencing token and
//! expiry, and the state the extraction moves to. The same on both backends, so a token
//! from one reads like a token from the other.

use crate::domain::lifecycle::{self, Event, Outcome, State};
use crate::domain::names::LeaseToken;
use crate::store::records::ExtractionRecord;
use crate::store::rules::fair::Limits;
use crate::store::rules::intent::WorkFilter;
use crate::store::seam::{ClaimRequest, Grant};
use std::sync::Arc;

/// A lease one candidate is granted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store) struct Lease {
    pub token: LeaseToken,
    pub expires_at_ms: u64,
}

impl Lease {
    /// What the worker is handed once the claim is written.
    pub(in crate::store) fn grant(self, record: ExtractionRecord, content: String) -> Grant {
        Grant { record, content, lease_token: self.token, lease_expires_at_ms: self.expires_at_ms }
    }
}

/// The lease `record` is granted now (counted on it) and the state it moves to; `None` when it is not claimable
/// after all (a stale index entry): the claim skips it rather than fail. `nonce` is the
/// token's random part.
pub(in crate::store) fn claim(
    record: &mut ExtractionRecord,
    request: &ClaimRequest,
    now_ms: u64,
    nonce: u128,
) -> Option<(State, Lease)> {
    let token = lease_token(record.claims + 1, nonce);
    let expires_at_ms = now_ms.saturating_add(request.lease_ms);
    let event = Event::Claim { worker: request.worker.clone(), lease_token: token.clone(), expires_at_ms };
    let Ok(Outcome::Changed(next)) = lifecycle::apply(&record.state, event, now_ms) else {
        return None;
    };
    record.claims += 1;
    Some((next, Lease { token, expires_at_ms }))
}

/// Whether the claim asks for work of this record's schema, and the worker's scope
/// covers its tenant and schema.
pub(in crate::store) fn wanted(request: &ClaimRequest, record: &ExtractionRecord) -> bool {
    request.schema.as_ref().is_none_or(|s| *s == record.schema) && request.scope.covers(&record.tenant, &record.schema)
}

/// What the fair pick may add to the `already` expired leases a claim took.
pub(in crate::store) fn limits(request: &ClaimRequest, already: usize) -> Limits {
    Limits { count: request.limit.saturating_sub(already), bytes: u64::MAX }
}

/// The rotation claims for this schema (or for any) share.
pub(in crate::store) fn queue(request: &ClaimRequest) -> String {
    format!("claim/{}", request.schema.as_deref().unwrap_or("*"))
}

/// The pending work a claim's fair pick may take: what the worker's scope covers.
pub(in crate::store) fn accepted(request: &ClaimRequest) -> WorkFilter {
    let scope = request.scope.clone();
    WorkFilter(Arc::new(move |tenant: &str, schema: &str| scope.covers(tenant, schema)))
}

/// Fencing tokens: the claim number orders them for humans, the random part makes them
/// unguessable for other workers.
fn lease_token(claim_number: u32, nonce: u128) -> LeaseToken {
    LeaseToken::new(format!("lt-{claim_number}-{nonce:032x}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::rules::fixtures::record;

    fn request(schema: Option<&str>) -> ClaimRequest {
        ClaimRequest {
            worker: "w1".into(),
            limit: 10,
            lease_ms: 30_000,
            schema: schema.map(str::to_string),
            estimate: None,
            scope: Default::default(),
        }
    }

    #[test]
    fn pending_work_is_leased_with_a_numbered_token_until_now_plus_the_lease() {
        let mut pending = record(State::Pending);
        pending.claims = 2;
        let (next, lease) = claim(&mut pending, &request(None), 1_000, 0xab).unwrap();
        assert_eq!(lease.token.as_str(), format!("lt-3-{:032x}", 0xab));
        assert_eq!(lease.expires_at_ms, 31_000);
        assert_eq!(
            next,
            State::Claimed { worker: "w1".into(), lease_token: lease.token.clone(), expires_at_ms: 31_000 }
        );
        assert_eq!(pending.claims, 3, "the claim is counted on the record");
        let grant = lease.grant(pending, "text".into());
        assert_eq!((grant.lease_expires_at_ms, grant.content.as_str()), (31_000, "text"));
    }

    #[test]
    fn work_that_is_not_claimable_is_skipped_and_left_uncounted() {
        let mut committed = record(State::Committed { at_ms: 5 });
        assert_eq!(claim(&mut committed, &request(None), 1_000, 1), None);
        assert_eq!(committed.claims, 0);
        let held = LeaseToken::new("lt-1-x");
        let mut live = record(State::Claimed { worker: "w0".into(), lease_token: held, expires_at_ms: 2_000 });
        assert_eq!(claim(&mut live, &request(None), 1_000, 1), None, "a live lease is not taken over");
        let mut expired = live.clone();
        assert!(claim(&mut expired, &request(None), 2_000, 1).is_some(), "an expired one is");
    }

    #[test]
    fn a_claim_for_one_schema_wants_only_that_schema() {
        let r = record(State::Pending);
        assert!(wanted(&request(None), &r));
        assert!(wanted(&request(Some("code-review@1")), &r));
        assert!(!wanted(&request(Some("invoice@1")), &r));
    }

    #[test]
    fn a_scoped_worker_wants_only_its_tenants_and_schemas() {
        let r = record(State::Pending);
        let mut scoped = request(None);
        scoped.scope.tenants = Some(vec!["globex".into()]);
        assert!(!wanted(&scoped, &r), "tenant {:?} is outside the scope", r.tenant);
        assert!(!(accepted(&scoped).0)(&r.tenant, &r.schema), "and the fair pick refuses it too");
        scoped.scope.tenants = Some(vec!["globex".into(), r.tenant.clone()]);
        assert!(wanted(&scoped, &r));
        scoped.scope.schemas = Some(vec!["invoice@1".into()]);
        assert!(!wanted(&scoped, &r), "schema {:?} is outside the scope", r.schema);
        assert!(!(accepted(&scoped).0)(&r.tenant, &r.schema));
        scoped.scope.schemas = Some(vec![r.schema.clone()]);
        assert!(wanted(&scoped, &r) && (accepted(&scoped).0)(&r.tenant, &r.schema));
    }
}
