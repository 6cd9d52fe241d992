//! Export on PostgreSQL: a tenant's committed extractions with their findings, in commit
//! order (ties within one millisecond in intake order), as on redb. One `REPEATABLE READ`
//! read-only transaction is the snapshot, so commits made meanwhile change nothing the
//! export sees; it is read a page at a time by keyset (commit time, sequence), with each
//! page's findings in one query, so memory holds one page however many are exported.
//!
//! The sink may block (it hands lines to a slower HTTP client), so it runs on a blocking
//! thread between pages. The transaction holds one connection and its snapshot until the
//! walk ends; on a busy database a very long export delays vacuum meanwhile. That
//! connection comes from the exports' own pool, whose sessions end an idle transaction
//! and a long statement (`ExportSessions`), so a stalled export can neither take the
//! connections everything else needs nor hold its snapshot for ever.

use std::collections::HashMap;

use super::rows::{big, decode_record, unbig};
use super::{Error, pg};
use crate::store::codec::decode;
use crate::store::{ExportFilter, Exported, FindingRecord, ResultRecord};

/// Extractions read per page.
pub(super) const PAGE: i64 = 256;

/// The page after `(committed_at_ms, seq)`, with every extraction's findings in key order.
pub(super) async fn read_page(
    tx: &tokio_postgres::Transaction<'_>,
    filter: &ExportFilter,
    after: (i64, i64),
) -> Result<Vec<Exported>, Error> {
    let rows = tx
        .query(
            "SELECT seq, committed_at_ms, record FROM extractions WHERE tenant = $1 \
             AND committed_at_ms IS NOT NULL AND (committed_at_ms, seq) > ($2, $3) AND committed_at_ms < $4 \
             AND ($5::text IS NULL OR schema_name = $5) AND (NOT $7 OR superseded_by IS NULL) \
             ORDER BY committed_at_ms, seq LIMIT $6",
            &[&filter.tenant, &after.0, &after.1, &big(filter.until_ms), &filter.schema, &PAGE, &filter.latest],
        )
        .await
        .map_err(pg("cannot read committed extractions"))?;
    let seqs: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    // bytea orders as its bytes (memcmp): the order of redb's [u8; 32] keys.
    let finding_rows = tx
        .query(
            "SELECT extraction_seq, record FROM findings WHERE extraction_seq = ANY($1) ORDER BY extraction_seq, key",
            &[&seqs],
        )
        .await
        .map_err(pg("cannot read findings"))?;
    let mut findings: HashMap<i64, Vec<FindingRecord>> = HashMap::new();
    for row in &finding_rows {
        findings.entry(row.get(0)).or_default().push(decode(row.get(1))?);
    }
    let result_rows = tx
        .query("SELECT extraction_seq, record FROM results WHERE extraction_seq = ANY($1)", &[&seqs])
        .await
        .map_err(pg("cannot read raw results"))?;
    let mut outputs: HashMap<i64, String> = HashMap::new();
    for row in &result_rows {
        outputs.insert(row.get(0), decode::<ResultRecord>(row.get(1))?.output_json);
    }
    rows.iter()
        .map(|row| {
            let seq: i64 = row.get(0);
            Ok(Exported {
                record: decode_record(row.get(2))?,
                committed_at_ms: unbig(row.get(1)),
                findings: findings.remove(&seq).unwrap_or_default(),
                output_json: outputs.remove(&seq),
            })
        })
        .collect()
}
