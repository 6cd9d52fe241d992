//! Polling a job and, once it ends, ingesting its result files.
//!
//! Lines are streamed from the provider through a bounded channel and staged in chunks,
//! so memory does not grow with the file. Staging converges through the keys: a line
//! for a member that already has an answer is a replay, so a crash mid-ingestion only
//! means the files are read again.

use std::collections::HashMap;

use tokio::sync::mpsc;
use tracing::Instrument;

use super::Scheduler;
use crate::domain::batch::LineResult;
use crate::domain::clock;
use crate::domain::failpoint;
use crate::domain::identity::ExtractionId;
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::{Schema, SourceText};
use crate::engine::commit::Judge;
use crate::providers::{FailureCause, JobPhase, JobStatus, ResultLine};
use crate::store::{self, BatchRecord, Flush, IngestLine, Judged, Leftover, SharedStore, SourceContent, StageReport};

impl Scheduler {
    /// A live job that will not go on by itself is kept, never requeued (its members are not
    /// at fault, and what ran is paid for): its reason becomes the batch's note and the
    /// provider's `last_error`, logged once when it starts. Once the job goes on again (any
    /// other phase), its stall is taken off `last_error` unless something else was shown
    /// since: a pause that ended must not read as the provider's current trouble.
    pub(super) fn note_stall(&self, batch_key: &str, noted: Option<&str>, phase: &JobPhase) -> Option<String> {
        let JobPhase::Stalled { reason } = phase else {
            let stall = format!("batch {batch_key}: ");
            if let Some(old) = noted.filter(|note| note.starts_with(&stall)) {
                tracing::info!(%batch_key, "the provider's job goes on again");
                self.health.update(|h| {
                    if h.last_error.as_deref() == Some(old) {
                        h.last_error = None;
                    }
                });
            }
            return None;
        };
        let text = format!("batch {batch_key}: {reason}");
        if noted != Some(text.as_str()) {
            tracing::warn!(%batch_key, %reason, "the provider's job is stalled; it is kept and polled");
        }
        self.health.update(|h| h.last_error = Some(text.clone()));
        Some(text)
    }

    pub(super) async fn poll(&mut self, batch: BatchRecord, job_id: &str) -> Result<Option<u64>, store::Error> {
        let span = super::traces::poll(&batch.batch_key, batch.provider.as_str(), job_id);
        let status = match self.provider.poll(job_id).instrument(span.clone()).await {
            Ok(status) => status,
            Err(e) => return self.on_error(&batch, &e, false).await,
        };
        span.record("phase", super::traces::phase(&status.phase));
        drop(span);
        let note = self.note_stall(batch.batch_key.as_str(), batch.last_error.as_deref(), &status.phase);
        if !status.phase.is_terminal() {
            let next = clock::now_ms() + self.settings.poll_interval.as_millis() as u64;
            self.store.reschedule_batch(batch.seq, next, note, false).await?;
            return Ok(Some(next));
        }
        let span = super::traces::results(&batch.batch_key, batch.provider.as_str(), job_id);
        let ingested = self.ingest(&batch, &status).instrument(span.clone()).await;
        if let Ok(report) = &ingested {
            span.record("staged", report.staged).record("refused", report.refused);
        }
        drop(span);
        let report = match ingested {
            Ok(report) => report,
            Err(IngestError::Provider(e)) => return self.on_error(&batch, &e, false).await,
            Err(IngestError::Store(e)) => return Err(e),
        };
        failpoint::hit("after-stage-before-commit");
        self.commit_ready().await?;
        let mut hold = None;
        let (outcome, leftover) = match &status.phase {
            // The provider had no room: nobody's fault, the members go back as the same
            // attempt and new submissions wait.
            JobPhase::Failed { reason, cause: FailureCause::Capacity } => {
                hold = Some(reason.clone());
                (format!("failed: {reason}"), Leftover::Return)
            }
            // Whatever the provider refused by line is refused alone; the others go back
            // as the same attempt.
            JobPhase::Failed { reason, cause: FailureCause::Lines(lines) }
                if self.refuse_lines(&batch, lines, reason).await? > 0 =>
            {
                (format!("failed: {reason}"), Leftover::Return)
            }
            // Failed blaming no member (Gemini's BATCH_STATE_FAILED, Bedrock's `Failed`, a
            // validation naming nothing): it may fail the same way every time (a schema
            // the provider rejects), so each member's attempt is counted, and after
            // `max_attempts` it fails `attempts_exhausted` with the provider's reason.
            JobPhase::Failed { reason, .. } => {
                self.health.update(|h| {
                    h.batches_failed += 1;
                    h.last_error = Some(format!("batch {} failed: {reason}", batch.batch_key));
                });
                tracing::warn!(batch_key = %batch.batch_key, %reason, "the provider failed a batch blaming no member; each member's attempt is counted");
                (format!("failed: {reason}"), Leftover::Requeue)
            }
            phase => (format!("{phase:?}").to_lowercase(), Leftover::Requeue),
        };
        let closed = self.close(&batch, outcome.clone(), leftover).await?;
        self.health.update(|h| {
            h.batches_closed += 1;
            h.members_requeued += report.requeued;
            h.truncated += report.truncated;
            h.budget_retries += report.budget_retries;
            h.model_refusals += report.model_refusals;
            h.attempts_exhausted += report.exhausted;
        });
        super::count_failures(FailureClass::Truncated, report.failed_truncated);
        super::count_failures(FailureClass::Refused, report.model_refusals);
        super::count_failures(FailureClass::AttemptsExhausted, report.exhausted);
        // A failed batch's input file is as useless now as a finished one's.
        if self.settings.delete_provider_files {
            self.delete_files_later(status.clone());
        }
        match hold {
            Some(reason) => self.hold_submissions(&batch, reason, closed.requeued),
            // A failed batch never ran, so it frees no room.
            None if !matches!(status.phase, JobPhase::Failed { .. }) => self.job_ended(),
            None => {}
        }
        tracing::info!(
            batch_key = %batch.batch_key, %outcome, staged = report.staged, refused = report.refused,
            truncated = report.truncated, retried_with_larger_budget = report.budget_retries,
            model_refusals = report.model_refusals, attempts_exhausted = report.exhausted + closed.exhausted,
            replays = report.replays, committed = report.committed, failed_validation = report.failed_validation,
            unanswered = closed.requeued + report.requeued, "batch closed"
        );
        Ok(None)
    }

    /// Refuses the members on the lines a failed batch names (1-based, in submit order);
    /// returns how many. Lines that name no member are ignored.
    async fn refuse_lines(&self, batch: &BatchRecord, lines: &[u64], reason: &str) -> Result<u64, store::Error> {
        let members = self.store.batch_members(batch.seq).await?;
        let blamed: Vec<(ExtractionId, LineResult)> = lines
            .iter()
            .filter_map(|line| members.get(usize::try_from(line.checked_sub(1)?).ok()?))
            .map(|m| {
                let refusal = LineResult::Refused { class: FailureClass::InvalidRequest, reason: reason.to_string() };
                (m.id, refusal)
            })
            .collect();
        if blamed.is_empty() {
            return Ok(0);
        }
        Ok(self.store.stage_results(batch.seq, blamed, self.rules()).await?.refused)
    }

    /// Downloads, judges and stores the result files as a pipeline: while the writer
    /// commits one chunk, the next is parsed and validated here. Every stage holds a bounded number of lines, whatever the file's size.
    async fn ingest(&self, batch: &BatchRecord, status: &JobStatus) -> Result<StageReport, IngestError> {
        let (lines, mut incoming) = mpsc::channel::<ResultLine>(INGEST_CHUNK);
        let (judged_out, mut judged_in) = mpsc::channel::<JudgedChunk>(JUDGED_CHUNKS);
        let provider = self.provider.clone();
        let download = async move {
            let counts = provider.stream_results(status, &lines).await;
            drop(lines);
            counts
        };
        // A schema no longer registered: its answers are staged as Ready and wait for it.
        let schema = self.registry.get(&batch.schema).ok();
        let judge = self.committer.judge().clone();
        let reask = self.settings.reask;
        let sources_from = &self.store;
        // `incoming` moves in: if judging stops, dropping it stops the download too.
        let judging = async move {
            let mut chunk = Vec::with_capacity(INGEST_CHUNK);
            loop {
                if incoming.recv_many(&mut chunk, INGEST_CHUNK).await == 0 {
                    return;
                }
                let sources = match schema.as_deref() {
                    Some(schema) if schema.grounding().is_some() => read_sources(sources_from, &chunk).await,
                    _ => Sources::NotNeeded,
                };
                // On this task: the writer, on its own thread, is the bottleneck, and a chunk
                // leaves here as stored text, its parsed trees already freed.
                let judged = judge_chunk(&judge, schema.as_deref(), &sources, reask, chunk.drain(..));
                if judged_out.send(judged).await.is_err() {
                    return;
                }
            }
        };
        let store = &self.store;
        let seq = batch.seq;
        let rules = self.rules();
        let job_id = status.job_id.as_str();
        // `judged_in` moves in: if storing fails, dropping it stops judging, then the download.
        // Chunks commit without waiting for the disk; one flush at the end puts them all
        // there. A crash before it takes them back, and the file is read again after the
        // restart, as it would be after a crash mid-file anyway.
        let stage = async move {
            let mut report = StageReport::default();
            while let Some(chunk) = judged_in.recv().await {
                let spans: Vec<_> = chunk.lines.iter().map(|line| super::traces::stored(batch, job_id, line)).collect();
                let part = store.ingest_results(seq, chunk.lines, rules, Flush::Later).await;
                let outcome = if part.is_ok() { "written" } else { "error" };
                for span in &spans {
                    span.record("outcome", outcome);
                }
                report.add(&part?, chunk.unnamed);
            }
            store.flush().await?;
            Ok::<_, store::Error>(report)
        };
        let (counts, (), report) = tokio::join!(download, judging, stage);
        let report = report.map_err(IngestError::Store)?;
        let counts = counts.map_err(IngestError::Provider)?;
        self.committer.count_ingested(&report, &batch.schema, self.provider.name());
        self.health.update(|h| {
            h.lines_ingested += counts.lines;
            h.malformed_lines += counts.malformed;
        });
        Ok(report)
    }
}

/// Result lines per write transaction. Larger chunks commit less often, but redb holds a
/// transaction's dirty pages in memory: 2,048 ran faster once and broke the flat-RSS target
/// (docs/PERFORMANCE.md, item 2).
const INGEST_CHUNK: usize = 512;

/// Chunks judged ahead of the writer: enough to keep it busy, few enough to keep memory flat.
const JUDGED_CHUNKS: usize = 1;

/// Lines ready for the writer, and how many named no extraction at all.
struct JudgedChunk {
    lines: Vec<IngestLine>,
    unnamed: u64,
}

/// The members' sources a chunk's answers are grounded in, when the schema has rules.
enum Sources {
    /// The schema declares no grounding rules: nothing was read.
    NotNeeded,
    Read(HashMap<ExtractionId, SourceContent>),
    /// The read failed: the answers are staged unjudged, and their commit reads again.
    Unavailable,
}

/// One read for the chunk's answers: their members' source ids and contents.
async fn read_sources(store: &SharedStore, chunk: &[ResultLine]) -> Sources {
    let ids: Vec<ExtractionId> = chunk
        .iter()
        .filter(|(_, result)| matches!(result, LineResult::Answer { .. }))
        .filter_map(|(custom_id, _)| custom_id.parse().ok())
        .collect();
    if ids.is_empty() {
        return Sources::Read(HashMap::new());
    }
    match store.sources(ids).await {
        Ok(sources) => Sources::Read(sources),
        Err(e) => {
            tracing::warn!(error = %store::error_chain(&e), "cannot read sources to ground answers; staging them");
            Sources::Unavailable
        }
    }
}

/// Parses each line's extraction id and judges each answer against the batch's schema.
/// `reask`: the provider's override of the schema's re-ask limit.
fn judge_chunk(
    judge: &Judge,
    schema: Option<&Schema>,
    sources: &Sources,
    reask: Option<u32>,
    raw: impl ExactSizeIterator<Item = ResultLine>,
) -> JudgedChunk {
    let mut lines = Vec::with_capacity(raw.len());
    let mut unnamed = 0;
    for (custom_id, result) in raw {
        let Ok(id) = custom_id.parse::<ExtractionId>() else {
            unnamed += 1;
            continue;
        };
        let judged = match (&result, schema, sources) {
            (LineResult::Answer { .. }, Some(_), Sources::Unavailable) => None,
            (LineResult::Answer { output, .. }, Some(schema), sources) => {
                let source = match sources {
                    Sources::Read(read) => read.get(&id).map(|s| SourceText { id: &s.source_id, text: &s.content }),
                    Sources::NotNeeded | Sources::Unavailable => None,
                };
                let submission = judge.judge_answer(schema, output, source);
                Some(Judged::from(&submission.with_reask_limit(reask)))
            }
            _ => None,
        };
        lines.push(IngestLine { id, result, judged });
    }
    JudgedChunk { lines, unnamed }
}

enum IngestError {
    Provider(crate::providers::ProviderError),
    Store(store::Error),
}
