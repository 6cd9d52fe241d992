//! Pending work by (schema, tenant), so a claim and a batch intent read only the work
//! they can take, tenant by tenant as the fair pick (`rules::fair`) reaches them, instead
//! of walking every pending extraction and skipping the rest.
//!
//! `ops::transition` (and intake, and erasure) keep `PENDING_QUEUE` in step with the
//! `Pending` state in the same write. A file written before the queue existed gets it
//! built when it is opened.

use std::ops::Bound;

use redb::{ReadableTable, ReadableTableMetadata};

use super::Error;
use super::codec::decode;
use super::records::ExtractionRecord;
use super::rules::fair::{self, Bounds, Flow, Limits, Picked, Rotation};
use super::rules::intent::WorkFilter;
use super::rules::reserve::MemberEstimate;
use super::tables::{META_PENDING_QUEUE, required};
use super::write_tables::WriteTables;
use crate::domain::lifecycle::{State, StateName};

type Key = (&'static str, &'static str, u64);

/// Keeps the queue in step with `record` moving from its current state to `to`.
pub(super) fn follow(t: &mut WriteTables<'_>, record: &ExtractionRecord, to: &State) -> Result<(), Error> {
    let key = (record.schema.as_str(), record.tenant.as_str(), record.seq);
    match (matches!(record.state, State::Pending), matches!(to, State::Pending)) {
        (false, true) => {
            t.pending_queue.insert(key, ())?;
        }
        (true, false) => {
            t.pending_queue.remove(key)?;
        }
        _ => {}
    }
    Ok(())
}

/// Takes an extraction that is being removed out of the queue.
pub(super) fn forget(t: &mut WriteTables<'_>, record: &ExtractionRecord) -> Result<(), Error> {
    if matches!(record.state, State::Pending) {
        t.pending_queue.remove((record.schema.as_str(), record.tenant.as_str(), record.seq))?;
    }
    Ok(())
}

/// The (schema, tenant) pairs with pending work (of `schema`, when given) that `accept`
/// takes, in rotation order: those after `after`, then the wrap-around up to and
/// including it. Lazy: one seek per pair the caller actually reaches.
pub(super) fn pairs<'a, T: ReadableTable<Key, ()>>(
    table: &'a T,
    schema: Option<&'a str>,
    accept: &'a dyn Fn(&str, &str) -> bool,
    after: Option<(String, String)>,
) -> impl Iterator<Item = Result<(String, String), Error>> + 'a {
    let mut at = after.clone();
    let mut wrapped = after.is_none();
    std::iter::from_fn(move || {
        loop {
            let found = match next_pair(table, schema, at.as_ref()) {
                Ok(found) => found,
                Err(e) => return Some(Err(e)),
            };
            let pair = match found {
                Some(pair) if !(wrapped && after.as_ref().is_some_and(|stop| pair > *stop)) => pair,
                Some(_) => return None,
                None if !wrapped => {
                    wrapped = true;
                    at = None;
                    continue;
                }
                None => return None,
            };
            at = Some(pair.clone());
            if accept(&pair.1, &pair.0) {
                return Some(Ok(pair));
            }
        }
    })
}

/// The first pair after `at` (from the start of `schema`'s queue, or of the table, when
/// `None`).
fn next_pair<T: ReadableTable<Key, ()>>(
    table: &T,
    schema: Option<&str>,
    at: Option<&(String, String)>,
) -> Result<Option<(String, String)>, Error> {
    let start = match at {
        None => Bound::Included((schema.unwrap_or(""), "", 0)),
        Some((s, t)) => Bound::Excluded((s.as_str(), t.as_str(), u64::MAX)),
    };
    let Some(entry) = table.range::<(&str, &str, u64)>((start, Bound::Unbounded))?.next() else { return Ok(None) };
    let (key, _) = entry?;
    let (found_schema, found_tenant, _) = key.value();
    if schema.is_some_and(|s| s != found_schema) {
        return Ok(None);
    }
    Ok(Some((found_schema.to_string(), found_tenant.to_string())))
}

/// One (schema, tenant)'s pending sequences, oldest first.
pub(super) fn seqs<'a, T: ReadableTable<Key, ()>>(
    table: &'a T,
    schema: &str,
    tenant: &str,
) -> Result<impl Iterator<Item = Result<u64, Error>> + use<'a, T>, Error> {
    let range = table.range((schema, tenant, 0)..=(schema, tenant, u64::MAX))?;
    Ok(range.map(|entry| Ok(entry?.0.value().2)))
}

/// The fair pick (`rules::fair`) over the pending work of `schema` (or of every schema)
/// that `accept` takes, loading each record as the pick reaches it; budgeted tenants'
/// work is priced by `estimate` (nothing, for a claim by a worker that declared no model)
/// against what their budgets have left.
pub(super) fn pick(
    t: &WriteTables<'_>,
    schema: Option<&str>,
    accept: &WorkFilter,
    estimate: Option<&MemberEstimate>,
    limits: Limits,
    rotation: &Rotation,
) -> Result<Picked<ExtractionRecord>, Error> {
    if limits.count == 0 {
        return Ok(Picked::empty(true));
    }
    let accept = |tenant: &str, schema: &str| (accept.0)(tenant, schema);
    let flows = pairs(&t.pending_queue, schema, &accept, rotation.after.clone()).map(|pair| {
        let (schema, tenant) = pair?;
        let records = seqs(&t.pending_queue, &schema, &tenant)?.map(|seq| super::extractions::load(t, seq?));
        Ok(Flow::new(schema, tenant, records))
    });
    let cost = |record: &ExtractionRecord| estimate.map_or(0, |e| (e.0)(record));
    let bounds = Bounds {
        in_flight: &mut |tenant| in_flight(t, tenant),
        headroom: &mut |tenant| super::reservations::headroom(t, tenant),
        cost: &cost,
    };
    fair::pick(flows, &t.policies.fairness, bounds, limits, rotation)
}

/// How many of `tenant`'s extractions are in flight (claimed, submitted, ready), from its
/// counters.
pub(super) fn in_flight(t: &WriteTables<'_>, tenant: &str) -> Result<u64, Error> {
    let mut total = 0u64;
    for entry in t.tenant_counts.range((tenant, "", 0u8)..)? {
        let (key, value) = entry?;
        let (found, _, code) = key.value();
        if found != tenant {
            break;
        }
        if StateName::from_code(i64::from(code)).is_some_and(StateName::is_in_flight) {
            total = total.saturating_add(value.value());
        }
    }
    Ok(total)
}

/// Fills the queue from the pending records unless `META` says it is complete and it has
/// one entry per pending extraction (the count check catches an older binary's writes
/// after a rollback). Runs in the opening transaction, after the counters are checked.
pub(super) fn build_if_absent(t: &mut WriteTables<'_>) -> Result<u64, Error> {
    let pending = super::state_counts::get(t, StateName::Pending)?;
    if t.meta.get(META_PENDING_QUEUE)?.is_some() && t.pending_queue.len()? == pending {
        return Ok(0);
    }
    t.pending_queue.retain(|_, _| false)?;
    let code = StateName::Pending.code();
    let seqs: Vec<u64> =
        t.state_index.range((code, 0)..=(code, u64::MAX))?.map(|e| Ok(e?.0.value().1)).collect::<Result<_, Error>>()?;
    let mut built = 0;
    for seq in seqs {
        let record: ExtractionRecord = decode(&required(t.extractions.get(seq)?, "extraction", seq)?)?;
        if matches!(record.state, State::Pending) {
            t.pending_queue.insert((record.schema.as_str(), record.tenant.as_str(), seq), ())?;
            built += 1;
        }
    }
    t.meta.insert(META_PENDING_QUEUE, 1)?;
    if built > 0 {
        tracing::info!(
            entries = built,
            "built the pending queue (the file predates it, or an older binary wrote to it)"
        );
    }
    Ok(built)
}
