//! The fair pick (`rules::fair`) on PostgreSQL: the (schema, tenant) pairs with pending
//! work by a loose index scan of `extractions_pending_by_tenant`, the oldest few of the
//! pairs the pick can reach, the pick itself in memory, then a lock on what it chose.
//! Rows another transaction holds by then are skipped, as a claim a moment later would.

use std::collections::HashMap;

use super::Error;
use super::rows::{big, decode_record, unbig};
use super::sql::{self, Tx};
use crate::domain::lifecycle::StateName;
use crate::store::rules::fair::{self, Bounds, Flow, Limits, Picked, Rotation};
use crate::store::rules::reserve::{self, MemberEstimate};
use crate::store::{ExtractionRecord, Policies, WorkFilter};

/// The pick first reads this many rounds' worth of each reached pair's oldest items
/// (at least this many each); a pair the pick drains of what was read is read deeper and
/// the pick run again, so it decides exactly as on redb, where it reads as it goes.
const READ_ROUNDS: usize = 4;

/// Picks made again after concurrent transactions took rows first, before the pick
/// settles for what it could lock.
const MAX_PICKS: usize = 4;

/// Pending (schema, tenant) pairs, of `schema` when given, in order: one index probe
/// per pair.
async fn pairs(tx: &impl Tx, schema: Option<&str>) -> Result<Vec<(String, String)>, Error> {
    let rows = sql::query(
        tx,
        "WITH RECURSIVE p(schema_name, tenant) AS ( \
               (SELECT schema_name, tenant FROM extractions WHERE state_code = 1 \
                  AND ($1::text IS NULL OR schema_name = $1) ORDER BY schema_name, tenant LIMIT 1) \
               UNION ALL \
               SELECT n.schema_name, n.tenant FROM p CROSS JOIN LATERAL ( \
                 SELECT schema_name, tenant FROM extractions WHERE state_code = 1 \
                   AND ($1::text IS NULL OR schema_name = $1) AND (schema_name, tenant) > (p.schema_name, p.tenant) \
                   ORDER BY schema_name, tenant LIMIT 1) n) \
             SELECT schema_name, tenant FROM p",
        &[&schema],
        "cannot list tenants with pending work",
    )
    .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Up to `per_pair` oldest pending records of each pair, `skipped` left out.
async fn heads(
    tx: &impl Tx,
    pairs: &[(String, String)],
    per_pair: usize,
    skipped: &[i64],
) -> Result<HashMap<(String, String), Vec<ExtractionRecord>>, Error> {
    let (schemas, tenants): (Vec<&str>, Vec<&str>) = pairs.iter().map(|(s, t)| (s.as_str(), t.as_str())).unzip();
    let rows = sql::query(
        tx,
        "SELECT p.schema_name, p.tenant, e.record FROM unnest($1::text[], $2::text[]) AS p(schema_name, tenant) \
             CROSS JOIN LATERAL (SELECT record FROM extractions WHERE state_code = 1 \
               AND schema_name = p.schema_name AND tenant = p.tenant AND seq <> ALL($4::bigint[]) \
               ORDER BY seq LIMIT $3) e",
        &[&schemas, &tenants, &big(per_pair as u64), &skipped],
        "cannot read pending work",
    )
    .await?;
    let mut out: HashMap<(String, String), Vec<ExtractionRecord>> = HashMap::new();
    for row in &rows {
        out.entry((row.get(0), row.get(1))).or_default().push(decode_record(row.get(2))?);
    }
    Ok(out)
}

/// In-flight work of the tenants that have a limit.
async fn in_flight(tx: &impl Tx, tenants: Vec<&str>) -> Result<HashMap<String, u64>, Error> {
    if tenants.is_empty() {
        return Ok(HashMap::new());
    }
    let codes: Vec<i16> =
        StateName::ALL.into_iter().filter(|s| s.is_in_flight()).map(|s| i16::from(s.code())).collect();
    let rows = sql::query(
        tx,
        "SELECT tenant, count(*) FROM extractions WHERE tenant = ANY($1) AND state_code = ANY($2) GROUP BY tenant",
        &[&tenants, &codes],
        "cannot count work in flight",
    )
    .await?;
    Ok(rows.iter().map(|r| (r.get::<_, String>(0), unbig(r.get(1)))).collect())
}

/// The fair pick over the pending work `accept` takes; the chosen rows are locked (those
/// another transaction holds are left out).
pub(super) async fn pick(
    tx: &impl Tx,
    policies: &Policies,
    schema: Option<&str>,
    accept: &WorkFilter,
    estimate: Option<&MemberEstimate>,
    limits: Limits,
    rotation: &Rotation,
) -> Result<Picked<ExtractionRecord>, Error> {
    if limits.count == 0 {
        return Ok(Picked::empty(true));
    }
    let mut pairs: Vec<(String, String)> =
        pairs(tx, schema).await?.into_iter().filter(|(s, t)| (accept.0)(t, s)).collect();
    // By bytes, as redb's keys are ordered, whatever the database's collation.
    pairs.sort_unstable();
    fair::rotate(&mut pairs, rotation.after.as_ref());
    let fairness = &policies.fairness;
    let ranked = fairness.ranked();
    // A pick of n items reaches at most n pairs (`rules::fair`), and looks one further.
    let reach = if ranked { pairs.len() } else { pairs.len().min(limits.count) };
    let reached = &pairs[..reach];
    let peeked = pairs.get(reach).filter(|_| !ranked);
    let limited: Vec<&str> =
        reached.iter().map(|(_, t)| t.as_str()).filter(|t| fairness.share(t).max_in_flight.is_some()).collect();
    let in_flight = in_flight(tx, limited).await?;
    let budgeted: Vec<&str> =
        reached.iter().map(|(_, t)| t.as_str()).filter(|t| policies.budgets.limit(t).is_some()).collect();
    let headroom = headroom(tx, policies, budgeted, estimate.is_some()).await?;
    let cost = |record: &ExtractionRecord| estimate.map_or(0, |e| (e.0)(record));
    // One more than a pick can take, so a pair it drains still shows whether it has work
    // (and keeps its credit, as on redb).
    let most = limits.count.saturating_add(1);
    let first_read = (READ_ROUNDS * limits.count / reach.max(1)).clamp(READ_ROUNDS, most.max(READ_ROUNDS));
    // Rows another transaction locked between the read and the lock (a concurrent claim)
    // are left out and the pick made again, so concurrent claimers split the work.
    let mut skipped: Vec<i64> = Vec::new();
    for round in 1..=MAX_PICKS {
        let mut depth: HashMap<(String, String), usize> = HashMap::new();
        let mut read: HashMap<(String, String), Vec<ExtractionRecord>> = HashMap::new();
        let mut to_read: Vec<(String, String)> = reached.to_vec();
        let mut picked = loop {
            let deepest = to_read.iter().map(|p| depth.get(p).map_or(first_read, |d| (d * 2).min(most))).max();
            let deepest = deepest.unwrap_or(first_read);
            read.extend(heads(tx, &to_read, deepest, &skipped).await?);
            for pair in &to_read {
                depth.insert(pair.clone(), deepest);
            }
            let flows = reached.iter().chain(peeked).map(|pair| {
                let records = read.get(pair).cloned().unwrap_or_default();
                Ok(Flow::new(pair.0.clone(), pair.1.clone(), records.into_iter().map(Ok)))
            });
            let bounds = Bounds {
                in_flight: &mut |t| Ok(in_flight.get(t).copied().unwrap_or(0)),
                headroom: &mut |t| Ok(headroom.get(t).copied()),
                cost: &cost,
            };
            let picked = fair::pick(flows, fairness, bounds, limits, rotation)?;
            // Pairs the pick took everything read from, where there may be more.
            to_read = reached
                .iter()
                .filter(|pair| {
                    let had = read.get(*pair).map_or(0, Vec::len);
                    let asked = depth.get(pair).copied().unwrap_or(0);
                    let took = picked.items.iter().filter(|r| r.schema == pair.0 && r.tenant == pair.1).count();
                    had == asked && took == had && asked < most
                })
                .cloned()
                .collect();
            if to_read.is_empty() {
                break picked;
            }
        };
        let locked = lock(tx, &picked.items).await?;
        let lost: Vec<i64> =
            picked.items.iter().zip(&locked).filter(|(_, l)| l.is_none()).map(|(r, _)| big(r.seq)).collect();
        if !lost.is_empty() && round < MAX_PICKS {
            skipped.extend(lost);
            continue;
        }
        let reserved = std::mem::take(&mut picked.reserved);
        (picked.items, picked.reserved) = locked.into_iter().zip(reserved).filter_map(|(r, m)| Some((r?, m))).unzip();
        return Ok(picked);
    }
    Ok(Picked::empty(false))
}

/// What each budgeted tenant may still reserve. When the pick reserves (`locking`), the
/// tenants' budgets are locked first, in name order, for the rest of the transaction:
/// two instances forming batches for one tenant take turns, and each reads the other's
/// reservations. Spend and reservations are read in one statement, so an answer charged
/// (and its reservation ended) meanwhile is seen either whole or not at all.
async fn headroom(
    tx: &impl Tx,
    policies: &Policies,
    mut tenants: Vec<&str>,
    locking: bool,
) -> Result<HashMap<String, u64>, Error> {
    if tenants.is_empty() {
        return Ok(HashMap::new());
    }
    tenants.sort_unstable();
    tenants.dedup();
    if locking {
        sql::query(
            tx,
            "SELECT pg_advisory_xact_lock(hashtextextended('commitpoint budget ' || tenant, 0)) \
             FROM unnest($1::text[]) AS t(tenant)",
            &[&tenants],
            "cannot lock the tenants' budgets",
        )
        .await?;
    }
    let from_day = big(policies.budgets.period_start_day(crate::domain::clock::now_ms()));
    let rows = sql::query(
        tx,
        "SELECT t.tenant, \
               coalesce((SELECT sum(micros) FROM spend s WHERE s.tenant = t.tenant AND s.day >= $2), 0)::bigint, \
               coalesce((SELECT sum(reserved_micros) FROM extractions e \
                 WHERE e.tenant = t.tenant AND e.reserved_micros IS NOT NULL), 0)::bigint \
             FROM unnest($1::text[]) AS t(tenant)",
        &[&tenants, &from_day],
        "cannot read what the tenants' budgets have left",
    )
    .await?;
    let mut out = HashMap::with_capacity(rows.len());
    for row in &rows {
        let tenant: String = row.get(0);
        let (spent, reserved) = (unbig(row.get(1)), unbig(row.get(2)));
        if let Some(left) = reserve::headroom(&policies.budgets, &tenant, spent, reserved) {
            out.insert(tenant, left);
        }
    }
    Ok(out)
}

/// Writes the reservations of a formed batch's members (after their move to submitted).
pub(super) async fn reserve(tx: &impl Tx, members: &[ExtractionRecord], reserved: &[Option<u64>]) -> Result<(), Error> {
    let (seqs, micros): (Vec<i64>, Vec<i64>) =
        reserve::to_write(members, reserved).map(|(m, r)| (big(m.seq), big(r))).unzip();
    if seqs.is_empty() {
        return Ok(());
    }
    sql::execute(
        tx,
        "UPDATE extractions SET reserved_micros = r.micros FROM unnest($1::bigint[], $2::bigint[]) AS r(seq, micros) \
         WHERE extractions.seq = r.seq",
        &[&seqs, &micros],
        "cannot write budget reservations",
    )
    .await?;
    Ok(())
}

/// Locks `chosen` where still pending, with their current records, in the pick's order
/// (`None` where another transaction holds or moved it).
async fn lock(tx: &impl Tx, chosen: &[ExtractionRecord]) -> Result<Vec<Option<ExtractionRecord>>, Error> {
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    let seqs: Vec<i64> = chosen.iter().map(|r| big(r.seq)).collect();
    let rows = sql::query(
        tx,
        "SELECT seq, record FROM extractions WHERE seq = ANY($1) AND state_code = 1 FOR UPDATE SKIP LOCKED",
        &[&seqs],
        "cannot lock pending work",
    )
    .await?;
    let mut fresh: HashMap<i64, ExtractionRecord> = HashMap::with_capacity(rows.len());
    for row in &rows {
        fresh.insert(row.get(0), decode_record(row.get(1))?);
    }
    Ok(seqs.iter().map(|seq| fresh.remove(seq)).collect())
}
