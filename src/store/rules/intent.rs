//! When a provider's intent is formed from the work the fair pick chose, and the record
//! it starts as. Both backends fill intents by these rules, so a batch takes the same members
//! at the same moment on redb and on PostgreSQL.

use crate::store::records::{BatchRecord, BatchState};
use std::sync::Arc;

use crate::domain::identity::{ExtractionId, batch_key};
use crate::domain::lifecycle::Event;
use crate::store::ExtractionRecord;
use crate::store::rules::fair::{Limits, Picked, Rotation};
use crate::store::rules::reserve::MemberEstimate;

/// Decides, by (tenant, schema), whether pending work may join a batch for this provider:
/// routing and budget holds, decided outside the store.
#[derive(Clone)]
pub struct WorkFilter(pub Arc<AcceptFn>);

/// `(tenant, schema) -> may this provider take it`.
pub(in crate::store) type AcceptFn = dyn Fn(&str, &str) -> bool + Send + Sync;

impl std::fmt::Debug for WorkFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkFilter")
    }
}

#[derive(Debug, Clone)]
pub struct IntentRequest {
    pub provider: String,
    pub schema: String,
    pub accept: WorkFilter,
    pub max_size: usize,
    /// Most content bytes in one batch (providers cap the input file's size).
    pub max_content_bytes: u64,
    /// Form a batch smaller than `max_size` only once its oldest member waited this long.
    pub max_wait_ms: u64,
    /// The fewest members the provider takes in one job (Amazon Bedrock: 100), if any.
    pub minimum: Option<Minimum>,
    /// What a member will cost at this provider, reserved against its tenant's budget;
    /// `None` where no price is known (budgets then act on charged spend only).
    pub estimate: Option<MemberEstimate>,
}

/// A provider's smallest job, and how long work waits to make one up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minimum {
    pub size: usize,
    /// Once the oldest member waited this long, fewer are formed into an intent anyway:
    /// bound to `fallback` where one is configured, else the scheduler fails them, naming
    /// the minimum, rather than send a job the provider refuses or keep them waiting for ever.
    pub wait_ms: u64,
    /// The provider (without a minimum of its own) an intent under the minimum is bound
    /// to: its scheduler submits it like one of its own (`min_batch_fallback`).
    pub fallback: Option<String>,
}

/// The provider an intent of `members` is bound to: the one forming it, or, under its
/// minimum, the minimum's fallback. The one place work is handed from one provider to
/// another after routing chose the first.
pub(crate) fn bound_to(request: &IntentRequest, members: usize) -> &str {
    request
        .minimum
        .as_ref()
        .filter(|m| members < m.size)
        .and_then(|m| m.fallback.as_deref())
        .unwrap_or(request.provider.as_str())
}

#[derive(Debug, Clone)]
pub enum IntentOutcome {
    Created(Box<BatchRecord>),
    /// Some work is waiting; a batch is due at this time unless it fills up first.
    Waiting {
        due_at_ms: u64,
        /// How many extractions of this schema are waiting now.
        members: usize,
    },
    Nothing,
}

/// What the oldest pending work amounts to for one intent.
pub(crate) enum Filling {
    /// No batch now: nothing is pending, or too little has waited too briefly.
    NotYet(IntentOutcome),
    /// These members form a batch now.
    Due(Vec<ExtractionRecord>),
}

/// What one batch of this intent may hold.
pub(crate) fn limits(request: &IntentRequest) -> Limits {
    Limits { count: request.max_size, bytes: request.max_content_bytes }
}

/// The rotation this provider's batches of this schema share.
pub(crate) fn queue(request: &IntentRequest) -> String {
    format!("intent/{}/{}", request.provider, request.schema)
}

/// Whether the fair pick (`rules::fair`) makes a batch now. A batch that is not full is
/// due once its oldest member has waited `max_wait_ms`; one under the provider's minimum,
/// once it has waited the minimum's `wait_ms` (later work joins it meanwhile).
pub(crate) fn fill(picked: Picked<ExtractionRecord>, request: &IntentRequest, now_ms: u64) -> Filling {
    let Some(oldest) = picked.items.iter().map(|m| m.updated_at_ms).min() else {
        return Filling::NotYet(IntentOutcome::Nothing);
    };
    let waited = now_ms.saturating_sub(oldest);
    let members = picked.items.len();
    if !picked.full && waited < request.max_wait_ms {
        let due_at_ms = oldest.saturating_add(request.max_wait_ms);
        return Filling::NotYet(IntentOutcome::Waiting { due_at_ms, members });
    }
    if let Some(minimum) = request.minimum.as_ref().filter(|m| members < m.size && waited < m.wait_ms) {
        let due_at_ms = oldest.saturating_add(minimum.wait_ms);
        return Filling::NotYet(IntentOutcome::Waiting { due_at_ms, members });
    }
    Filling::Due(picked.items)
}

/// What a fair pick comes to for this intent: whether a batch is formed and what its
/// members are reserved at. The queue's rotation moves on only when a batch is formed
/// (nothing was taken otherwise); who waits on a budget is news either way.
pub(crate) fn decide(
    mut picked: Picked<ExtractionRecord>,
    request: &IntentRequest,
    now_ms: u64,
    rotation: &mut Rotation,
) -> (Filling, Vec<Option<u64>>) {
    let reserved = std::mem::take(&mut picked.reserved);
    rotation.held = std::mem::take(&mut picked.held);
    let moves = std::mem::take(&mut picked.moves);
    match fill(picked, request, now_ms) {
        due @ Filling::Due(_) => {
            rotation.apply(moves);
            (due, reserved)
        }
        waiting @ Filling::NotYet(_) => (waiting, Vec::new()),
    }
}

/// The new intent numbered `seq` over `members`, and the event that enqueues each of them.
/// It is bound to the provider `bound_to` names, whose batch key and scheduler it gets.
pub(crate) fn intent(
    request: &IntentRequest,
    seq: u64,
    members: &[ExtractionRecord],
    now_ms: u64,
) -> (BatchRecord, Event) {
    let provider = bound_to(request, members.len());
    let identities: Vec<(ExtractionId, u32)> = members.iter().map(|m| (m.id, m.attempt)).collect();
    let key = batch_key(provider, &request.schema, seq, &identities);
    let enqueue = Event::Enqueue { provider: provider.to_string().into(), batch_key: key.clone() };
    let batch = BatchRecord {
        seq,
        batch_key: key,
        provider: provider.to_string().into(),
        schema: request.schema.clone(),
        members: members.iter().map(|m| m.seq).collect(),
        state: BatchState::Intent,
        next_action_at_ms: now_ms,
        failures: 0,
        last_error: None,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
        not_found_since_ms: None,
    };
    (batch, enqueue)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::State;
    use crate::store::rules::fixtures::member;

    fn request(minimum: Option<Minimum>) -> IntentRequest {
        IntentRequest {
            provider: "bedrock".into(),
            schema: "code-review@1".into(),
            accept: WorkFilter(Arc::new(|_: &str, _: &str| true)),
            max_size: 500,
            max_content_bytes: u64::MAX,
            max_wait_ms: 2_000,
            minimum,
            estimate: None,
        }
    }

    fn picked(n: u64, at_ms: u64) -> Picked<ExtractionRecord> {
        let items =
            (1..=n).map(|seq| ExtractionRecord { updated_at_ms: at_ms, ..member(seq, State::Pending) }).collect();
        Picked { items, reserved: Vec::new(), held: Vec::new(), full: false, moves: Default::default() }
    }

    fn waiting_until(filling: Filling) -> Option<u64> {
        match filling {
            Filling::NotYet(IntentOutcome::Waiting { due_at_ms, .. }) => Some(due_at_ms),
            _ => None,
        }
    }

    #[test]
    fn work_under_the_minimum_waits_for_more_then_is_formed_for_the_scheduler_to_fail() {
        let minimum = Some(Minimum { size: 100, wait_ms: 3_600_000, fallback: None });
        // Past the batch wait but under the minimum: it waits for the minimum's wait.
        assert_eq!(waiting_until(fill(picked(12, 1_000), &request(minimum.clone()), 10_000)), Some(3_601_000));
        // Enough work arrived: a job forms at the batch wait.
        assert!(
            matches!(fill(picked(100, 1_000), &request(minimum.clone()), 10_000), Filling::Due(m) if m.len() == 100)
        );
        // The minimum's wait is over: the few are formed (and failed by the scheduler).
        assert!(
            matches!(fill(picked(12, 1_000), &request(minimum.clone()), 3_601_000), Filling::Due(m) if m.len() == 12)
        );
        // Without a minimum, the batch wait alone decides.
        assert!(matches!(fill(picked(12, 1_000), &request(None), 10_000), Filling::Due(m) if m.len() == 12));
        assert_eq!(waiting_until(fill(picked(12, 1_000), &request(minimum), 2_000)), Some(3_000));
    }

    #[test]
    fn an_intent_under_the_minimum_is_bound_to_the_fallback_and_a_full_one_is_not() {
        let members = |n: u64| match fill(picked(n, 1_000), &request(None), 3_601_000) {
            Filling::Due(m) => m,
            Filling::NotYet(_) => panic!("due"),
        };
        let fallback = Some(Minimum { size: 100, wait_ms: 3_600_000, fallback: Some("claude".into()) });
        let (batch, enqueue) = intent(&request(fallback.clone()), 7, &members(12), 5_000);
        assert_eq!(batch.provider.as_str(), "claude");
        assert!(
            matches!(&enqueue, Event::Enqueue { provider, batch_key } if provider.as_str() == "claude" && *batch_key == batch.batch_key)
        );
        let (own, _) = intent(&request(None), 7, &members(12), 5_000);
        assert_ne!(batch.batch_key, own.batch_key, "the key names the provider that submits it");
        let (full, _) = intent(&request(fallback), 8, &members(100), 5_000);
        assert_eq!(full.provider.as_str(), "bedrock", "a job of the minimum's size stays with its provider");
        // Without a fallback, the few stay bound to the provider (whose scheduler fails them).
        let plain = Some(Minimum { size: 100, wait_ms: 3_600_000, fallback: None });
        assert_eq!(intent(&request(plain), 9, &members(12), 5_000).0.provider.as_str(), "bedrock");
    }
}
