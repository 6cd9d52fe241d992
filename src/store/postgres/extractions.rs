//! Intake, claims, results, retries and cancels on PostgreSQL: each one transaction, each
//! state change through `lifecycle::apply` and `rows::transition`, as on redb.

use crate::store::ExportFilter;
use crate::store::ListFilter;
use crate::store::ListPage;
use crate::store::StateCount;
use crate::store::TenantDepth;
use crate::store::records::ResultRecord;
use crate::store::seam::ExportSink;
use crate::store::seam::Extractions;
use crate::store::seam::SourceContent;
use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use std::collections::HashMap;

use super::intake_group::{EXISTING, Lookup, insert_or_existing, look_up};
use super::ledger::record_charge;
use super::rows::{big, decode_record, lock_by_id, stored_content, transition, unbig};
use super::sql::{self, Tx};
use super::{Error, PgStore, pg};
use crate::domain::clock;
use crate::domain::identity::{ExtractionId, IdPrefix};
use crate::domain::lifecycle::StateName;
use crate::store::codec::{decode, encode};
use crate::store::records::{FindingRecord, StoredContent};
use crate::store::rules::operator::{self, SCAN_CHUNK, Step};
use crate::store::rules::{claim, lease, post};
use crate::store::{
    CancelOutcome, ClaimRequest, DeliveryOutcome, ExtendOutcome, ExtractionRecord, Grant, IntakeOutcome,
    LeaseExtension, NewExtraction, Policies, PostOutcome, PostResult, RetryFilter, RetryOutcome,
};

/// The counts by state: the folded counters plus the deltas written since, with the
/// deltas folded in by the same statement. The `SELECT` sees the statement's snapshot,
/// from before its own fold, so it adds each delta exactly once (folded or not), and a
/// fold another reader commits meanwhile is not counted twice. The fold takes the counter
/// rows in state order, so two concurrent folds wait for each other instead of deadlocking.
const COUNTS: &str = "WITH moved AS (DELETE FROM state_deltas RETURNING state_code, delta), \
     folded AS (INSERT INTO state_counts (state_code, n) \
     SELECT state_code, sum(delta)::bigint FROM moved GROUP BY state_code ORDER BY state_code \
     ON CONFLICT (state_code) DO UPDATE SET n = state_counts.n + excluded.n) \
     SELECT c.code, coalesce((SELECT n FROM state_counts WHERE state_code = c.code), 0) \
     + coalesce((SELECT sum(delta)::bigint FROM state_deltas WHERE state_code = c.code), 0), \
     (SELECT updated_at_ms FROM extractions WHERE state_code = c.code ORDER BY seq LIMIT 1) \
     FROM unnest($1::smallint[]) AS c(code)";

const RECORD_DELIVERY: &str = "INSERT INTO webhook_deliveries (endpoint, delivery_id, extraction_seq) \
     VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING extraction_seq";

/// Makes a result's writes (`rules::post`) in this transaction: a post's, or (planned by
/// `post::plan_settle`) a judged answer's that ingestion commits as it stages it.
pub(super) async fn carry_out(
    tx: &impl Tx,
    policies: &Policies,
    now_ms: u64,
    record: &mut ExtractionRecord,
    plan: post::Plan<'_>,
) -> Result<PostOutcome, Error> {
    if let Some((charge, kind)) = plan.charge {
        record_charge(tx, policies, now_ms, record, charge, kind).await?;
    }
    if plan.drop_staged {
        let drop = "DELETE FROM staged WHERE extraction_seq = $1";
        sql::execute(tx, drop, &[&big(record.seq)], "cannot drop a staged answer").await?;
    }
    write_findings(tx, record.seq, &plan.findings).await?;
    if let Some(result) = &plan.result {
        let bytes = encode(result)?;
        let write = "INSERT INTO results (extraction_seq, format, record) VALUES ($1, $2, $3) \
                     ON CONFLICT (extraction_seq) DO UPDATE SET format = excluded.format, record = excluded.record";
        sql::execute(tx, write, &[&big(record.seq), &i16::from(bytes[0]), &bytes], "cannot write a result").await?;
    }
    plan.change.apply(record);
    if let Some(next) = plan.next {
        // A commit also settles the links among its source's revisions (`rules::revision`).
        let mut revision = None;
        if matches!(next, crate::domain::lifecycle::State::Committed { .. }) {
            let planned = super::revisions::plan(tx, record, &plan.findings).await?;
            planned.link(record);
            revision = Some(planned);
        }
        super::rows::transition_as(tx, policies, now_ms, record, next, revision.as_ref().map(|r| &r.committed_kind))
            .await?;
        if let Some(revision) = revision {
            super::revisions::carry_out(tx, policies, now_ms, record, revision).await?;
        }
    }
    let findings = if plan.answer.counts_findings() { count_findings(tx, record.seq).await? } else { 0 };
    Ok(plan.answer.outcome(findings))
}

/// Upserts by finding key, so an output that repeats a finding stores it once. One
/// statement for all of them: the keys, formats and records as arrays.
async fn write_findings(tx: &impl Tx, seq: u64, findings: &[FindingRecord]) -> Result<(), Error> {
    if findings.is_empty() {
        return Ok(());
    }
    let mut keys: Vec<&[u8]> = Vec::with_capacity(findings.len());
    let mut formats: Vec<i16> = Vec::with_capacity(findings.len());
    let mut records: Vec<Vec<u8>> = Vec::with_capacity(findings.len());
    // A key repeated within one output keeps its last record, as the upserts one by one did.
    let mut last: HashMap<&[u8], usize> = HashMap::with_capacity(findings.len());
    for finding in findings {
        let bytes = encode(finding)?;
        let key = finding.key.as_bytes().as_slice();
        if let Some(&at) = last.get(key) {
            formats[at] = i16::from(bytes[0]);
            records[at] = bytes;
            continue;
        }
        last.insert(key, keys.len());
        keys.push(key);
        formats.push(i16::from(bytes[0]));
        records.push(bytes);
    }
    let write = "INSERT INTO findings (extraction_seq, key, format, record) \
                 SELECT $1, f.key, f.format, f.record FROM unnest($2::bytea[], $3::smallint[], $4::bytea[]) \
                 AS f(key, format, record) \
                 ON CONFLICT (extraction_seq, key) DO UPDATE SET format = excluded.format, record = excluded.record";
    sql::execute(tx, write, &[&big(seq), &keys, &formats, &records], "cannot write a finding").await?;
    Ok(())
}

async fn count_findings(tx: &impl Tx, seq: u64) -> Result<u64, Error> {
    let count = "SELECT count(*) FROM findings WHERE extraction_seq = $1";
    let n: i64 = sql::query_one(tx, count, &[&big(seq)], "cannot count findings").await?.get(0);
    Ok(unbig(n))
}

#[async_trait]
impl Extractions for PgStore {
    /// Hands every extraction the filter selects to `sink`, then `None` once the walk is
    /// complete; a sink that returns `false` ends the walk early (no `None` then).
    async fn export_to(&self, filter: ExportFilter, mut sink: ExportSink) -> Result<(), Error> {
        let mut client = self.export_client().await?;
        let tx = super::snapshot(&mut client).await?;
        let mut after = (big(filter.since_ms), 0i64);
        // An empty window (`since >= until`) reads nothing and is complete at once.
        let mut more = filter.since_ms < filter.until_ms;
        while more {
            let page = super::export::read_page(&tx, &filter, after).await?;
            let Some(last) = page.last() else { break };
            after = (big(last.committed_at_ms), big(last.record.seq));
            more = page.len() as i64 == super::export::PAGE;
            let (returned, go_on) = tokio::task::spawn_blocking(move || {
                for item in page {
                    if !sink(Some(item)) {
                        return (sink, false);
                    }
                }
                (sink, true)
            })
            .await
            .map_err(|e| Error::task("export", e))?;
            sink = returned;
            if !go_on {
                return Ok(());
            }
        }
        // The walk is complete: the sink learns so (its last line may be a summary).
        tokio::task::spawn_blocking(move || {
            sink(None);
        })
        .await
        .map_err(|e| Error::task("export", e))?;
        tx.commit().await.map_err(pg("export snapshot ended badly"))?;
        Ok(())
    }

    /// Answered once the commit that holds it returned, often shared with other intakes
    /// (`intake_group`).
    async fn intake(&self, new: NewExtraction) -> Result<IntakeOutcome, Error> {
        self.intake.intake(new).await
    }

    async fn intake_delivery(
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
        let outcome = match look_up(&tx, &new.id).await? {
            Lookup::Known(record) => IntakeOutcome { created: false, record: *record },
            Lookup::Fresh(seq) => insert_or_existing(&tx, new, seq, clock::now_ms()).await?,
        };
        let statement = tx.prepare_cached(RECORD_DELIVERY).await.map_err(pg("cannot record a webhook delivery"))?;
        let recorded = tx
            .query_opt(&statement, &[&endpoint, &delivery_id, &big(outcome.record.seq)])
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

    async fn claim(&self, request: ClaimRequest) -> Result<Vec<Grant>, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let limit = big(request.limit as u64);
        let schema = request.schema.clone();
        // Rows another instance is claiming right now are skipped, not waited for.
        let rows = sql::query(
            &tx,
            "SELECT record, content FROM extractions WHERE state_code = 2 AND lease_expires_at_ms <= $1 \
                 AND ($2::text IS NULL OR schema_name = $2) \
                 AND ($4::text[] IS NULL OR tenant = ANY($4)) AND ($5::text[] IS NULL OR schema_name = ANY($5)) \
                 ORDER BY lease_expires_at_ms, seq LIMIT $3 FOR UPDATE SKIP LOCKED",
            &[&big(now_ms), &schema, &limit, &request.scope.tenants, &request.scope.schemas],
            "cannot select expired leases",
        )
        .await?;
        let mut candidates = Vec::with_capacity(rows.len());
        for row in &rows {
            let record = decode_record(row.get(0))?;
            let text = decode::<StoredContent>(stored_content(row.get(1), record.seq)?)?.text;
            candidates.push((record, text));
        }
        let queue = claim::queue(&request);
        let mut rotation = policies.rotations.take(&queue);
        let limits = claim::limits(&request, candidates.len());
        let mut picked = super::pending_queue::pick(
            &tx,
            &policies,
            request.schema.as_deref(),
            &claim::accepted(&request),
            request.estimate.as_ref(),
            limits,
            &rotation,
        )
        .await;
        if let Ok(picked) = &mut picked {
            rotation.keep(picked);
        }
        policies.rotations.put(&queue, rotation);
        let picked = picked?;
        let mut reserved = vec![None; candidates.len()];
        reserved.extend(picked.reserved);
        let pending = picked.items;
        let seqs: Vec<i64> = pending.iter().map(|r| big(r.seq)).collect();
        let mut contents: std::collections::HashMap<i64, Option<Vec<u8>>> = sql::query(
            &tx,
            "SELECT seq, content FROM extractions WHERE seq = ANY($1)",
            &[&seqs],
            "cannot read claimed sources",
        )
        .await?
        .into_iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
        for record in pending {
            let stored = contents.remove(&big(record.seq)).flatten();
            let text = decode::<StoredContent>(stored_content(stored.as_deref(), record.seq)?)?.text;
            candidates.push((record, text));
        }
        let mut grants = Vec::with_capacity(candidates.len());
        let (mut granted, mut granted_reserved) = (Vec::new(), Vec::new());
        for ((mut record, content), micros) in candidates.into_iter().zip(reserved) {
            let Some((next, lease)) = claim::claim(&mut record, &request, now_ms, rand::random()) else {
                continue;
            };
            transition(&tx, &policies, now_ms, &mut record, next).await?;
            granted.push(record.clone());
            granted_reserved.push(micros);
            grants.push(lease.grant(record, content));
        }
        super::pending_queue::reserve(&tx, &granted, &granted_reserved).await?;
        tx.commit().await.map_err(pg("claim commit failed"))?;
        Ok(grants)
    }

    async fn post_result(&self, post: PostResult) -> Result<PostOutcome, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut record) = lock_by_id(&tx, post.id.as_bytes()).await? else {
            return Ok(PostOutcome::NotFound);
        };
        let plan = post::plan_post(&record, &post, now_ms)?;
        let outcome = carry_out(&tx, &policies, now_ms, &mut record, plan).await?;
        tx.commit().await.map_err(pg("result commit failed"))?;
        Ok(outcome)
    }

    async fn retry(&self, id: ExtractionId) -> Result<RetryOutcome, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut record) = lock_by_id(&tx, id.as_bytes()).await? else {
            return Ok(RetryOutcome::NotFound);
        };
        match operator::retry(&mut record, now_ms) {
            Step::Move(next) => {
                transition(&tx, &policies, now_ms, &mut record, next).await?;
                tx.commit().await.map_err(pg("retry commit failed"))?;
                Ok(RetryOutcome::Retried(Box::new(record)))
            }
            Step::Answer(outcome) => Ok(outcome),
        }
    }

    async fn extend_lease(&self, extension: LeaseExtension) -> Result<ExtendOutcome, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut record) = lock_by_id(&tx, extension.id.as_bytes()).await? else {
            return Ok(ExtendOutcome::NotFound);
        };
        match lease::extend(&record, &extension, now_ms) {
            Step::Move(next) => {
                transition(&tx, &policies, now_ms, &mut record, next).await?;
                tx.commit().await.map_err(pg("lease extension commit failed"))?;
                Ok(lease::extended(&record.state))
            }
            Step::Answer(outcome) => Ok(outcome),
        }
    }

    /// Moves up to `limit` matching failed extractions back to pending in intake order,
    /// `RETRY_CHUNK` per transaction (so no transaction holds many rows for long); returns
    /// how many moved. Rows another transaction holds are skipped, as a retry issued a
    /// moment later would.
    async fn retry_failed(&self, filter: RetryFilter, limit: u64) -> Result<u64, Error> {
        let policies = self.policies();
        let mut client = self.client().await?;
        let mut walk = operator::RetryWalk::new(limit);
        while let Some((after, want)) = walk.next_chunk() {
            let now_ms = clock::now_ms();
            let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
            let rows = tx
                .query(
                    "SELECT record FROM extractions WHERE state_code = $1 AND seq > $2 \
                     AND ($3::text IS NULL OR tenant = $3) AND ($4::text IS NULL OR schema_name = $4) \
                     ORDER BY seq LIMIT $5 FOR UPDATE SKIP LOCKED",
                    &[
                        &i16::from(StateName::Failed.code()),
                        &big(after),
                        &filter.tenant,
                        &filter.schema,
                        &big(SCAN_CHUNK as u64),
                    ],
                )
                .await
                .map_err(pg("cannot select failed extractions"))?;
            let exhausted = rows.len() < SCAN_CHUNK;
            let scanned = rows.iter().map(|row| decode_record(row.get(0)));
            let step = operator::bulk_retry(scanned, exhausted, &filter, after, want, now_ms)?;
            let moved = step.moves.len() as u64;
            for (mut record, next) in step.moves {
                transition(&tx, &policies, now_ms, &mut record, next).await?;
            }
            tx.commit().await.map_err(pg("bulk retry commit failed"))?;
            walk.advance(moved, step.next_after);
        }
        Ok(walk.retried())
    }

    async fn cancel(&self, id: ExtractionId) -> Result<CancelOutcome, Error> {
        let now_ms = clock::now_ms();
        let policies = self.policies();
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg("cannot begin a transaction"))?;
        let Some(mut record) = lock_by_id(&tx, id.as_bytes()).await? else {
            return Ok(CancelOutcome::NotFound);
        };
        match operator::cancel(&record, now_ms) {
            Step::Move(next) => {
                transition(&tx, &policies, now_ms, &mut record, next).await?;
                tx.commit().await.map_err(pg("cancel commit failed"))?;
                Ok(CancelOutcome::Cancelled(Box::new(record)))
            }
            Step::Answer(outcome) => Ok(outcome),
        }
    }

    async fn get(&self, id: ExtractionId) -> Result<Option<ExtractionRecord>, Error> {
        let client = self.client().await?;
        let statement = client.prepare_cached(EXISTING).await.map_err(pg("cannot read an extraction"))?;
        let row = client
            .query_opt(&statement, &[&id.as_bytes().as_slice()])
            .await
            .map_err(pg("cannot read an extraction"))?;
        row.map(|r| decode_record(r.get(0))).transpose()
    }

    async fn with_id_prefix(
        &self,
        prefix: IdPrefix,
        tenant: Option<String>,
        limit: usize,
    ) -> Result<Vec<ExtractionRecord>, Error> {
        let client = self.client().await?;
        let (low, high) = prefix.bounds();
        let rows = client
            .query(
                "SELECT record FROM extractions WHERE id BETWEEN $1 AND $2 AND ($3::text IS NULL OR tenant = $3) \
                 ORDER BY id LIMIT $4",
                &[&low.as_slice(), &high.as_slice(), &tenant, &big(limit as u64)],
            )
            .await
            .map_err(pg("cannot look up an id prefix"))?;
        rows.iter().map(|r| decode_record(r.get(0))).collect()
    }

    /// A page in intake order (or newest first) past the cursor; `next` is set only when
    /// more follow.
    async fn list(&self, filter: ListFilter) -> Result<ListPage, Error> {
        let client = self.client().await?;
        let state = filter.state.map(|s| i16::from(s.code()));
        let fetch = big(filter.limit as u64).saturating_add(1);
        let (lo, hi) = filter.seq_bounds();
        let direction = if filter.newest_first { "DESC" } else { "ASC" };
        let rows = client
            .query(
                &format!(
                    "SELECT record FROM extractions WHERE seq BETWEEN $1 AND $6 \
                     AND ($2::text IS NULL OR tenant = $2) AND ($3::smallint IS NULL OR state_code = $3) \
                     AND (NOT $5 OR NOT EXISTS (SELECT 1 FROM extractions n WHERE n.tenant = extractions.tenant \
                     AND n.source_id = extractions.source_id AND n.schema_family = extractions.schema_family \
                     AND n.seq > extractions.seq)) ORDER BY seq {direction} LIMIT $4"
                ),
                &[&big(lo), &filter.tenant, &state, &fetch, &filter.latest, &big(hi)],
            )
            .await
            .map_err(pg("cannot list extractions"))?;
        let more = rows.len() > filter.limit;
        let records = rows.iter().take(filter.limit).map(|r| decode_record(r.get(0))).collect::<Result<Vec<_>, _>>()?;
        let next = if more { records.last().map(|r| r.seq) } else { None };
        Ok(ListPage { records, next })
    }

    async fn get_by_seq(&self, seq: u64) -> Result<Option<ExtractionRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT record FROM extractions WHERE seq = $1", &[&big(seq)])
            .await
            .map_err(pg("cannot read an extraction"))?;
        row.map(|r| decode_record(r.get(0))).transpose()
    }

    async fn delivered(&self, endpoint: String, delivery_id: String) -> Result<Option<ExtractionRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT e.record FROM webhook_deliveries d JOIN extractions e ON e.seq = d.extraction_seq \
                 WHERE d.endpoint = $1 AND d.delivery_id = $2",
                &[&endpoint, &delivery_id],
            )
            .await
            .map_err(pg("cannot read a webhook delivery"))?;
        row.map(|r| decode_record(r.get(0))).transpose()
    }

    async fn findings(&self, id: ExtractionId) -> Result<Option<Vec<FindingRecord>>, Error> {
        Ok(self.findings_page(id, None, usize::MAX).await?.map(|(findings, _)| findings))
    }

    /// Findings in key order after `after`; `true` when more follow.
    async fn findings_page(
        &self,
        id: ExtractionId,
        after: Option<[u8; 32]>,
        limit: usize,
    ) -> Result<Option<(Vec<FindingRecord>, bool)>, Error> {
        let client = self.client().await?;
        let Some(row) = client
            .query_opt("SELECT seq FROM extractions WHERE id = $1", &[&id.as_bytes().as_slice()])
            .await
            .map_err(pg("cannot read an extraction"))?
        else {
            return Ok(None);
        };
        let seq: i64 = row.get(0);
        let after: Vec<u8> = after.map(|a| a.to_vec()).unwrap_or_default();
        // One more than asked: whether more follow, without a count.
        let fetch = big(limit as u64).saturating_add(1);
        let rows = client
            .query(
                "SELECT record FROM findings WHERE extraction_seq = $1 AND key > $2 ORDER BY key LIMIT $3",
                &[&seq, &after, &fetch],
            )
            .await
            .map_err(pg("cannot read findings"))?;
        let more = rows.len() > limit;
        let findings = rows.iter().take(limit).map(|r| decode(r.get(0))).collect::<Result<Vec<_>, _>>()?;
        Ok(Some((findings, more)))
    }

    async fn result(&self, id: ExtractionId) -> Result<Option<ResultRecord>, Error> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT r.record FROM extractions e JOIN results r ON r.extraction_seq = e.seq WHERE e.id = $1",
                &[&id.as_bytes().as_slice()],
            )
            .await
            .map_err(pg("cannot read a result"))?;
        row.map(|r| decode(r.get(0))).transpose()
    }

    /// How many extractions are in each state (the counters of migration V6), and when the
    /// first of each (in intake order, as on redb) entered it, by one index probe per state.
    async fn counts_by_state(&self) -> Result<Vec<StateCount>, Error> {
        let client = self.client().await?;
        let codes: Vec<i16> = StateName::ALL.iter().map(|s| i16::from(s.code())).collect();
        let statement = client.prepare_cached(COUNTS).await.map_err(pg("cannot count extractions"))?;
        let rows = client.query(&statement, &[&codes]).await.map_err(pg("cannot count extractions"))?;
        let mut counts = Vec::with_capacity(rows.len());
        for row in rows {
            let code: i16 = row.get(0);
            let Some(state) = StateName::from_code(code.into()) else {
                continue;
            };
            let (count, oldest): (i64, Option<i64>) = (row.get(1), row.get(2));
            counts.push(StateCount { state, count: unbig(count), oldest_since_ms: oldest.map(unbig) });
        }
        Ok(counts)
    }

    /// Each tenant's depth, counted by one statement (one snapshot): the rows by tenant,
    /// schema and state, and the head of each pair's pending work in intake order, as on
    /// redb. Unlike redb's counters this reads the table; issue 28 is PostgreSQL's speed.
    async fn depth_by_tenant(&self) -> Result<Vec<TenantDepth>, Error> {
        let client = self.client().await?;
        let pending = i16::from(StateName::Pending.code());
        let rows = client
            .query(
                "WITH counts AS (SELECT tenant, schema_name, state_code, count(*) AS n FROM extractions \
                 GROUP BY tenant, schema_name, state_code), \
                 heads AS (SELECT DISTINCT ON (tenant, schema_name) tenant, schema_name, updated_at_ms \
                 FROM extractions WHERE state_code = $1 ORDER BY tenant, schema_name, seq) \
                 SELECT c.tenant, c.schema_name, c.state_code, c.n, h.updated_at_ms FROM counts c \
                 LEFT JOIN heads h ON c.state_code = $1 AND h.tenant = c.tenant AND h.schema_name = c.schema_name",
                &[&pending],
            )
            .await
            .map_err(pg("cannot count each tenant's extractions"))?;
        let mut counts = Vec::with_capacity(rows.len());
        let mut oldest = std::collections::BTreeMap::new();
        for row in rows {
            let (tenant, schema, code, n, head): (String, String, i16, i64, Option<i64>) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            if let Some(since) = head {
                oldest.insert((tenant.clone(), schema.clone()), unbig(since));
            }
            // A code outside u8 is no state; `assemble` leaves unknown codes out.
            counts.push(((tenant, schema, u8::try_from(code).unwrap_or(u8::MAX)), unbig(n)));
        }
        Ok(crate::store::rules::depth::assemble(counts, oldest))
    }

    /// The `RETIRED_*` bits of each of `seqs` that retention touched (absent: nothing dropped).
    async fn retired(&self, seqs: Vec<u64>) -> Result<HashMap<u64, u8>, Error> {
        let client = self.client().await?;
        let wanted: Vec<i64> = seqs.into_iter().map(big).collect();
        let rows = client
            .query("SELECT extraction_seq, bits FROM retired WHERE extraction_seq = ANY($1)", &[&wanted])
            .await
            .map_err(pg("cannot read what retention dropped"))?;
        Ok(rows.iter().map(|r| (unbig(r.get(0)), super::retention::retired_bits(r.get(1)))).collect())
    }

    async fn sources(&self, ids: Vec<ExtractionId>) -> Result<HashMap<ExtractionId, SourceContent>, Error> {
        let client = self.client().await?;
        let wanted: Vec<&[u8]> = ids.iter().map(|id| id.as_bytes().as_slice()).collect();
        let rows = client
            .query("SELECT record, content FROM extractions WHERE id = ANY($1) AND content IS NOT NULL", &[&wanted])
            .await
            .map_err(pg("cannot read sources"))?;
        let mut out = HashMap::with_capacity(rows.len());
        for row in &rows {
            let record = decode_record(row.get(0))?;
            let content = decode::<StoredContent>(stored_content(row.get(1), record.seq)?)?.text;
            out.insert(record.id, SourceContent { source_id: record.source_id, content });
        }
        Ok(out)
    }
}
