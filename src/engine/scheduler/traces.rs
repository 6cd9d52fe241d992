//! The scheduler's trace spans (docs/OPERATIONS.md, "Traces"). A batch has a trace of its
//! own, rooted at its formation, holding every provider call made for it; each member's
//! trace gets one span per submit (or per lookup that found the job of an earlier submit),
//! linked both ways with that call, and its commit. An evaluation's trial batch has a trace
//! of its own too, with its provider calls; its trials are no extraction's, so no member
//! trace is linked.
//! Attributes are identities, names and counts: never a source, an answer or a provider's
//! error text (that can quote either).

use tracing::Span;
use tracing::field::Empty;

use crate::domain::batch::{BatchMember, LineResult};
use crate::domain::names::BatchKey;
use crate::domain::trace::{self, ROOT_FIELD, TARGET, TraceRoot};
use crate::providers::{JobPhase, Lookup, ProviderError};
use crate::store::evaluation::TrialBatchRecord;
use crate::store::{BatchRecord, IngestLine, Judged, ReadyItem};

/// The most members a batch span links to: the SDK's default span limit, so none is dropped
/// silently; the members' own spans link back in any case.
const MAX_MEMBER_LINKS: usize = 128;

/// The root of the batch's trace: its intent was just written, once per batch key.
pub(super) fn formed(batch: &BatchRecord) {
    let span = tracing::trace_span!(
        target: TARGET, "batch.form",
        batch_key = %batch.batch_key, provider = %batch.provider, schema = %batch.schema,
        members = batch.members.len(), "commitpoint.root" = Empty,
    );
    TraceRoot::of_batch(&batch.batch_key).adopt(&span);
    span.record(ROOT_FIELD, true);
}

/// A call to the provider about a whole batch, in the batch's trace.
pub(super) fn submit(batch: &BatchRecord, members: &[BatchMember]) -> Span {
    let span = tracing::trace_span!(
        target: TARGET, "provider.submit",
        batch_key = %batch.batch_key, provider = %batch.provider, schema = %batch.schema,
        members = members.len(), attempt = batch.failures + 1, job_id = Empty, outcome = Empty,
    );
    TraceRoot::of_batch(&batch.batch_key).adopt(&span);
    link_members(&span, members);
    span
}

/// Links a lookup to the roots of the members it asks about, as a submit's span is linked.
pub(super) fn link_members(span: &Span, members: &[BatchMember]) {
    for member in members.iter().take(MAX_MEMBER_LINKS) {
        trace::link_root(span, &TraceRoot::of_extraction(&member.id));
    }
}

/// Each member's side of a call that put it in a job (a submit, or a lookup that found the
/// job of an earlier one): a span in its own trace, linked to that call.
pub(super) fn members_sent(call: &Span, batch: &BatchRecord, members: &[BatchMember], job_id: &str) {
    for member in members {
        let span = tracing::trace_span!(
            target: TARGET, "batch.member",
            extraction = %member.id, batch_key = %batch.batch_key, provider = %batch.provider,
            job_id, reask = member.previous_attempt.is_some(),
        );
        TraceRoot::of_extraction(&member.id).adopt(&span);
        trace::link(&span, call);
    }
}

/// Asking the provider whether an earlier submit of a batch (or a trial batch) created a
/// job, before anything is sent again: in the batch's trace, its outcome recorded by
/// [`looked_up`].
pub(super) fn lookup(batch_key: &BatchKey, provider: &str, members: usize) -> Span {
    let span = tracing::trace_span!(
        target: TARGET, "provider.lookup",
        batch_key = %batch_key, provider, members, outcome = Empty, job_id = Empty,
    );
    TraceRoot::of_batch(batch_key).adopt(&span);
    span
}

/// What a lookup answered, on its span; `None` is a store that failed around it, which is
/// an `error` like the provider's. The provider's reason is left out.
pub(super) fn looked_up(span: &Span, answer: Option<&Result<Lookup, ProviderError>>) {
    let outcome = match answer {
        Some(Ok(Lookup::Found(job_id))) => {
            span.record("job_id", job_id.as_str());
            "found"
        }
        Some(Ok(Lookup::Absent)) => "absent",
        Some(Ok(Lookup::Undecided { .. })) => "undecided",
        Some(Err(_)) | None => "error",
    };
    span.record("outcome", outcome);
}

pub(super) fn poll(batch_key: &BatchKey, provider: &str, job_id: &str) -> Span {
    let span = tracing::trace_span!(
        target: TARGET, "provider.poll",
        batch_key = %batch_key, provider, job_id, phase = Empty,
    );
    TraceRoot::of_batch(batch_key).adopt(&span);
    span
}

/// Downloading, judging and staging the result files; `staged` and `refused` are recorded
/// for production batches (a trial batch's answers are stored as trials, not staged).
pub(super) fn results(batch_key: &BatchKey, provider: &str, job_id: &str) -> Span {
    let span = tracing::trace_span!(
        target: TARGET, "provider.results",
        batch_key = %batch_key, provider, job_id, staged = Empty, refused = Empty,
    );
    TraceRoot::of_batch(batch_key).adopt(&span);
    span
}

/// The root of a trial batch's trace: its intent was just written.
pub(super) fn trial_formed(batch: &TrialBatchRecord) {
    let span = tracing::trace_span!(
        target: TARGET, "trial.form",
        batch_key = %batch.batch_key, evaluation = %batch.evaluation, provider = %batch.candidate,
        members = batch.members.len(), "commitpoint.root" = Empty,
    );
    TraceRoot::of_batch(&trial_key(batch)).adopt(&span);
    span.record(ROOT_FIELD, true);
}

/// Sending a trial batch's job, in its trace.
pub(super) fn trial_submit(batch: &TrialBatchRecord, members: usize) -> Span {
    let span = tracing::trace_span!(
        target: TARGET, "provider.submit",
        batch_key = %batch.batch_key, evaluation = %batch.evaluation, provider = %batch.candidate,
        members, attempt = batch.failures + 1, job_id = Empty, outcome = Empty,
    );
    TraceRoot::of_batch(&trial_key(batch)).adopt(&span);
    span
}

/// A trial batch's key as the key its trace is derived from.
pub(super) fn trial_key(batch: &TrialBatchRecord) -> BatchKey {
    BatchKey::from(batch.batch_key.as_str())
}

/// One result line written in a chunk's transaction, in its extraction's trace: a valid
/// answer is committed there, an invalid one re-asked or failed, anything else staged,
/// requeued or failed by the member rules. Open while the chunk is written.
pub(super) fn stored(batch: &BatchRecord, job_id: &str, line: &IngestLine) -> Span {
    let (kind, verdict) = match (&line.result, &line.judged) {
        (LineResult::Answer { .. }, Some(Judged::Valid { .. })) => ("answer", "valid"),
        (LineResult::Answer { .. }, Some(Judged::Invalid { .. })) => ("answer", "invalid"),
        (LineResult::Answer { .. }, None) => ("answer", "unjudged"),
        (LineResult::Unusable { .. }, _) => ("unusable", "none"),
        (LineResult::Refused { .. }, _) => ("refused", "none"),
        (LineResult::Retry { .. }, _) => ("retry", "none"),
    };
    let span = tracing::trace_span!(
        target: TARGET, "commit",
        extraction = %line.id, provider = %batch.provider, batch_key = %batch.batch_key, job_id,
        line = kind, verdict, outcome = Empty,
    );
    TraceRoot::of_extraction(&line.id).adopt(&span);
    span
}

/// Judging and committing one staged answer, in its extraction's trace.
pub(super) fn commit(item: &ReadyItem) -> Span {
    let record = &item.record;
    let span = tracing::trace_span!(
        target: TARGET, "commit",
        extraction = %record.id, tenant = %record.tenant, schema = %record.schema,
        provider = %item.staged.provider, job_id = %item.staged.job_id,
        batch_key = record.state.batch_key().map(|k| k.as_str()), attempt = record.attempt, outcome = Empty,
    );
    TraceRoot::of_extraction(&record.id).adopt(&span);
    span
}

/// A job's phase as the poll span's `phase`; a failure's reason is the provider's text, left out.
pub(super) fn phase(phase: &JobPhase) -> &'static str {
    match phase {
        JobPhase::Running => "running",
        JobPhase::Stalled { .. } => "stalled",
        JobPhase::Completed => "completed",
        JobPhase::Expired => "expired",
        JobPhase::Cancelled => "cancelled",
        JobPhase::Failed { .. } => "failed",
    }
}
