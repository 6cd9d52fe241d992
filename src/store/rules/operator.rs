//! What an operator's (or a tenant's) retry and cancel do to an extraction, and which of
//! a scanned run of failed extractions a bulk retry moves: the same on both backends.

use crate::domain::lifecycle::{self, Event, Outcome, State};
use crate::store::records::{ExtractionRecord, MAX_PAST_FAILURES, PastFailure};
use crate::store::seam::{CancelOutcome, RETRY_CHUNK, RetryFilter, RetryOutcome};

/// Most failed extractions one bulk-retry transaction looks at, so a filter that matches
/// little still commits (and lets others write) often.
pub(in crate::store) const SCAN_CHUNK: usize = 4 * RETRY_CHUNK;

/// How a bulk retry of up to `limit` extractions walks the failed ones in intake order, one
/// chunk of at most `RETRY_CHUNK` per transaction, so no transaction holds many for long.
#[derive(Debug)]
pub(in crate::store) struct RetryWalk {
    limit: u64,
    retried: u64,
    /// The seq the next chunk starts after; `None` once the walk has seen every match.
    after: Option<u64>,
}

impl RetryWalk {
    pub(in crate::store) fn new(limit: u64) -> Self {
        Self { limit, retried: 0, after: Some(0) }
    }

    /// The next chunk: the seq to start after and how many to move at most.
    pub(in crate::store) fn next_chunk(&self) -> Option<(u64, usize)> {
        let after = self.after?;
        let left = self.limit.checked_sub(self.retried).filter(|&n| n > 0)?;
        Some((after, usize::try_from(left).unwrap_or(usize::MAX).min(RETRY_CHUNK)))
    }

    pub(in crate::store) fn advance(&mut self, moved: u64, next_after: Option<u64>) {
        self.retried += moved;
        self.after = next_after;
    }

    pub(in crate::store) fn retried(&self) -> u64 {
        self.retried
    }
}

/// What an action on one extraction comes to.
#[derive(Debug)]
pub(in crate::store) enum Step<O> {
    /// Write this state; the answer is the record as changed.
    Move(State),
    /// Answer this, writing nothing.
    Answer(O),
}

/// A retry starts the automatic policies over: a fresh allowance of provider attempts,
/// of truncation retries and of re-asks, as a new attempt. A raised output budget is kept,
/// and so is a refused answer's previous attempt: the retry asks again with its issues
/// rather than repeating the prompt that produced it.
pub(in crate::store) fn retry(record: &mut ExtractionRecord, now_ms: u64) -> Step<RetryOutcome> {
    match lifecycle::apply(&record.state, Event::Retry, now_ms) {
        Ok(Outcome::Changed(next)) => {
            // The failed state is about to go: its class and reason stay on the record.
            if let State::Failed { class, reason } = &record.state {
                let past = PastFailure {
                    attempt: record.attempt,
                    class: *class,
                    reason: reason.clone(),
                    failed_at_ms: record.updated_at_ms,
                };
                record.past_failures.push(past);
                let over = record.past_failures.len().saturating_sub(MAX_PAST_FAILURES);
                record.past_failures.drain(..over);
            }
            record.attempt += 1;
            record.requeues = 0;
            record.truncation_retried = false;
            record.reasks = 0;
            Step::Move(next)
        }
        Ok(Outcome::Replay) => Step::Answer(RetryOutcome::Retried(Box::new(record.clone()))),
        Err(e) => Step::Answer(RetryOutcome::Rejected(e)),
    }
}

/// Cancelling twice answers with the cancelled record and writes nothing the second time.
pub(in crate::store) fn cancel(record: &ExtractionRecord, now_ms: u64) -> Step<CancelOutcome> {
    match lifecycle::apply(&record.state, Event::Cancel, now_ms) {
        Ok(Outcome::Changed(next)) => Step::Move(next),
        Ok(Outcome::Replay) => Step::Answer(CancelOutcome::Cancelled(Box::new(record.clone()))),
        Err(e) => Step::Answer(CancelOutcome::Rejected(e)),
    }
}

/// One transaction of a bulk retry: the records to move (each with its fresh allowance
/// already given) and where the next transaction starts.
#[derive(Debug, Default)]
pub(in crate::store) struct BulkStep {
    pub moves: Vec<(ExtractionRecord, State)>,
    /// The last sequence number looked at; `None` once the failed ones are all seen.
    pub next_after: Option<u64>,
}

/// Moves up to `want` of `scanned` (failed extractions in intake order after `after`,
/// at most `SCAN_CHUNK`; `exhausted` when no more follow them) that `filter` matches.
pub(in crate::store) fn bulk_retry<E>(
    scanned: impl IntoIterator<Item = Result<ExtractionRecord, E>>,
    exhausted: bool,
    filter: &RetryFilter,
    after: u64,
    want: usize,
    now_ms: u64,
) -> Result<BulkStep, E> {
    let mut step = BulkStep::default();
    let mut last = after;
    for record in scanned {
        let mut record = record?;
        last = record.seq;
        if !filter.matches(&record) {
            continue;
        }
        if let Step::Move(next) = retry(&mut record, now_ms) {
            step.moves.push((record, next));
            if step.moves.len() == want {
                step.next_after = Some(last);
                return Ok(step);
            }
        }
    }
    step.next_after = (!exhausted).then_some(last);
    Ok(step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::lifecycle::FailureClass;
    use crate::domain::names::LeaseToken;
    use crate::store::rules::fixtures::record;

    fn failed(seq: u64, class: FailureClass) -> ExtractionRecord {
        let mut r = record(State::Failed { class, reason: "x".into() });
        r.seq = seq;
        r
    }

    #[test]
    fn a_bulk_retry_walks_in_chunks_until_its_limit_or_the_last_match() {
        let mut walk = RetryWalk::new(1_200);
        assert_eq!(walk.next_chunk(), Some((0, RETRY_CHUNK)));
        walk.advance(500, Some(900));
        assert_eq!(walk.next_chunk(), Some((900, RETRY_CHUNK)), "the next chunk starts after the last seq seen");
        walk.advance(500, Some(1_700));
        assert_eq!(walk.next_chunk(), Some((1_700, 200)), "the last chunk asks only for what the limit leaves");
        walk.advance(200, Some(2_000));
        assert_eq!((walk.next_chunk(), walk.retried()), (None, 1_200));

        let mut short = RetryWalk::new(u64::MAX);
        short.advance(3, None);
        assert_eq!((short.next_chunk(), short.retried()), (None, 3), "no chunk after the matches ran out");
        assert_eq!(RetryWalk::new(0).next_chunk(), None);
    }

    #[test]
    fn a_retry_is_a_new_attempt_with_a_fresh_allowance_but_keeps_a_raised_budget() {
        let mut r = failed(1, FailureClass::AttemptsExhausted);
        (r.attempt, r.requeues, r.truncation_retried, r.output_budget, r.reasks) = (4, 3, true, Some(8_000), 1);
        assert!(matches!(retry(&mut r, 9), Step::Move(State::Pending)));
        assert_eq!((r.attempt, r.requeues, r.truncation_retried, r.output_budget), (5, 0, false, Some(8_000)));
        assert_eq!(r.reasks, 0, "a retry grants a fresh allowance of re-asks");
        let past = &r.past_failures;
        assert_eq!(past.len(), 1, "the failure retried past is kept");
        assert_eq!(
            (past[0].attempt, past[0].class, past[0].failed_at_ms),
            (4, FailureClass::AttemptsExhausted, r.updated_at_ms)
        );
        for n in 0..40 {
            r.state = State::Failed { class: FailureClass::Transient, reason: format!("failure {n}") };
            assert!(matches!(retry(&mut r, 10 + n), Step::Move(State::Pending)));
        }
        assert_eq!(r.past_failures.len(), MAX_PAST_FAILURES, "a record keeps the latest few");
        assert_eq!(r.past_failures.last().map(|p| p.reason.as_str()), Some("failure 39"));
        let mut pending = record(State::Pending);
        assert!(matches!(retry(&mut pending, 9), Step::Answer(RetryOutcome::Rejected(_))));
        assert_eq!(pending.attempt, 1, "a refused retry changes nothing");
    }

    #[test]
    fn a_cancel_moves_live_work_once_and_refuses_work_that_is_done() {
        let token = LeaseToken::new("lt-1-x");
        let claimed = record(State::Claimed { worker: "w".into(), lease_token: token, expires_at_ms: 5 });
        assert!(matches!(cancel(&claimed, 7), Step::Move(State::Cancelled { at_ms: 7 })));
        let cancelled = record(State::Cancelled { at_ms: 3 });
        assert!(
            matches!(cancel(&cancelled, 7), Step::Answer(CancelOutcome::Cancelled(r)) if r.state == cancelled.state)
        );
        assert!(matches!(cancel(&record(State::Committed { at_ms: 1 }), 7), Step::Answer(CancelOutcome::Rejected(_))));
    }

    #[test]
    fn a_bulk_retry_takes_what_matches_stops_at_its_quota_and_says_where_to_go_on() {
        let scanned = || {
            [failed(3, FailureClass::Validation), failed(5, FailureClass::Auth), failed(8, FailureClass::Validation)]
                .into_iter()
                .map(Ok::<_, ()>)
        };
        let filter = RetryFilter { failure_class: Some(FailureClass::Validation), ..RetryFilter::default() };
        let all = bulk_retry(scanned(), true, &filter, 0, 10, 1).unwrap();
        let moved: Vec<u64> = all.moves.iter().map(|(r, _)| r.seq).collect();
        assert_eq!(moved, vec![3, 8]);
        assert!(all.moves.iter().all(|(r, next)| r.attempt == 2 && *next == State::Pending));
        assert_eq!(all.next_after, None, "exhausted and not full: done");
        let more = bulk_retry(scanned(), false, &filter, 0, 10, 1).unwrap();
        assert_eq!(more.next_after, Some(8), "more follow the scan");
        let one = bulk_retry(scanned(), true, &filter, 0, 1, 1).unwrap();
        assert_eq!((one.moves.len(), one.next_after), (1, Some(3)), "full: the next job goes on after the last taken");
        let none = bulk_retry(std::iter::empty::<Result<ExtractionRecord, ()>>(), false, &filter, 42, 1, 1).unwrap();
        assert_eq!(none.next_after, Some(42));
    }
}
