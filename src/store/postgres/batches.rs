//! Provider batches on PostgreSQL: submit intents, job ids, the polling schedule, closing
//! (staging result lines is `staging`, the reads `batch_reads`); what each step writes is
//! decided in `rules`, as for the redb store. The order of durable facts is the redb
//! store's: the intent (members `Submitted` under a deterministic batch key) commits
//! before any provider call, and the job id commits before anything else is done with it.
//!
//! Where redb relied on its single writer, each operation here locks its batch row
//! (`FOR UPDATE`) and then its members, always in that order, so two instances working on
//! one batch take turns and never deadlock on it.

use super::rows::stored_content;
use crate::domain::batch::BatchMember;
use crate::store::Flush;
use crate::store::IngestLine;
use crate::store::ReadyItem;
use crate::store::StageReport;
use crate::store::records::StoredContent;
use crate::store::seam::Batches;
use crate::store::seam::{member_line, ready_from, unowned_line};
use async_trait::async_trait;
use tokio_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::drivers::HeldTerms;
use super::rows::{big, decode_record, transition, unbig};
use super::{Error, PgStore, pg};
use crate::domain::clock;
use crate::domain::lifecycle::{self, Outcome, StateName};
use crate::store::codec::{decode, encode};
use crate::store::records::{BatchRecord, BatchState};
use crate::store::rules::intent::{self, Filling};
use crate::store::rules::member::Move;
use crate::store::rules::{close, schedule};
use crate::store::{CloseReport, ExtractionRecord, IntentOutcome, IntentRequest, Leftover, MemberRules, Policies};

const INTENT: i16 = 0;
const SUBMITTED: i16 = 1;
pub(super) const CLOSED: i16 = 2;

pub(super) fn state_code(state: &BatchState) -> i16 {
    match state {
        BatchState::Intent => INTENT,
        BatchState::Submitted { .. } => SUBMITTED,
        BatchState::Closed { .. } => CLOSED,
    }
}

/// The provider's job id, where the batch has one: what an orphan lookup may skip.
pub(super) fn job_of(state: &BatchState) -> Option<&str> {
    match state {
        BatchState::Submitted { job_id } | BatchState::Closed { job_id: Some(job_id), .. } => Some(job_id),
        _ => None,
    }
}

/// The batch, locked for the rest of the transaction, once this process's term driving
/// its provider is checked to be current: every batch write of a driver starts here.
pub(super) async fn lock_batch(tx: &Transaction<'_>, held: &HeldTerms, batch: u64) -> Result<BatchRecord, Error> {
    let row = tx
        .query_opt("SELECT record FROM batches WHERE seq = $1 FOR UPDATE", &[&big(batch)])
        .await
        .map_err(pg("cannot read a batch"))?
        .ok_or_else(|| Error::Corrupt { kind: "batch", reason: format!("batch #{batch} does not exist") })?;
    let record: BatchRecord = decode(row.get(0))?;
    held.check(tx, record.provider.as_str()).await?;
    Ok(record)
}

/// Writes the batch's record and the columns derived from it in one statement.
pub(super) async fn save_batch(tx: &Transaction<'_>, record: &BatchRecord) -> Result<(), Error> {
    let bytes = encode(record)?;
    let params: [&(dyn ToSql + Sync); 9] = [
        &big(record.seq),
        &record.batch_key.as_str(),
        &record.provider.as_str(),
        &state_code(&record.state),
        &job_of(&record.state),
        &big(record.next_action_at_ms),
        &big(record.created_at_ms),
        &i16::from(bytes[0]),
        &bytes,
    ];
    tx.execute(
        "INSERT INTO batches (seq, batch_key, provider, state_code, job_id, next_action_at_ms, created_at_ms, format, record) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (seq) DO UPDATE SET state_code = excluded.state_code, \
         job_id = excluded.job_id, next_action_at_ms = excluded.next_action_at_ms, format = excluded.format, \
         record = excluded.record",
        &params,
    )
    .await
    .map_err(pg("cannot write a batch"))?;
    Ok(())
}

/// A batch member, locked. `None`: it is gone (kept for parity with redb's erasure).
async fn lock_member(tx: &Transaction<'_>, seq: u64) -> Result<Option<ExtractionRecord>, Error> {
    let row = tx
        .query_opt("SELECT record FROM extractions WHERE seq = $1 FOR UPDATE", &[&big(seq)])
        .await
        .map_err(pg("cannot read a batch member"))?;
    row.map(|r| decode_record(r.get(0))).transpose()
}

/// The members of `seqs` that still exist, locked one by one in that order (the order
/// every step on a batch takes them in).
async fn lock_members(tx: &Transaction<'_>, seqs: &[u64]) -> Result<Vec<ExtractionRecord>, Error> {
    let mut members = Vec::with_capacity(seqs.len());
    for &seq in seqs {
        members.extend(lock_member(tx, seq).await?);
    }
    Ok(members)
}

async fn apply_moves(tx: &Transaction<'_>, policies: &Policies, now_ms: u64, moves: Vec<Move>) -> Result<(), Error> {
    for Move { mut member, next } in moves {
        transition(tx, policies, now_ms, &mut member, next).await?;
    }
    Ok(())
}

impl PgStore {
    pub(super) async fn in_transaction<T, F>(&self, context: &'static str, work: F) -> Result<T, Error>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>, u64) -> super::TxFuture<'t, T>,
    {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let value = work(&tx, clock::now_ms()).await?;
        tx.commit().await.map_err(pg(context))?;
        Ok(value)
    }
}

#[async_trait]
impl Batches for PgStore {
    async fn open_batches(&self) -> Result<Vec<BatchRecord>, Error> {
        let client = self.client().await?;
        let rows = client
            .query("SELECT record FROM batches WHERE state_code <> $1 ORDER BY seq", &[&CLOSED])
            .await
            .map_err(pg("cannot list open batches"))?;
        rows.iter().map(|r| decode(r.get(0))).collect()
    }

    async fn batch(&self, batch: u64) -> Result<Option<BatchRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT record FROM batches WHERE seq = $1", &[&big(batch)])
            .await
            .map_err(pg("cannot read a batch"))?;
        row.map(|r| decode(r.get(0))).transpose()
    }

    async fn batch_history(&self, before: u64, limit: usize) -> Result<Vec<BatchRecord>, Error> {
        let client = self.client().await?;
        let below = if before == 0 { i64::MAX } else { big(before) };
        let rows = client
            .query(
                "SELECT record FROM batches WHERE seq < $1 ORDER BY seq DESC LIMIT $2",
                &[&below, &big(limit as u64)],
            )
            .await
            .map_err(pg("cannot list batches"))?;
        rows.iter().map(|r| decode(r.get(0))).collect()
    }

    /// Job ids of `provider`'s batches created at or after `since_ms`, newest first: its
    /// production batches and the trial batches it runs as an evaluation's candidate
    /// (both are jobs of the provider's account an orphan lookup must rule out).
    ///
    /// Trial batches have no provider or time column: every record is decoded (there are
    /// few) and filtered here. The two lists are merged by creation time, newest first
    /// (equal times keep production batches first, in sequence order); the order is only a
    /// hint, a lookup treats the list as a set, so ties and clock skew between instances
    /// do not matter for correctness.
    async fn recorded_jobs_since(&self, provider: String, since_ms: u64) -> Result<Vec<String>, Error> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT job_id, created_at_ms FROM batches \
                 WHERE provider = $1 AND created_at_ms >= $2 AND job_id IS NOT NULL ORDER BY seq DESC",
                &[&provider, &big(since_ms)],
            )
            .await
            .map_err(pg("cannot list recorded jobs"))?;
        let mut jobs: Vec<(u64, String)> = rows.iter().map(|r| (unbig(r.get(1)), r.get(0))).collect();
        let trial_rows = client
            .query("SELECT record FROM trial_batches ORDER BY seq DESC", &[])
            .await
            .map_err(pg("cannot list recorded trial jobs"))?;
        for row in &trial_rows {
            let trial: crate::store::evaluation::TrialBatchRecord = decode(row.get(0))?;
            if trial.candidate == provider
                && trial.created_at_ms >= since_ms
                && let Some(job_id) = trial.job_id
            {
                jobs.push((trial.created_at_ms, job_id));
            }
        }
        // Stable: production batches keep their sequence order among equal times.
        jobs.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        Ok(jobs.into_iter().map(|(_, job_id)| job_id).collect())
    }

    /// The members in submit order, with their content; a missing member keeps its place.
    async fn batch_members(&self, batch: u64) -> Result<Vec<BatchMember>, Error> {
        let client = self.client().await?;
        let Some(row) = client
            .query_opt("SELECT record FROM batches WHERE seq = $1", &[&big(batch)])
            .await
            .map_err(pg("cannot read a batch"))?
        else {
            return Ok(Vec::new());
        };
        let record: BatchRecord = decode(row.get(0))?;
        let seqs: Vec<i64> = record.members.iter().map(|&s| big(s)).collect();
        let rows = client
            .query("SELECT seq, record, content FROM extractions WHERE seq = ANY($1)", &[&seqs])
            .await
            .map_err(pg("cannot read batch members"))?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let extraction = decode_record(row.get(1))?;
            let content: StoredContent = decode(stored_content(row.get(2), extraction.seq)?)?;
            found.insert(unbig(row.get(0)), (extraction, content.text));
        }
        Ok(record
            .members
            .iter()
            .map(|seq| match found.remove(seq) {
                Some((extraction, content)) => member_line(extraction, content),
                None => unowned_line(),
            })
            .collect())
    }

    /// Up to `limit` extractions whose answer from `provider` is staged and awaits commit,
    /// in intake order. Each provider's scheduler commits only its own.
    async fn ready_items(&self, provider: String, limit: usize) -> Result<Vec<ReadyItem>, Error> {
        let client = self.client().await?;
        let mut out = Vec::new();
        let mut after = 0i64;
        while out.len() < limit {
            let rows = client
                .query(
                    "SELECT e.seq, e.record, s.record FROM extractions e JOIN staged s ON s.extraction_seq = e.seq \
                     WHERE e.state_code = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3",
                    &[&i16::from(StateName::Ready.code()), &after, &super::batch_reads::READY_PAGE],
                )
                .await
                .map_err(pg("cannot list ready extractions"))?;
            for row in &rows {
                after = row.get(0);
                let record = decode_record(row.get(1))?;
                if !ready_from(&record, &provider) {
                    continue;
                }
                out.push(ReadyItem { record, staged: decode(row.get(2))? });
                if out.len() >= limit {
                    break;
                }
            }
            if (rows.len() as i64) < super::batch_reads::READY_PAGE {
                break;
            }
        }
        Ok(out)
    }

    /// Persists a submit intent for up to `max_size` pending extractions of one schema,
    /// unless there is not yet enough (or old enough) work.
    async fn create_intent(&self, request: IntentRequest) -> Result<IntentOutcome, Error> {
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let now_ms = clock::now_ms();
        self.held.check(&tx, &request.provider).await?;
        let queue = intent::queue(&request);
        let mut rotation = policies.rotations.take(&queue);
        // Only the work this provider may take (routing, budget holds) is read.
        let picked = super::pending_queue::pick(
            &tx,
            &policies,
            Some(&request.schema),
            &request.accept,
            request.estimate.as_ref(),
            intent::limits(&request),
            &rotation,
        )
        .await;
        let decided = picked.map(|picked| intent::decide(picked, &request, now_ms, &mut rotation));
        policies.rotations.put(&queue, rotation);
        let (filling, reserved) = decided?;
        let members = match filling {
            Filling::NotYet(outcome) => return Ok(outcome),
            Filling::Due(members) => members,
        };
        let seq: i64 = tx
            .query_one("SELECT nextval('batch_seq')", &[])
            .await
            .map_err(pg("cannot allocate a batch number"))?
            .get(0);
        let seq = unbig(seq);
        let (batch, enqueue) = intent::intent(&request, seq, &members, now_ms);
        save_batch(&tx, &batch).await?;
        let member_seqs: Vec<i64> = batch.members.iter().map(|&s| big(s)).collect();
        tx.execute(
            "INSERT INTO batch_members (batch_seq, extraction_seq) SELECT $1, unnest($2::bigint[])",
            &[&big(seq), &member_seqs],
        )
        .await
        .map_err(pg("cannot write batch members"))?;
        let mut moved = Vec::with_capacity(members.len());
        for mut member in members {
            if let Ok(Outcome::Changed(next)) = lifecycle::apply(&member.state, enqueue.clone(), now_ms) {
                transition(&tx, &policies, now_ms, &mut member, next).await?;
            }
            moved.push(member);
        }
        super::pending_queue::reserve(&tx, &moved, &reserved).await?;
        // Committed before the provider is called: the intent is how the job is found again.
        tx.commit().await.map_err(pg("intent commit failed"))?;
        Ok(IntentOutcome::Created(Box::new(batch)))
    }

    /// Keeps the first `keep` members of an intent (at least one) and returns the rest to
    /// the queue as the same attempt (`rules::close::shrink`).
    async fn shrink_intent(&self, batch: u64, keep: usize) -> Result<u64, Error> {
        let policies = self.policies();
        let held = self.held.clone();
        self.in_transaction("shrink commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let record = lock_batch(tx, &held, batch).await?;
                let excess = lock_members(tx, close::to_shrink(&record, keep)).await?;
                let Some(shrinking) = close::shrink(&record, keep, excess, now_ms) else { return Ok(0) };
                let returned = shrinking.moves.len() as u64;
                apply_moves(tx, &policies, now_ms, shrinking.moves).await?;
                let gone: Vec<i64> = shrinking.dropped.iter().map(|&s| big(s)).collect();
                tx.execute(
                    "DELETE FROM batch_members WHERE batch_seq = $1 AND extraction_seq = ANY($2)",
                    &[&big(batch), &gone],
                )
                .await
                .map_err(pg("cannot drop batch members"))?;
                save_batch(tx, &shrinking.batch).await?;
                Ok(returned)
            })
        })
        .await
    }

    /// Persists the provider's job id, moving the members under it, before anything else
    /// is done with it. A job already recorded, or a closed batch, is left as it is.
    async fn record_job(&self, batch: u64, job_id: String, next_poll_at_ms: u64) -> Result<BatchRecord, Error> {
        let policies = self.policies();
        let held = self.held.clone();
        self.in_transaction("job id commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let record = lock_batch(tx, &held, batch).await?;
                let members = lock_members(tx, schedule::to_record_job(&record, &job_id)).await?;
                let Some(recorded) = schedule::record_job(&record, &job_id, next_poll_at_ms, members, now_ms) else {
                    return Ok(record);
                };
                apply_moves(tx, &policies, now_ms, recorded.moves).await?;
                save_batch(tx, &recorded.batch).await?;
                Ok(recorded.batch)
            })
        })
        .await
    }

    /// When the scheduler looks at the batch again, and why (`rules::schedule::reschedule`).
    async fn reschedule_batch(
        &self,
        batch: u64,
        next_action_at_ms: u64,
        note: Option<String>,
        count_failure: bool,
    ) -> Result<(), Error> {
        let held = self.held.clone();
        self.in_transaction("reschedule commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let record = lock_batch(tx, &held, batch).await?;
                save_batch(tx, &schedule::reschedule(record, next_action_at_ms, note, count_failure, now_ms)).await
            })
        })
        .await
    }

    /// One more 404 for the batch's job (`rules::schedule::not_found`).
    async fn note_not_found(
        &self,
        batch: u64,
        since_ms: u64,
        next_action_at_ms: u64,
        note: String,
    ) -> Result<(), Error> {
        let held = self.held.clone();
        self.in_transaction("not-found commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let record = lock_batch(tx, &held, batch).await?;
                save_batch(tx, &schedule::not_found(record, since_ms, next_action_at_ms, note, now_ms)).await
            })
        })
        .await
    }

    /// Ends a batch: members still without an answer are requeued or failed as `leftover`
    /// says (`rules::close::close`), and the batch leaves the open set, in one transaction.
    async fn close_batch(
        &self,
        batch: u64,
        outcome: String,
        leftover: Leftover,
        rules: MemberRules,
    ) -> Result<CloseReport, Error> {
        let policies = self.policies();
        let held = self.held.clone();
        self.in_transaction("close commit failed", move |tx, now_ms| {
            Box::pin(async move {
                let record = lock_batch(tx, &held, batch).await?;
                let members = lock_members(tx, close::to_close(&record)).await?;
                let Some(closing) = close::close(&record, members, outcome, &leftover, &rules, now_ms) else {
                    return Ok(CloseReport::default());
                };
                apply_moves(tx, &policies, now_ms, closing.moves).await?;
                save_batch(tx, &closing.batch).await?;
                Ok(closing.report)
            })
        })
        .await
    }

    async fn provider_paused(&self, provider: String) -> Result<bool, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT paused FROM provider_pause WHERE provider = $1", &[&provider])
            .await
            .map_err(pg("cannot read a provider's pause"))?;
        Ok(row.is_some_and(|r| r.get::<_, bool>(0)))
    }

    async fn set_provider_paused(&self, provider: String, paused: bool) -> Result<(), Error> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO provider_pause (provider, paused) VALUES ($1, $2) \
                 ON CONFLICT (provider) DO UPDATE SET paused = excluded.paused",
                &[&provider, &paused],
            )
            .await
            .map_err(pg("cannot record a provider's pause"))?;
        Ok(())
    }

    /// Stores one chunk of result lines in one transaction, committing every judged answer
    /// there and then. Every commit here is flushed, so `Flush::Later` asks for nothing less.
    async fn ingest_results(
        &self,
        batch: u64,
        lines: Vec<IngestLine>,
        rules: MemberRules,
        _flush: Flush,
    ) -> Result<StageReport, Error> {
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let report =
            super::staging::stage_in(&tx, &self.held, &policies, clock::now_ms(), batch, &lines, &rules).await?;
        tx.commit().await.map_err(pg("staging commit failed"))?;
        Ok(report)
    }

    /// Every commit here is already flushed.
    async fn flush(&self) -> Result<(), Error> {
        Ok(())
    }
}
