//! Staging a provider's result lines in the redb store: one chunk is one write job, which
//! loads the members the lines name, asks `rules::staging` what the lines write, and
//! writes it. A judged answer commits in that job; an unjudged one is staged `Ready`.

use std::collections::HashMap;
use std::sync::Arc;

use redb::ReadableTable;

use super::batches::load_batch;
use super::codec::encode;
use super::extractions::{load, settle, transition};
use super::ledger::record_charge;
use super::rules::member::{MemberRules, Move};
use super::rules::staging::{self, Settle, StageWrite};
use super::write_tables::WriteTables;
use super::{Error, Flush, Store};
use crate::domain::batch::LineResult;
use crate::domain::identity::ExtractionId;
use crate::store::seam::{IngestLine, StageReport};

impl Store {
    /// Stores one chunk of result lines. Safe to call again with the same lines.
    pub async fn stage_results(
        &self,
        batch: u64,
        lines: Vec<(ExtractionId, LineResult)>,
        rules: MemberRules,
    ) -> Result<StageReport, Error> {
        self.ingest_results(batch, staging::unjudged(lines), rules, Flush::Now).await
    }

    /// Stores one chunk of result lines in one transaction, committing every judged
    /// answer there and then. Safe to call again with the same lines: an answer already
    /// taken is a replay. With `Flush::Later` the chunk reaches the disk with the next
    /// flushed commit (a file's last chunk asks for `Now`).
    pub async fn ingest_results(
        &self,
        batch: u64,
        lines: Vec<IngestLine>,
        rules: MemberRules,
        flush: Flush,
    ) -> Result<StageReport, Error> {
        // Shared, not copied: the writer clones a job each time it applies it.
        let lines: Arc<[IngestLine]> = lines.into();
        self.writer.write_flushed(flush, move |t| stage(t, batch, &lines, &rules)).await
    }

    /// A flushed commit that writes nothing: it puts every `Flush::Later` commit before it
    /// on disk.
    pub async fn flush(&self) -> Result<(), Error> {
        self.writer.write(|_| Ok(((), true))).await
    }
}

fn stage(
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
            StageWrite::Charge { member, charge, kind } => record_charge(t, &member, &charge, kind)?,
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
