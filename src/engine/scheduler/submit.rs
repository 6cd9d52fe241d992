//! Submitting an intent: reconcile with the provider first whenever the job might
//! already exist, then submit, then persist the job id before anything else.

use tracing::Instrument;

use super::{Scheduler, traces};
use crate::domain::clock;
use crate::domain::failpoint;
use crate::providers::{BatchSpec, IntentRef, Lookup};
use crate::store::{self, BatchRecord, Leftover};

/// How far before an intent the jobs of other batches are listed for the lookup: wider
/// than any adapter's clock slack.
const KNOWN_JOBS_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

impl Scheduler {
    pub(super) async fn submit(&mut self, batch: BatchRecord) -> Result<Option<u64>, store::Error> {
        // An intent found on start, or one whose earlier submit failed, may have reached
        // the provider (a timeout after the server acted, a crash after it answered).
        // Look for it by batch key before sending anything.
        let fresh = self.formed_here.remove(&batch.seq) && batch.failures == 0;
        let members = self.store.batch_members(batch.seq).await?;
        // An intent whose members were all erased was closed under us: nothing to send.
        if members.is_empty() {
            return Ok(None);
        }
        if !fresh {
            let ids: Vec<_> = members.iter().map(|m| m.id).collect();
            let span = traces::lookup(&batch.batch_key, batch.provider.as_str(), members.len());
            traces::link_members(&span, &members);
            let answer =
                self.look_up(batch.batch_key.as_str(), batch.created_at_ms, &ids).instrument(span.clone()).await;
            traces::looked_up(&span, answer.as_ref().ok());
            match answer? {
                Ok(Lookup::Found(job_id)) => {
                    traces::members_sent(&span, &batch, &members, &job_id);
                    tracing::info!(batch_key = %batch.batch_key, %job_id, "found the job of an unresolved intent; polling it instead of resubmitting");
                    self.health.update(|h| h.batches_recovered += 1);
                    return self.accept(&batch, job_id).await;
                }
                Ok(Lookup::Absent) => {}
                Ok(Lookup::Undecided { recheck_after, reason }) => {
                    tracing::info!(batch_key = %batch.batch_key, %reason, "cannot tell yet whether the provider has this intent's job; not resubmitting");
                    let at = self.recheck_at(recheck_after);
                    self.store.reschedule_batch(batch.seq, at, Some(reason), false).await?;
                    return Ok(Some(at));
                }
                Err(e) => return self.on_error(&batch, &e, true).await,
            }
        }
        let Ok(schema) = self.registry.get(&batch.schema) else {
            let reason = format!("schema {} is no longer registered", batch.schema);
            let leftover = Leftover::Fail { class: crate::domain::lifecycle::FailureClass::InvalidRequest, reason };
            self.close(&batch, "schema missing".to_string(), leftover).await?;
            return Ok(None);
        };
        // Formed under the provider's minimum only once its members waited `min_batch_wait`
        // (`rules::intent::fill`), and bound here only without a `min_batch_fallback`
        // (`rules::intent::bound_to`): the provider would refuse the job, so they fail, saying why.
        if members.len() < self.settings.min_batch_size {
            let reason = format!(
                "only {} extractions of {} arrived within min_batch_wait ({}), and this provider takes at \
                 least {} in one job (min_records); retry them once more work is pending",
                members.len(),
                batch.schema,
                humantime::format_duration(self.settings.min_batch_wait),
                self.settings.min_batch_size
            );
            tracing::warn!(batch_key = %batch.batch_key, %reason, "failing work under the provider's minimum job size");
            let leftover = Leftover::Fail { class: crate::domain::lifecycle::FailureClass::Transient, reason };
            self.close(&batch, "under the provider's minimum job size".to_string(), leftover).await?;
            self.health.update(|h| h.waiting_for_minimum = None);
            return Ok(None);
        }
        let spec = BatchSpec { batch_key: batch.batch_key.as_str(), schema: &schema, members: &members };
        let span = traces::submit(&batch, &members);
        let sent = self.provider.submit(&spec).instrument(span.clone()).await;
        span.record("outcome", if sent.is_ok() { "submitted" } else { "error" });
        match sent {
            Ok(job_id) => {
                span.record("job_id", job_id.as_str());
                traces::members_sent(&span, &batch, &members, &job_id);
                failpoint::hit("after-submit-before-job-id");
                self.health.update(|h| h.batches_submitted += 1);
                self.rate_limits.remove(&batch.seq);
                tracing::info!(batch_key = %batch.batch_key, %job_id, members = members.len(), "batch submitted");
                self.accept(&batch, job_id).await
            }
            Err(e) => self.on_error(&batch, &e, true).await,
        }
    }

    /// Asks the provider for the job an earlier submit of an intent (a production batch or
    /// a trial batch) may have created. The outer error is the store's, the inner the
    /// provider's.
    pub(super) async fn look_up(
        &self,
        batch_key: &str,
        created_at_ms: u64,
        ids: &[crate::domain::identity::ExtractionId],
    ) -> Result<Result<Lookup, crate::providers::ProviderError>, store::Error> {
        let since = created_at_ms.saturating_sub(KNOWN_JOBS_WINDOW.as_millis() as u64);
        let known_jobs = self.store.recorded_jobs_since(self.provider.name().to_string(), since).await?;
        let intent = IntentRef { batch_key, created_at_ms, members: ids, known_jobs: &known_jobs };
        Ok(self.provider.find_job(&intent).await)
    }

    /// When to look an undecided intent up again: however long the adapter suggests,
    /// within ten polls' time.
    pub(super) fn recheck_at(&self, suggested: std::time::Duration) -> u64 {
        let recheck = suggested.min(self.settings.poll_interval.saturating_mul(10));
        clock::now_ms() + recheck.as_millis() as u64
    }

    async fn accept(&self, batch: &BatchRecord, job_id: String) -> Result<Option<u64>, store::Error> {
        let next_poll = clock::now_ms() + self.settings.poll_interval.as_millis() as u64;
        self.store.record_job(batch.seq, job_id, next_poll).await?;
        failpoint::hit("after-job-id-before-poll");
        Ok(Some(next_poll))
    }
}
