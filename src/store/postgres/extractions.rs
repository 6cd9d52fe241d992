//! Intake, claims, results, retries and cancels on PostgreSQL: each one transaction, each
//! state change through `lifecycle::apply` and `rows::transition`, as on redb.

use tokio_postgres::Transaction;

use super::rows::{big, decode_record, insert_new, lock_by_id, stored_content, transition, unbig};
use super::{Error, PgStore, pg};
use crate::domain::clock;
use crate::domain::identity::{ExtractionId, FindingKey};
use crate::domain::lifecycle::{self, Event, Outcome, State, StateName};
use crate::domain::names::LeaseToken;
use crate::domain::schema::ValidatedFinding;
use crate::store::codec::{decode, encode};
use crate::store::records::{ChargeKind, FindingRecord, ResultRecord, StoredContent};
use crate::store::seam::producer_of;
use crate::store::{
    CancelOutcome, ClaimRequest, DeliveryOutcome, ExtractionRecord, Grant, IntakeOutcome, NewExtraction, PostOutcome,
    PostResult, RETRY_CHUNK, RetryFilter, RetryOutcome, Submission,
};

impl PgStore {
    pub(super) async fn intake(&self, new: NewExtraction) -> Result<IntakeOutcome, Error> {
        // A redelivery of a known identity is answered without a transaction.
        if let Some(record) = self.get(new.id).await? {
            return Ok(IntakeOutcome { created: false, record });
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let outcome = intake_in(&tx, new, clock::now_ms()).await?;
        // Acknowledged only once the commit (synchronous_commit = on) has returned.
        tx.commit().await.map_err(pg("intake commit failed"))?;
        Ok(outcome)
    }

    pub(super) async fn intake_delivery(
        &self,
        endpoint: String,
        delivery_id: String,
        new: NewExtraction,
    ) -> Result<DeliveryOutcome, Error> {
        if let Some(record) = self.delivered(endpoint.clone(), delivery_id.clone()).await? {
            return Ok(DeliveryOutcome::Redelivery(record));
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let outcome = intake_in(&tx, new, clock::now_ms()).await?;
        let recorded = tx
            .query_opt(
                "INSERT INTO webhook_deliveries (endpoint, delivery_id, extraction_seq) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING RETURNING extraction_seq",
                &[&endpoint, &delivery_id, &big(outcome.record.seq)],
            )
            .await
            .map_err(pg("cannot record a webhook delivery"))?;
        if recorded.is_none() {
            // Another instance took the same delivery first: what it created is the answer,
            // and this transaction's intake (if any) is rolled back with it.
            drop(tx);
            return match self.delivered(endpoint, delivery_id).await? {
                Some(record) => Ok(DeliveryOutcome::Redelivery(record)),
                None => {
                    Err(Error::Corrupt { kind: "webhook delivery", reason: "recorded without its extraction".into() })
                }
            };
        }
        tx.commit().await.map_err(pg("intake commit failed"))?;
        Ok(DeliveryOutcome::First(outcome))
    }

    pub(super) async fn claim(&self, request: ClaimRequest) -> Result<Vec<Grant>, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let limit = big(request.limit as u64);
        let schema = request.schema.clone();
        // Rows another instance is claiming right now are skipped, not waited for.
        let mut rows = tx
            .query(
                "SELECT record, content FROM extractions WHERE state_code = 2 AND lease_expires_at_ms <= $1 \
                 AND ($2::text IS NULL OR schema_name = $2) ORDER BY lease_expires_at_ms, seq LIMIT $3 \
                 FOR UPDATE SKIP LOCKED",
                &[&big(now_ms), &schema, &limit],
            )
            .await
            .map_err(pg("cannot select expired leases"))?;
        let want = limit - rows.len() as i64;
        if want > 0 {
            rows.extend(
                tx.query(
                    "SELECT record, content FROM extractions WHERE state_code = 1 \
                     AND ($1::text IS NULL OR schema_name = $1) ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED",
                    &[&schema, &want],
                )
                .await
                .map_err(pg("cannot select pending work"))?,
            );
        }
        let mut grants = Vec::with_capacity(rows.len());
        for row in rows {
            let mut record = decode_record(row.get(0))?;
            let content = decode::<StoredContent>(stored_content(row.get(1), record.seq)?)?.text;
            let lease_token = new_lease_token(record.claims + 1);
            let expires_at_ms = now_ms.saturating_add(request.lease_ms);
            let event =
                Event::Claim { worker: request.worker.clone(), lease_token: lease_token.clone(), expires_at_ms };
            let Ok(Outcome::Changed(next)) = lifecycle::apply(&record.state, event, now_ms) else {
                continue;
            };
            record.claims += 1;
            transition(&tx, &policies, now_ms, &mut record, next).await?;
            grants.push(Grant { record, content, lease_token, lease_expires_at_ms: expires_at_ms });
        }
        tx.commit().await.map_err(pg("claim commit failed"))?;
        Ok(grants)
    }

    pub(super) async fn post_result(&self, post: PostResult) -> Result<PostOutcome, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut record) = lock_by_id(&tx, post.id.as_bytes()).await? else {
            return Ok(PostOutcome::NotFound);
        };
        let producer = producer_of(&record.state);
        let (event, fence) = post.event_and_fence();
        let charge = |kind| {
            let record = record.clone();
            let policies = &policies;
            let charge = post.charge.clone();
            let tx = &tx;
            async move {
                match &charge {
                    Some(c) => super::ledger::record_charge(tx, policies, now_ms, &record, c, kind).await,
                    None => Ok(()),
                }
            }
        };
        let next = match lifecycle::apply(&record.state, event, now_ms) {
            Ok(Outcome::Changed(next)) => next,
            Ok(Outcome::Replay) => {
                // The same answer again: counted, never charged.
                charge(ChargeKind::Replay).await?;
                let findings = count_findings(&tx, record.seq).await?;
                tx.commit().await.map_err(pg("result commit failed"))?;
                return Ok(PostOutcome::Replay { findings });
            }
            Err(e) => {
                // A stale reporter's call was still paid for; its answer is just not used.
                charge(ChargeKind::Fresh).await?;
                tx.commit().await.map_err(pg("result commit failed"))?;
                return Ok(PostOutcome::Rejected(e));
            }
        };
        let kind = if matches!(next, State::Failed { .. }) { ChargeKind::FailedValidation } else { ChargeKind::Fresh };
        charge(kind).await?;
        let outcome = match (&next, post.submission) {
            (State::Committed { .. }, Submission::Valid { findings, output }) => {
                let result = ResultRecord {
                    output_json: output.to_string(),
                    producer,
                    fence,
                    usage: post.charge.as_ref().map(|c| c.usage.clone()),
                    latency_ms: post.charge.as_ref().and_then(|c| c.latency_ms),
                    received_at_ms: now_ms,
                };
                let written = write_findings(&tx, &record, &findings, now_ms).await?;
                let bytes = encode(&result)?;
                tx.execute(
                    "INSERT INTO results (extraction_seq, format, record) VALUES ($1, $2, $3) \
                     ON CONFLICT (extraction_seq) DO UPDATE SET format = excluded.format, record = excluded.record",
                    &[&big(record.seq), &i16::from(bytes[0]), &bytes],
                )
                .await
                .map_err(pg("cannot write a result"))?;
                PostOutcome::Committed { findings: written }
            }
            (State::Failed { reason, .. }, _) => PostOutcome::Failed { reason: reason.clone() },
            _ => {
                return Err(Error::Corrupt {
                    kind: "lifecycle",
                    reason: format!("result produced unexpected state {:?}", next.name()),
                });
            }
        };
        // A provider's staged raw answer has served its purpose once the extraction leaves Ready.
        tx.execute("DELETE FROM staged WHERE extraction_seq = $1", &[&big(record.seq)])
            .await
            .map_err(pg("cannot drop a staged answer"))?;
        transition(&tx, &policies, now_ms, &mut record, next).await?;
        tx.commit().await.map_err(pg("result commit failed"))?;
        Ok(outcome)
    }

    pub(super) async fn retry(&self, id: ExtractionId) -> Result<RetryOutcome, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut record) = lock_by_id(&tx, id.as_bytes()).await? else {
            return Ok(RetryOutcome::NotFound);
        };
        match lifecycle::apply(&record.state, Event::Retry, now_ms) {
            Ok(Outcome::Changed(next)) => {
                // As on redb: a fresh allowance of attempts and truncation retries.
                record.attempt += 1;
                record.requeues = 0;
                record.truncation_retried = false;
                transition(&tx, &policies, now_ms, &mut record, next).await?;
                tx.commit().await.map_err(pg("retry commit failed"))?;
                Ok(RetryOutcome::Retried(Box::new(record)))
            }
            Ok(Outcome::Replay) => Ok(RetryOutcome::Retried(Box::new(record))),
            Err(e) => Ok(RetryOutcome::Rejected(e)),
        }
    }

    /// Moves up to `limit` matching failed extractions back to pending in intake order,
    /// `RETRY_CHUNK` per transaction (so no transaction holds many rows for long); returns
    /// how many moved. Rows another transaction holds are skipped, as a retry issued a
    /// moment later would.
    pub(super) async fn retry_failed(&self, filter: RetryFilter, limit: u64) -> Result<u64, Error> {
        const SCAN: i64 = 4 * RETRY_CHUNK as i64;
        let policies = self.policies();
        let mut client = self.client().await?;
        let (mut retried, mut after) = (0u64, 0i64);
        while retried < limit {
            let want = (limit - retried).min(RETRY_CHUNK as u64);
            let now_ms = clock::now_ms();
            let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
            let rows = tx
                .query(
                    "SELECT seq, record FROM extractions WHERE state_code = $1 AND seq > $2 \
                     AND ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR schema_name = $4) \
                     ORDER BY seq LIMIT $5 FOR UPDATE SKIP LOCKED",
                    &[&i16::from(StateName::Failed.code()), &after, &filter.tenant, &filter.schema, &SCAN],
                )
                .await
                .map_err(pg("cannot select failed extractions"))?;
            let exhausted = (rows.len() as i64) < SCAN;
            let (mut moved, mut full) = (0u64, false);
            for row in &rows {
                after = row.get(0);
                let mut record = decode_record(row.get(1))?;
                let State::Failed { class, .. } = &record.state else { continue };
                if filter.failure_class.is_some_and(|c| c != *class) {
                    continue;
                }
                if let Ok(Outcome::Changed(next)) = lifecycle::apply(&record.state, Event::Retry, now_ms) {
                    // The same fresh start as a single retry.
                    record.attempt += 1;
                    record.requeues = 0;
                    record.truncation_retried = false;
                    transition(&tx, &policies, now_ms, &mut record, next).await?;
                    moved += 1;
                    if moved == want {
                        full = true;
                        break;
                    }
                }
            }
            tx.commit().await.map_err(pg("bulk retry commit failed"))?;
            retried += moved;
            if exhausted && !full {
                break;
            }
        }
        Ok(retried)
    }

    pub(super) async fn cancel(&self, id: ExtractionId) -> Result<CancelOutcome, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut record) = lock_by_id(&tx, id.as_bytes()).await? else {
            return Ok(CancelOutcome::NotFound);
        };
        match lifecycle::apply(&record.state, Event::Cancel, now_ms) {
            Ok(Outcome::Changed(next)) => {
                transition(&tx, &policies, now_ms, &mut record, next).await?;
                tx.commit().await.map_err(pg("cancel commit failed"))?;
                Ok(CancelOutcome::Cancelled(Box::new(record)))
            }
            Ok(Outcome::Replay) => Ok(CancelOutcome::Cancelled(Box::new(record))),
            Err(e) => Ok(CancelOutcome::Rejected(e)),
        }
    }
}

/// Inserts unless the identity exists; the existing row is the answer otherwise (the
/// conflicting insert waited for its writer's commit, so it is visible now).
async fn intake_in(tx: &Transaction<'_>, mut new: NewExtraction, now_ms: u64) -> Result<IntakeOutcome, Error> {
    let seq: i64 = tx
        .query_one("SELECT nextval('extraction_seq')", &[])
        .await
        .map_err(pg("cannot allocate a sequence number"))?
        .get(0);
    let content_bytes = new.content.len() as u64;
    let content = encode(&StoredContent { text: std::mem::take(&mut new.content) })?;
    let record = new.pending(unbig(seq), content_bytes, now_ms);
    if insert_new(tx, &record, &content).await?.is_some() {
        return Ok(IntakeOutcome { created: true, record });
    }
    let row = tx
        .query_one("SELECT record FROM extractions WHERE id = $1", &[&record.id.as_bytes().as_slice()])
        .await
        .map_err(pg("cannot read the existing extraction"))?;
    Ok(IntakeOutcome { created: false, record: decode_record(row.get(0))? })
}

/// Upserts by finding key, so an output that repeats a finding stores it once.
async fn write_findings(
    tx: &Transaction<'_>,
    record: &ExtractionRecord,
    findings: &[ValidatedFinding],
    now_ms: u64,
) -> Result<u64, Error> {
    let statement = tx
        .prepare(
            "INSERT INTO findings (extraction_seq, key, format, record) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (extraction_seq, key) DO UPDATE SET format = excluded.format, record = excluded.record",
        )
        .await
        .map_err(pg("cannot prepare the findings insert"))?;
    for finding in findings {
        let key = FindingKey::compute(&record.id, &finding.canonical_identity);
        let stored = FindingRecord {
            key,
            canonical_identity: finding.canonical_identity.clone(),
            body_json: finding.body.to_string(),
            committed_at_ms: now_ms,
        };
        let bytes = encode(&stored)?;
        tx.execute(&statement, &[&big(record.seq), &key.as_bytes().as_slice(), &i16::from(bytes[0]), &bytes])
            .await
            .map_err(pg("cannot write a finding"))?;
    }
    count_findings(tx, record.seq).await
}

async fn count_findings(tx: &Transaction<'_>, seq: u64) -> Result<u64, Error> {
    let n: i64 = tx
        .query_one("SELECT count(*) FROM findings WHERE extraction_seq = $1", &[&big(seq)])
        .await
        .map_err(pg("cannot count findings"))?
        .get(0);
    Ok(unbig(n))
}

/// Fencing tokens: the claim number orders them for humans, the random part makes them
/// unguessable for other workers (the same shape as on redb).
fn new_lease_token(claim_number: u32) -> LeaseToken {
    LeaseToken::new(format!("lt-{claim_number}-{:032x}", rand::random::<u128>()))
}
