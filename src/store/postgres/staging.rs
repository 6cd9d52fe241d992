//! Staging a provider's answers and closing its batches on PostgreSQL. One chunk of
//! result lines is one transaction: the staged answers, the charges of paid answers that
//! are never committed, and the members' state changes commit together, so a chunk
//! applied twice (a re-fetched file) changes nothing the second time but a replay count.
//!
//! What a line means for its member is `store::member_rules`, shared with the redb store.

use tokio_postgres::Transaction;

use super::batches::{lock_batch, lock_member, save_batch};
use super::ledger::record_charge;
use super::rows::{big, lock_by_id, transition};
use super::{Error, PgStore, pg};
use crate::domain::batch::{LineResult, Usage};
use crate::domain::clock;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::{self, Event, FailureClass, Outcome, State};
use crate::store::codec::encode;
use crate::store::records::{BatchState, ChargeKind};
use crate::store::rules::member::{Effect, plan_line, release, requeue};
use crate::store::seam::Charge;
use crate::store::{CloseReport, Flush, IngestLine, Leftover, MemberRules, Policies, StageReport, StagedAnswer};

impl PgStore {
    /// Stores one chunk of result lines. Safe to call again with the same lines.
    pub(super) async fn stage_results(
        &self,
        batch: u64,
        lines: Vec<(ExtractionId, LineResult)>,
        rules: MemberRules,
    ) -> Result<StageReport, Error> {
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let report = stage_in(&tx, &policies, clock::now_ms(), batch, lines, &rules).await?;
        tx.commit().await.map_err(pg("staging commit failed"))?;
        Ok(report)
    }

    /// Takes result lines with the engine's verdicts. On PostgreSQL the verdicts are not
    /// used yet: every answer is staged as ready here and committed by its own
    /// `post_result` transaction afterwards (the redb store commits a judged answer in the
    /// staging transaction). Both ways commit each answer once; this one writes it twice.
    /// Every staging commit is flushed, so `Flush::Later` asks for nothing less here.
    pub(super) async fn ingest_results(
        &self,
        batch: u64,
        lines: Vec<IngestLine>,
        rules: MemberRules,
        _flush: Flush,
    ) -> Result<StageReport, Error> {
        let lines = lines.into_iter().map(|line| (line.id, line.result)).collect();
        self.stage_results(batch, lines, rules).await
    }

    /// Every commit here is already flushed.
    pub(super) async fn flush(&self) -> Result<(), Error> {
        Ok(())
    }

    /// Ends a batch: members still without an answer are requeued or failed as `leftover`
    /// says, and the batch leaves the open set, in one transaction.
    pub(super) async fn close_batch(
        &self,
        batch: u64,
        outcome: String,
        leftover: Leftover,
        rules: MemberRules,
    ) -> Result<CloseReport, Error> {
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let report = close_in(&tx, &policies, clock::now_ms(), batch, outcome, &leftover, &rules).await?;
        tx.commit().await.map_err(pg("close commit failed"))?;
        Ok(report)
    }
}

async fn stage_in(
    tx: &Transaction<'_>,
    policies: &Policies,
    now_ms: u64,
    batch: u64,
    lines: Vec<(ExtractionId, LineResult)>,
    rules: &MemberRules,
) -> Result<StageReport, Error> {
    // The batch row is locked first: a close or a second staging of it waits its turn.
    let record = lock_batch(tx, batch).await?;
    let job_id = match &record.state {
        BatchState::Submitted { job_id } => job_id.clone(),
        _ => String::new(),
    };
    let charge = |usage: Usage| Charge {
        provider: record.provider.to_string(),
        job_id: Some(job_id.clone()).filter(|j| !j.is_empty()),
        usage,
        latency_ms: None,
        batch: rules.batch_api,
    };
    let mut report = StageReport::default();
    for (id, line) in lines {
        let Some(mut member) = lock_by_id(tx, id.as_bytes()).await? else {
            report.strangers += 1;
            continue;
        };
        let (event, effect) = plan_line(&member, &line, record.batch_key.clone(), rules);
        let next = match lifecycle::apply(&member.state, event, now_ms) {
            Ok(Outcome::Changed(next)) => next,
            Ok(Outcome::Replay) => {
                report.replays += 1;
                // A re-fetched result file: the call is counted again, never charged again.
                if let LineResult::Answer { usage: Some(usage), .. } | LineResult::Unusable { usage: Some(usage), .. } =
                    line
                {
                    record_charge(tx, policies, now_ms, &member, &charge(usage), ChargeKind::Replay).await?;
                }
                continue;
            }
            Err(_) => {
                report.strangers += 1;
                // Cancelled while its batch ran: the answer was paid for, so it is charged
                // to the attempt that paid, and never applied.
                if let (State::Cancelled { .. }, LineResult::Answer { usage: Some(usage), .. })
                | (State::Cancelled { .. }, LineResult::Unusable { usage: Some(usage), .. }) = (&member.state, line)
                {
                    record_charge(tx, policies, now_ms, &member, &charge(usage), ChargeKind::Fresh).await?;
                }
                continue;
            }
        };
        match line {
            LineResult::Answer { output, usage } => {
                let staged = StagedAnswer {
                    provider: record.provider.to_string(),
                    job_id: job_id.clone(),
                    output_json: output,
                    usage,
                    latency_ms: Some(now_ms.saturating_sub(record.created_at_ms)),
                    received_at_ms: now_ms,
                };
                let bytes = encode(&staged)?;
                tx.execute(
                    "INSERT INTO staged (extraction_seq, format, record) VALUES ($1, $2, $3) \
                     ON CONFLICT (extraction_seq) DO UPDATE SET format = excluded.format, record = excluded.record",
                    &[&big(member.seq), &i16::from(bytes[0]), &bytes],
                )
                .await
                .map_err(pg("cannot stage an answer"))?;
                report.staged += 1;
            }
            LineResult::Refused { .. } => report.refused += 1,
            LineResult::Retry { .. } => {}
            LineResult::Unusable { class, usage, .. } => {
                // Paid for, and charged to the attempt that paid, before any requeue.
                if let Some(usage) = usage {
                    record_charge(tx, policies, now_ms, &member, &charge(usage), ChargeKind::Unusable).await?;
                }
                if class == FailureClass::Truncated {
                    report.truncated += 1;
                }
            }
        }
        match (&next, effect) {
            (State::Failed { class: FailureClass::Truncated, .. }, _) => report.failed_truncated += 1,
            (State::Failed { class: FailureClass::Refused, .. }, _) => report.model_refusals += 1,
            (State::Failed { class: FailureClass::AttemptsExhausted, .. }, _) => report.exhausted += 1,
            (_, Effect::Requeue { raise_to }) => {
                report.requeued += 1;
                report.budget_retries += u64::from(raise_to.is_some());
            }
            _ => {}
        }
        requeue(&mut member, effect);
        transition(tx, policies, now_ms, &mut member, next).await?;
    }
    Ok(report)
}

async fn close_in(
    tx: &Transaction<'_>,
    policies: &Policies,
    now_ms: u64,
    batch: u64,
    outcome: String,
    leftover: &Leftover,
    rules: &MemberRules,
) -> Result<CloseReport, Error> {
    let mut record = lock_batch(tx, batch).await?;
    if matches!(record.state, BatchState::Closed { .. }) {
        return Ok(CloseReport::default());
    }
    let mut report = CloseReport::default();
    for seq in record.members.clone() {
        let Some(mut member) = lock_member(tx, seq).await? else { continue };
        if !matches!(&member.state, State::Submitted { batch_key, .. } if *batch_key == record.batch_key) {
            continue;
        }
        let key = record.batch_key.clone();
        let (event, effect) = match leftover {
            Leftover::Requeue => {
                release(&member, key, rules, None, &format!("its batch ended ({outcome}) without an answer for it"))
            }
            Leftover::Return => (Event::Requeue { batch_key: key }, Effect::None),
            Leftover::Fail { class, reason } => {
                (Event::ProviderFailed { batch_key: key, class: *class, reason: reason.clone() }, Effect::None)
            }
        };
        if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, event, now_ms) {
            match (&next, effect) {
                (State::Failed { class: FailureClass::AttemptsExhausted, .. }, _) => report.exhausted += 1,
                (State::Failed { .. }, _) => report.failed += 1,
                (_, Effect::Requeue { .. }) => report.requeued += 1,
                (State::Pending, Effect::None) => report.requeued += 1,
                _ => {}
            }
            requeue(&mut member, effect);
            transition(tx, policies, now_ms, &mut member, next).await?;
        }
    }
    let job_id = match &record.state {
        BatchState::Submitted { job_id } => Some(job_id.clone()),
        _ => None,
    };
    record.state = BatchState::Closed { job_id, outcome };
    record.updated_at_ms = now_ms;
    save_batch(tx, &record).await?;
    Ok(report)
}
