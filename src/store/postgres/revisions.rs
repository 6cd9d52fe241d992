//! The revisions of each source on PostgreSQL: the `source_id`, `schema_family` and
//! `superseded_by` columns (migration V3) beside each record. A commit takes the source's
//! advisory lock, reads its other revisions and carries out `rules::revision`'s plan in its
//! own transaction, as redb does in its write.

use async_trait::async_trait;
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Transaction};

use super::outbox::insert_events;
use super::rows::{big, decode_record};
use super::sql::{self, Tx};
use super::{Error, PgStore, pg};
use crate::store::Policies;
use crate::store::codec::{decode, encode};
use crate::store::records::{ExtractionRecord, FindingRecord};
use crate::store::rules::outbox;
use crate::store::rules::revision::{self, Supersession, schema_family};
use crate::store::seam::Revisions;

/// The advisory-lock class of a source's revisions (the two-key space, which the
/// migration lock's one-key space does not overlap).
const LOCK_CLASS: i32 = 0x7265_7673; // "revs"

/// Rows a `migrate` before version 3 left without their source: filled from the records,
/// a chunk per statement, when the store is opened. Returns how many rows it filled.
pub(super) async fn backfill(client: &tokio_postgres::Client) -> Result<u64, Error> {
    let mut filled = 0;
    loop {
        let rows = client
            .query("SELECT seq, record FROM extractions WHERE source_id IS NULL ORDER BY seq LIMIT 500", &[])
            .await
            .map_err(pg("cannot read extractions without their source"))?;
        if rows.is_empty() {
            break;
        }
        for row in &rows {
            let record = decode_record(row.get(1))?;
            let seq: i64 = row.get(0);
            client
                .execute(
                    "UPDATE extractions SET source_id = $2, schema_family = $3 WHERE seq = $1",
                    &[&seq, &record.source_id, &schema_family(&record.schema)],
                )
                .await
                .map_err(pg("cannot fill an extraction's source"))?;
            filled += 1;
        }
    }
    if filled > 0 {
        tracing::info!(rows = filled, "filled the source of extractions written before revisions");
    }
    Ok(filled)
}

/// A source's revisions in intake order.
const REVISIONS: &str =
    "SELECT record FROM extractions WHERE tenant = $1 AND source_id = $2 AND schema_family = $3 ORDER BY seq";

async fn read<C: GenericClient>(
    client: &C,
    tenant: &str,
    source_id: &str,
    family: &str,
) -> Result<Vec<ExtractionRecord>, Error> {
    let rows = client
        .query(REVISIONS, &[&tenant, &source_id, &family])
        .await
        .map_err(pg("cannot read a source's revisions"))?;
    rows.iter().map(|r| decode_record(r.get(0))).collect()
}

async fn identities(tx: &impl Tx, seq: u64) -> Result<Vec<String>, Error> {
    let read = "SELECT record FROM findings WHERE extraction_seq = $1 ORDER BY key";
    let rows = sql::query(tx, read, &[&big(seq)], "cannot read findings").await?;
    rows.iter().map(|r| Ok(decode::<FindingRecord>(r.get(0))?.canonical_identity)).collect()
}

/// Locks `record`'s source for the rest of the transaction (two commits of one source
/// take turns, so each sees the other's link), loads what `rules::revision::plan` needs
/// and asks it.
pub(super) async fn plan(
    tx: &impl Tx,
    record: &ExtractionRecord,
    findings: &[FindingRecord],
) -> Result<Supersession, Error> {
    let family = schema_family(&record.schema);
    // Text cannot hold NUL; tenants and source ids hold no control characters.
    let key = format!("{}\u{1}{}\u{1}{}", record.tenant, record.source_id, family);
    let lock = "SELECT 1 FROM pg_advisory_xact_lock($1::int4, hashtext($2::text))";
    sql::query_one(tx, lock, &[&LOCK_CLASS, &key], "cannot lock a source's revisions").await?;
    let params: [&(dyn ToSql + Sync); 3] = [&record.tenant, &record.source_id, &family];
    let rows = sql::query(tx, REVISIONS, &params, "cannot read a source's revisions").await?;
    let mut revisions = rows.iter().map(|r| decode_record(r.get(0))).collect::<Result<Vec<_>, _>>()?;
    revisions.retain(|r| r.seq != record.seq);
    let mut previous = None;
    if let Some(p) = revision::previous(record, &revisions) {
        previous = Some(identities(tx, p.seq).await?);
    }
    Ok(revision::plan_commit(record, &revisions, findings, previous.as_deref()))
}

async fn set_link(tx: &impl Tx, record: &ExtractionRecord) -> Result<(), Error> {
    let bytes = encode(record)?;
    let by = record.superseded_by.map(|id| id.as_bytes().to_vec());
    let link = "UPDATE extractions SET superseded_by = $2, format = $3, record = $4 WHERE seq = $1";
    let params: [&(dyn ToSql + Sync); 4] = [&big(record.seq), &by, &i16::from(bytes[0]), &bytes];
    sql::execute(tx, link, &params, "cannot link a revision").await?;
    Ok(())
}

/// The plan's writes beyond the committing record's own transition: its born-superseded
/// link's column, the older revision's link, and the `extraction.superseded` events.
pub(super) async fn carry_out(
    tx: &impl Tx,
    policies: &Policies,
    now_ms: u64,
    record: &ExtractionRecord,
    plan: Supersession,
) -> Result<(), Error> {
    if plan.born_superseded_by.is_some() {
        set_link(tx, record).await?;
    }
    let mut older = None;
    if let Some(seq) = plan.supersede {
        let lock = "SELECT record FROM extractions WHERE seq = $1 FOR UPDATE";
        let row = sql::query_one(tx, lock, &[&big(seq)], "cannot read a superseded revision").await?;
        let mut superseded = decode_record(row.get(0))?;
        superseded.superseded_by = Some(record.id);
        set_link(tx, &superseded).await?;
        older = Some(superseded);
    }
    for (seq, kind) in plan.superseded_events {
        let about = match &older {
            Some(o) if o.seq == seq => o,
            _ => record,
        };
        insert_events(tx, now_ms, about, outbox::superseded_events(about, &kind, &policies.sinks)).await?;
    }
    Ok(())
}

#[async_trait]
impl Revisions for PgStore {
    async fn revisions(
        &self,
        tenant: String,
        source_id: String,
        schema_name: String,
    ) -> Result<Vec<ExtractionRecord>, Error> {
        let client = self.client().await?;
        read(&**client, &tenant, &source_id, &schema_name).await
    }
}

/// `verify`'s look at the links: each `superseded_by` names a newer committed revision of
/// the same source (`rules::revision::link_problem`, as on redb).
pub(super) async fn check(tx: &Transaction<'_>, report: &mut crate::store::Report) -> Result<(), Error> {
    let rows = tx
        .query(
            "SELECT e.record, n.record FROM extractions e LEFT JOIN extractions n ON n.id = e.superseded_by \
             WHERE e.superseded_by IS NOT NULL ORDER BY e.seq",
            &[],
        )
        .await
        .map_err(pg("verify cannot read the revisions' links"))?;
    for row in rows {
        // A record that does not decode is reported by the extractions' check.
        let Ok(record) = decode_record(row.get(0)) else { continue };
        let target = row.get::<_, Option<&[u8]>>(1).map(decode_record).transpose();
        let Ok(target) = target else { continue };
        if let Some(problem) = revision::link_problem(&record, target.as_ref()) {
            report.problem(problem);
        }
    }
    Ok(())
}
