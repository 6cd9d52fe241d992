//! What is compared: every answer and every read, with what legitimately differs taken
//! out. Wall-clock times are dropped; sequence numbers become the identity (and which
//! incarnation of it, after an erasure) or the batch's creation order; lease tokens become
//! the grant that handed them out; batch keys the batch they name.

use commitpoint::domain::batch::{PreviousAttempt, Usage};
use commitpoint::domain::lifecycle::{FailureClass, StateName, TransitionError};
use commitpoint::store::{ChargeKind, CloseReport, CostSource, ErasureReport, OutboxKind, PostOutcome, StageReport};

/// A lease token by the grant that made it: the claim op, the extraction, and the claim
/// number the token carries (`lt-N-…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenLabel {
    pub claim_op: usize,
    pub identity: usize,
    pub claim_number: u32,
}

/// Not a label of any grant: a token no one was given, or one the harness cannot name.
pub const UNKNOWN_TOKEN: TokenLabel = TokenLabel { claim_op: usize::MAX, identity: usize::MAX, claim_number: 0 };
/// A batch key naming no batch of this case.
pub const UNKNOWN_BATCH: usize = usize::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateView {
    Pending,
    Claimed { worker: String, token: TokenLabel },
    Committed,
    Failed { class: FailureClass, reason: String },
    Submitted { provider: String, batch: usize, job: Option<String> },
    Ready { provider: String, batch: usize },
    Cancelled,
}

impl StateView {
    pub fn name(&self) -> StateName {
        match self {
            Self::Pending => StateName::Pending,
            Self::Claimed { .. } => StateName::Claimed,
            Self::Committed => StateName::Committed,
            Self::Failed { .. } => StateName::Failed,
            Self::Submitted { .. } => StateName::Submitted,
            Self::Ready { .. } => StateName::Ready,
            Self::Cancelled => StateName::Cancelled,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractionView {
    pub identity: usize,
    /// 1 for the first intake, 2 for the intake after an erasure, …
    pub incarnation: u32,
    pub tenant: String,
    pub source_id: String,
    pub schema: String,
    pub metadata_json: Option<String>,
    pub state: StateView,
    pub attempt: u32,
    pub claims: u32,
    pub content_bytes: u64,
    pub requeues: u32,
    pub output_budget: Option<u32>,
    pub truncation_retried: bool,
    pub reasks: u32,
    /// The refused answer a pending re-ask shows the model.
    pub previous_attempt: Option<PreviousAttempt>,
    /// The identity of the newer revision that superseded this one.
    pub superseded_by: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingView {
    pub key: String,
    pub canonical_identity: String,
    pub body_json: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceView {
    Lease(TokenLabel),
    Batch(usize),
    /// Promoted from an evaluation (the model never promotes).
    Evaluation(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultView {
    pub output_json: String,
    pub producer: String,
    pub fence: FenceView,
    pub usage: Option<Usage>,
    /// Whether a latency was recorded (its value is wall-clock time).
    pub latency: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerView {
    pub attempt: u32,
    pub kind: ChargeKind,
    pub provider: String,
    pub job_id: Option<String>,
    pub usage: Usage,
    pub latency: bool,
    pub cost_micros: u64,
    pub list_cost_micros: u64,
    pub cost_source: CostSource,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedView {
    pub provider: String,
    pub job_id: String,
    pub output_json: String,
    pub usage: Option<Usage>,
    pub latency: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchStateView {
    Intent,
    Submitted { job_id: String },
    Closed { job_id: Option<String>, outcome: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchView {
    pub label: usize,
    pub provider: String,
    pub schema: String,
    /// (identity, incarnation) of each member, in submit order.
    pub members: Vec<(usize, u32)>,
    pub state: BatchStateView,
    pub failures: u32,
    pub last_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryView {
    Pending,
    Delivered { status: u16 },
    Dead { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventView {
    pub identity: usize,
    pub incarnation: u32,
    pub attempt: u32,
    pub kind: OutboxKind,
    pub sink: String,
    pub state: DeliveryView,
    pub deliveries: u32,
    /// The retry time a report asked for; `None` while due since creation or redelivery.
    pub retry_at_ms: Option<u64>,
    pub last_error: Option<String>,
}

impl EventView {
    /// The order events are picked in by `Deliver`: independent of sequence numbers.
    pub fn sort_key(&self) -> String {
        format!("{:?}", (self.identity, self.incarnation, self.attempt, &self.kind, &self.sink))
    }
}

pub fn sort_events(events: &mut [EventView]) {
    events.sort_by_key(EventView::sort_key);
}

/// One extraction with everything that hangs off it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detail {
    pub record: ExtractionView,
    pub findings: Vec<FindingView>,
    pub result: Option<ResultView>,
    pub ledger: Vec<LedgerView>,
}

/// Everything readable through the seam after an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub extractions: Vec<Option<Detail>>,
    pub open_batches: Vec<BatchView>,
    /// Non-zero counts only.
    pub counts: Vec<(StateName, u64)>,
    /// (tenant, schema, state, count), non-zero counts only, in that order.
    pub tenant_counts: Vec<(String, String, StateName, u64)>,
    pub ready: Vec<(String, usize, StagedView)>,
    pub outbox: Vec<EventView>,
    pub outbox_counts: (u64, u64),
    pub spend: Vec<(String, u64)>,
    pub erased_spend: Vec<(String, u64)>,
    /// Open budget reservations: (tenant, micro-dollars, members), by tenant.
    pub reservations: Vec<(String, u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntentView {
    Created(BatchView),
    Waiting { members: usize },
    Nothing,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveView {
    Moved(Box<ExtractionView>),
    NotFound,
    Rejected(TransitionError),
}

/// A lease extension's answer: the new expiry is the clock's, so only whether it was extended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseView {
    Extended,
    NotFound,
    Rejected(TransitionError),
}

/// What one operation answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Nothing to act on (no batch yet, no event to deliver).
    Skipped,
    Intake {
        created: bool,
        record: ExtractionView,
    },
    Delivery {
        first: Option<bool>,
        record: ExtractionView,
    },
    Grants(Vec<(ExtractionView, String)>),
    /// One outcome per post of the answer.
    Post(Vec<PostOutcome>),
    Intent(IntentView),
    Batch(BatchView),
    Staged(StageReport),
    Committed(Vec<(usize, PostOutcome)>),
    Closed(CloseReport),
    Moved(MoveView),
    Count(u64),
    Event(Option<EventView>),
    Erased(ErasureReport),
    Lease(LeaseView),
}

/// What only two real backends can be compared on: the raw identifiers both derive by the
/// same rules (event ids, batch keys), which the model does not compute.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Identifiers {
    pub event_ids: Vec<(String, String)>,
    pub batch_keys: Vec<(usize, String)>,
}
