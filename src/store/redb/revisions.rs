//! The revisions of each source on redb: `REVISIONS` (tenant, source_id, schema name,
//! sequence) is written by intake and read by the commit, which carries out
//! `rules::revision`'s plan in its own transaction. A file written before the index
//! existed gets it built once, when it is opened.

use redb::{ReadTransaction, ReadableTable, ReadableTableMetadata};

use super::Error;
use super::codec::{decode, encode};
use super::extractions::load;
use super::records::{ExtractionRecord, FindingRecord};
use super::rules::outbox;
use super::rules::revision::{self, Supersession, schema_family};
use super::tables::{self, META_REVISIONS};
use super::write_tables::WriteTables;

/// Intake's entry for a new extraction.
pub(super) fn index(t: &mut WriteTables<'_>, record: &ExtractionRecord) -> Result<(), Error> {
    let key = (record.tenant.as_str(), record.source_id.as_str(), schema_family(&record.schema), record.seq);
    t.revisions.insert(key, ())?;
    Ok(())
}

/// Erasure's removal of an extraction's entry.
pub(super) fn forget(t: &mut WriteTables<'_>, record: &ExtractionRecord) -> Result<(), Error> {
    let key = (record.tenant.as_str(), record.source_id.as_str(), schema_family(&record.schema), record.seq);
    t.revisions.remove(key)?;
    Ok(())
}

/// Fills the index from every record unless `META` says it is complete and it has one
/// entry per extraction (the check catches an older binary's intake after a rollback).
/// Existing records of a file that predates revisions have no links; the first commit of
/// each source from then on finds its current committed revision as usual.
pub(super) fn build_if_absent(t: &mut WriteTables<'_>) -> Result<u64, Error> {
    if t.meta.get(META_REVISIONS)?.is_some() && t.revisions.len()? == t.extractions.len()? {
        return Ok(0);
    }
    t.revisions.retain(|_, _| false)?;
    let mut records = Vec::new();
    for entry in t.extractions.iter()? {
        records.push(decode::<ExtractionRecord>(entry?.1.value())?);
    }
    for record in &records {
        index(t, record)?;
    }
    t.meta.insert(META_REVISIONS, 1)?;
    if !records.is_empty() {
        tracing::info!(entries = records.len(), "built the revisions index (the file predates it)");
    }
    Ok(records.len() as u64)
}

/// The sequences of a source's revisions (every version of the schema name), in intake order.
fn seqs<T>(table: &T, tenant: &str, source_id: &str, family: &str) -> Result<Vec<u64>, Error>
where
    T: ReadableTable<(&'static str, &'static str, &'static str, u64), ()>,
{
    let range = table.range((tenant, source_id, family, 0)..=(tenant, source_id, family, u64::MAX))?;
    range.map(|e| Ok(e?.0.value().3)).collect()
}

fn identities(t: &WriteTables<'_>, seq: u64) -> Result<Vec<String>, Error> {
    let (low, high): (&[u8; 32], &[u8; 32]) = (&[0; 32], &[0xff; 32]);
    let mut out = Vec::new();
    for entry in t.findings.range((seq, low)..=(seq, high))? {
        out.push(decode::<FindingRecord>(entry?.1.value())?.canonical_identity);
    }
    Ok(out)
}

/// Loads what `rules::revision::plan` needs for `record`'s commit and asks it.
pub(super) fn plan(
    t: &WriteTables<'_>,
    record: &ExtractionRecord,
    findings: &[FindingRecord],
) -> Result<Supersession, Error> {
    let family = schema_family(&record.schema);
    let mut revisions = Vec::new();
    for seq in seqs(&t.revisions, &record.tenant, &record.source_id, family)? {
        if seq != record.seq {
            revisions.push(load(t, seq)?);
        }
    }
    let previous = revision::previous(record, &revisions).map(|p| identities(t, p.seq)).transpose()?;
    Ok(revision::plan_commit(record, &revisions, findings, previous.as_deref()))
}

/// The plan's writes beyond the committing record's own (already written, with a
/// born-superseded link and the commit's events): the older revision's link, and the
/// `extraction.superseded` events.
pub(super) fn carry_out(t: &mut WriteTables<'_>, record: &ExtractionRecord, plan: Supersession) -> Result<(), Error> {
    if let Some(seq) = plan.supersede {
        let mut older = load(t, seq)?;
        older.superseded_by = Some(record.id);
        t.extractions.insert(seq, encode(&older)?.as_slice())?;
    }
    let policies = std::sync::Arc::clone(&t.policies);
    for (seq, kind) in plan.superseded_events {
        let about = if seq == record.seq { record.clone() } else { load(t, seq)? };
        let events = outbox::superseded_events(&about, &kind, &policies.sinks);
        super::outbox::insert_events(t, &about, events)?;
    }
    Ok(())
}

/// A source's revisions from a read snapshot, in intake order.
pub(super) fn read(
    txn: &ReadTransaction,
    tenant: &str,
    source_id: &str,
    family: &str,
) -> Result<Vec<ExtractionRecord>, Error> {
    let table = txn.open_table(tables::REVISIONS)?;
    let mut out = Vec::new();
    for seq in seqs(&table, tenant, source_id, family)? {
        out.push(super::reads::by_seq(txn, seq)?);
    }
    Ok(out)
}

#[async_trait::async_trait]
impl crate::store::seam::Revisions for super::Store {
    async fn revisions(
        &self,
        tenant: String,
        source_id: String,
        schema_name: String,
    ) -> Result<Vec<ExtractionRecord>, Error> {
        self.read(move |txn| read(txn, &tenant, &source_id, &schema_name)).await
    }
}

/// Whether a revision of `record`'s source has a newer intake (`latest=true` lists only
/// those without).
pub(super) fn newer_exists(txn: &ReadTransaction, record: &ExtractionRecord) -> Result<bool, Error> {
    let table = txn.open_table(tables::REVISIONS)?;
    let (tenant, source, family) = (record.tenant.as_str(), record.source_id.as_str(), schema_family(&record.schema));
    let newer =
        table.range((tenant, source, family, record.seq.saturating_add(1))..=(tenant, source, family, u64::MAX))?;
    Ok(newer.into_iter().next().is_some())
}

/// `verify`'s look at the revisions: every link is sound (`rules::revision::link_problem`)
/// and, once the index exists, it has exactly one entry per extraction, under its source.
pub(super) fn check(
    txn: &ReadTransaction,
    records: &std::collections::BTreeMap<u64, ExtractionRecord>,
    report: &mut crate::store::Report,
) -> Result<(), Error> {
    let by_id: std::collections::HashMap<_, _> = records.values().map(|r| (r.id, r)).collect();
    for record in records.values() {
        let target = record.superseded_by.and_then(|by| by_id.get(&by).copied());
        if let Some(problem) = revision::link_problem(record, target) {
            report.problem(problem);
        }
    }
    if txn.open_table(tables::META)?.get(META_REVISIONS)?.is_none() {
        return Ok(()); // a file that predates the index; opening it builds the index
    }
    let index = txn.open_table(tables::REVISIONS)?;
    let mut entries = 0u64;
    for entry in index.iter()? {
        let (key, _) = entry?;
        let (tenant, source, family, seq) = key.value();
        entries += 1;
        match records.get(&seq) {
            Some(r) if r.tenant == tenant && r.source_id == source && schema_family(&r.schema) == family => {}
            Some(r) => report.problem(format!("{}: its revisions entry names another source", r.id)),
            None => report.problem(format!("revisions entry under unknown extraction #{seq}")),
        }
    }
    if entries != records.len() as u64 {
        report.problem(format!("the revisions index has {entries} entries for {} extractions", records.len()));
    }
    Ok(())
}
