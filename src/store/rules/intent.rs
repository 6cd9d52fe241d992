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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Minimum {
    pub size: usize,
    /// Once the oldest member waited this long, fewer are formed into an intent anyway:
    /// the scheduler then fails them, naming the minimum, rather than send a job the
    /// provider refuses or keep them waiting for ever.
    pub wait_ms: u64,
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
    if let Some(minimum) = request.minimum.filter(|m| members < m.size && waited < m.wait_ms) {
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
pub(crate) fn intent(
    request: &IntentRequest,
    seq: u64,
    members: &[ExtractionRecord],
    now_ms: u64,
) -> (BatchRecord, Event) {
    let identities: Vec<(ExtractionId, u32)> = members.iter().map(|m| (m.id, m.attempt)).collect();
    let key = batch_key(&request.provider, &request.schema, seq, &identities);
    let enqueue = Event::Enqueue { provider: request.provider.clone().into(), batch_key: key.clone() };
    let batch = BatchRecord {
        seq,
        batch_key: key,
        provider: request.provider.clone().into(),
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
        let minimum = Some(Minimum { size: 100, wait_ms: 3_600_000 });
        // Past the batch wait but under the minimum: it waits for the minimum's wait.
        assert_eq!(waiting_until(fill(picked(12, 1_000), &request(minimum), 10_000)), Some(3_601_000));
        // Enough work arrived: a job forms at the batch wait.
        assert!(matches!(fill(picked(100, 1_000), &request(minimum), 10_000), Filling::Due(m) if m.len() == 100));
        // The minimum's wait is over: the few are formed (and failed by the scheduler).
        assert!(matches!(fill(picked(12, 1_000), &request(minimum), 3_601_000), Filling::Due(m) if m.len() == 12));
        // Without a minimum, the batch wait alone decides.
        assert!(matches!(fill(picked(12, 1_000), &request(None), 10_000), Filling::Due(m) if m.len() == 12));
        assert_eq!(waiting_until(fill(picked(12, 1_000), &request(minimum), 2_000)), Some(3_000));
    }
}
