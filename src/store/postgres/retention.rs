//! Retention on PostgreSQL: a committed extraction's content and raw result are dropped
//! some time after its commit, with the same marks as on redb (`retired`: which kinds were
//! dropped), so the identity, hash, record, findings and ledger stay and a redelivery of
//! the same source is still a duplicate. What is due is `store::retention_rules`, shared
//! with the redb store.
//!
//! A step reads up to `scan` committed extractions after a sequence number (one
//! statement), then drops what is due in one short transaction that locks those rows and
//! checks each one again: it may have been erased or changed since the read.

use tokio_postgres::Transaction;

use super::{Error, pg};

pub(super) const DROP_CONTENT: &str = "UPDATE extractions SET content = NULL WHERE seq = $1 AND content IS NOT NULL";
pub(super) const DROP_RESULT: &str = "DELETE FROM results WHERE extraction_seq = $1";

/// Runs one of the drops on extraction `seq`; whether it found something to drop.
pub(super) async fn removed(tx: &Transaction<'_>, sql: &str, seq: i64, what: &'static str) -> Result<bool, Error> {
    Ok(tx.execute(sql, &[&seq]).await.map_err(pg(what))? > 0)
}

/// The stored bits; the column holds only values this store wrote (`RETIRED_*`).
pub(super) fn retired_bits(column: i16) -> u8 {
    u8::try_from(column).unwrap_or(0)
}
