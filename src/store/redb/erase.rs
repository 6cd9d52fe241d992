//! Tenant erasure: every extraction of a tenant with everything that hangs off it, in
//! small write transactions that each leave the file valid (`verify` passes between any
//! two of them).
//!
//! Order matters for that: outbox events and webhook delivery ids point at extractions,
//! nothing points at them, so they go first; then the extractions go in chunks, each
//! with its content, findings, raw and staged results, index entries and ledger entries.
//! What the ledger keeps is the per-(tenant, day) `SPEND` total, unchanged (budgets and
//! invoices still add up); the part of it whose entries were erased is recorded in
//! `ERASED_SPEND`, with no extraction, source or request identifiers.
//!
//! Provider batches keep their member lists as they are (bare sequence numbers, whose
//! positions say which line of a submitted file is whose), except a batch still at its
//! intent, which loses the erased members and is closed if none remain. Erased sequence
//! numbers are never handed out again (`META_SEQ_FLOOR`), so an old member list can never
//! come to name someone else's extraction. A late provider answer names an extraction id
//! that no longer exists: it is a stranger, neither committed nor charged.

use std::collections::HashSet;

use redb::ReadableTable;

use super::Error;
use super::batches::{load_batch, save_batch};
use super::codec::decode;
use super::extractions::load;
use super::records::{LedgerRecord, OutboxRecord};
use super::rules::erase::{self, ErasedSpend};
use super::rules::evaluation;
use super::tables::{META_SEQ_FLOOR, required};
use super::write_tables::WriteTables;
use crate::domain::lifecycle::State;
use crate::store::evaluation::{EvaluationRecord, TrialBatchRecord};
use crate::store::seam::ErasureReport;

/// Extractions erased per write transaction: small enough that intake barely notices.
const CHUNK: usize = 500;

/// Up to `CHUNK` extractions of the tenant; `true` when more remain.
pub(super) fn erase_chunk(
    t: &mut WriteTables<'_>,
    tenant: &str,
    since: u64,
) -> Result<((ErasureReport, bool), bool), Error> {
    let mut seqs = Vec::new();
    for entry in t.tenant_index.range((tenant, 0)..=(tenant, u64::MAX))? {
        seqs.push(entry?.0.value().1);
        if seqs.len() > CHUNK {
            break;
        }
    }
    let more = seqs.len() > CHUNK;
    seqs.truncate(CHUNK);
    let mut report = ErasureReport::default();
    if seqs.is_empty() {
        return Ok(((report, false), false));
    }
    // New events of these extractions (committed since the first step) go with them.
    let erased: HashSet<u64> = seqs.iter().copied().collect();
    let mut events = Vec::new();
    for entry in t.outbox.range(since.saturating_add(1)..)? {
        let (seq, value) = entry?;
        let event: OutboxRecord = decode(value.value())?;
        if erased.contains(&event.extraction_seq) {
            events.push((seq.value(), event.next_attempt_at_ms));
        }
    }
    for (seq, due_at) in events {
        t.outbox.remove(seq)?;
        t.outbox_due.remove((due_at, seq))?;
        t.outbox_dead.remove(seq)?;
        report.outbox_events += 1;
    }
    let mut spent = ErasedSpend::default();
    for &seq in &seqs {
        erase_one(t, seq, &mut report, &mut spent)?;
    }
    for (key, micros) in spent.totals() {
        let kept = t.erased_spend.get(key)?.map_or(0, |v| v.value());
        t.erased_spend.insert(key, kept.saturating_add(micros))?;
    }
    report.intents_closed = release_intents(t, &erased)?;
    let floor = t.meta.get(META_SEQ_FLOOR)?.map_or(0, |v| v.value());
    let highest = seqs.iter().copied().max().unwrap_or(0);
    if highest > floor {
        t.meta.insert(META_SEQ_FLOOR, highest)?;
    }
    Ok(((report, more), true))
}

fn erase_one(
    t: &mut WriteTables<'_>,
    seq: u64,
    report: &mut ErasureReport,
    spent: &mut ErasedSpend,
) -> Result<(), Error> {
    let record = load(t, seq)?;
    t.identity.remove(record.id.as_bytes())?;
    t.extractions.remove(seq)?;
    super::state_counts::unindex(t, record.state.name().code(), seq)?;
    super::tenant_counts::moved(t, &record, Some(record.state.name()), None)?;
    super::pending_queue::forget(t, &record)?;
    super::reservations::release(t, &record)?;
    match record.state {
        State::Claimed { expires_at_ms, .. } => {
            t.lease_index.remove((expires_at_ms, seq))?;
        }
        // Export reads committed work through the commit index; nothing of it may stay.
        State::Committed { at_ms } => {
            t.commit_index.remove((record.tenant.as_str(), at_ms, seq))?;
        }
        _ => {}
    }
    t.tenant_index.remove((record.tenant.as_str(), seq))?;
    super::revisions::forget(t, &record)?;
    report.extractions += 1;
    report.contents += u64::from(t.contents.remove(seq)?.is_some());
    report.raw_results += u64::from(t.results.remove(seq)?.is_some());
    report.staged_answers += u64::from(t.staged.remove(seq)?.is_some());
    t.retired.remove(seq)?;
    let (low, high): (&[u8; 32], &[u8; 32]) = (&[0; 32], &[0xff; 32]);
    let mut keys = Vec::new();
    for entry in t.findings.range((seq, low)..=(seq, high))? {
        keys.push(*entry?.0.value().1);
    }
    for key in &keys {
        t.findings.remove((seq, key))?;
        report.findings += 1;
    }
    let mut entries = Vec::new();
    for entry in t.ledger_by_extraction.range((seq, 0)..=(seq, u64::MAX))? {
        entries.push(entry?.0.value().1);
    }
    for ledger_seq in entries {
        let entry: LedgerRecord = decode(&required(t.ledger.get(ledger_seq)?, "ledger", ledger_seq)?)?;
        t.ledger.remove(ledger_seq)?;
        t.ledger_by_tenant.remove((entry.tenant.as_str(), entry.at_ms, ledger_seq))?;
        t.ledger_by_extraction.remove((seq, ledger_seq))?;
        spent.add(&entry);
        report.ledger_entries += 1;
    }
    Ok(())
}

/// Intents drop erased members; an intent left empty is closed (`rules::erase`).
fn release_intents(t: &mut WriteTables<'_>, erased: &HashSet<u64>) -> Result<u64, Error> {
    let mut open = Vec::new();
    for entry in t.open_batches.iter()? {
        open.push(load_batch(t, entry?.0.value())?);
    }
    let mut closed = 0;
    for (batch, emptied) in erase::release_intents(open, erased, t.now_ms) {
        if emptied {
            t.open_batches.remove(batch.seq)?;
            closed += 1;
        }
        save_batch(t, &batch)?;
    }
    Ok(closed)
}

/// The tenant's part of every evaluation (`rules::evaluation::erase`): an evaluation drawn
/// from the tenant alone goes whole, with its trials and trial batches; in any other, the
/// tenant's members lose their source ids and their trials. Run after the extractions
/// went, so their `evaluation` ledger entries are gone before the trials they paid for.
pub(super) fn erase_evaluations(t: &mut WriteTables<'_>, tenant: &str) -> Result<((), bool), Error> {
    let mut evaluations: Vec<EvaluationRecord> = Vec::new();
    for entry in t.evaluations.iter()? {
        evaluations.push(decode(entry?.1.value())?);
    }
    let mut wrote = false;
    for record in evaluations {
        match evaluation::erase(&record, tenant) {
            None => {
                let mut trials = Vec::new();
                for entry in t.trials.range((record.name.as_str(), "", 0)..)? {
                    let key = entry?.0;
                    let (evaluation, candidate, index) = key.value();
                    if evaluation != record.name {
                        break;
                    }
                    trials.push((candidate.to_string(), index));
                }
                for (candidate, index) in trials {
                    t.trials.remove((record.name.as_str(), candidate.as_str(), index))?;
                }
                let mut batches = Vec::new();
                for entry in t.trial_batches.iter()? {
                    let (seq, value) = entry?;
                    if decode::<TrialBatchRecord>(value.value())?.evaluation == record.name {
                        batches.push(seq.value());
                    }
                }
                for seq in batches {
                    t.trial_batches.remove(seq)?;
                }
                t.evaluations.remove(record.name.as_str())?;
                wrote = true;
            }
            Some((kept, erased)) if !erased.is_empty() => {
                for candidate in &kept.candidates {
                    for index in &erased {
                        t.trials.remove((record.name.as_str(), candidate.as_str(), *index))?;
                    }
                }
                t.evaluations.insert(record.name.as_str(), super::codec::encode(&kept)?.as_slice())?;
                wrote = true;
            }
            Some(_) => {}
        }
    }
    Ok(((), wrote))
}
