//! Staging a provider's result lines in the redb store: one chunk is one write job, which
//! loads the members the lines name, asks `rules::staging` what the lines write, and
//! writes it. A judged answer commits in that job; an unjudged one is staged `Ready`.

use std::collections::HashMap;

use redb::ReadableTable;

use super::Error;
use super::batches::load_batch;
use super::codec::encode;
use super::extractions::{load, settle, transition};
use super::ledger::record_charge;
use super::rules::member::{MemberRules, Move};
use super::rules::staging::{self, Settle, StageWrite};
use super::write_tables::WriteTables;
use crate::store::seam::{IngestLine, StageReport};

pub(super) fn stage(
    t: &mut WriteTables<'_>,
    batch: u64,
    lines: &[IngestLine],
    rules: &MemberRules,
) -> Result<(StageReport, bool), Error> {
    let record = load_batch(t, batch)?;
    let mut members = HashMap::with_capacity(lines.len());
    for id in staging::named(lines) {
        if let Some(seq) = t.identity.get(id.as_bytes())?.map(|v| v.value()) {
            members.insert(id, load(t, seq)?);
        }
    }
    let plan = staging::plan(&record, members, lines, rules, t.now_ms)?;
    let wrote = !plan.writes.is_empty();
    for write in plan.writes {
        match write {
            StageWrite::Charge { member, charge, kind } => {
                record_charge(t, &member, &charge, kind)?;
            }
            StageWrite::Stage { seq, answer } => {
                t.staged.insert(seq, encode(&answer)?.as_slice())?;
            }
            StageWrite::Move(Move { mut member, next }) => transition(t, &mut member, next)?,
            StageWrite::Settle(Settle { mut member, next, answer, charge, producer, fence }) => {
                settle(t, &mut member, next, answer, charge.as_ref(), producer, fence)?;
            }
        }
    }
    Ok((plan.report, wrote))
}
