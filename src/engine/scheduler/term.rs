//! A scheduler drives its provider only within a term of the provider's lease (the store's
//! `Drivers`). Standing by, it asks for a term every few seconds; driving, it renews the
//! term in the background and keeps a local deadline a little short of the lease's expiry.
//!
//! Two guards make a driver whose term is over stop before it calls the provider again:
//! - the store refuses every batch write made outside the current term, so nothing a
//!   stale driver learns from the provider is stored;
//! - [`FencedProvider`] will not start a provider call once the local deadline has passed
//!   (a process paused past its lease, or cut off from the database so it could not
//!   renew), and the term's keeper drops the step in flight at that deadline.
//!
//! What remains (docs/SCALE-OUT.md): a call already under way when the process was
//! paused reaches the provider when it resumes. The batch it may create is found by the
//! next driver through the intent's batch key, as after a crash.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Scheduler;
use crate::domain::batch::OutputBudget;
use crate::domain::schema::Schema;
use crate::providers::{
    BatchProvider, BatchSpec, IntentRef, JobStatus, Lookup, Probe, ProviderError, ResultLine, StreamCounts,
};
use crate::store::{self, DriverTerm, SharedStore};

/// How long a term lasts unless renewed, by default (`[store] driver_lease`).
pub(crate) const DEFAULT_DRIVER_LEASE: Duration = Duration::from_secs(10);
/// Renewals per lease period: three may fail in a row before the term lapses.
const RENEWALS_PER_LEASE: u32 = 4;
/// The local deadline keeps this share of the lease back from its expiry, for clocks that
/// run at slightly different rates here and on the database server.
const DEADLINE_MARGIN_DIVISOR: u32 = 10;

/// When this process's current term ends by its own clock; `None` between terms.
#[derive(Debug, Clone, Default)]
pub(crate) struct TermDeadline(Arc<Mutex<Option<Instant>>>);

impl TermDeadline {
    fn get(&self) -> Option<Instant> {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, deadline: Option<Instant>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = deadline;
    }

    /// Set from the moment a successful take or renewal was sent: the lease's expiry was
    /// computed by the database after that moment, so this comes no later than it.
    fn renewed(&self, sent: Instant, lease: Duration) {
        self.set(Some(sent + lease - lease / DEADLINE_MARGIN_DIVISOR));
    }

    fn live(&self) -> bool {
        self.get().is_some_and(|deadline| Instant::now() < deadline)
    }
}

/// Why a term ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TermEnd {
    /// Shutdown: the lease is released so a standby takes over at once.
    Shutdown,
    /// The local deadline passed without a renewal (paused, or the database unreachable).
    Lapsed,
    /// A renewal found another instance's term, or the store refused a write as stale.
    TakenOver,
}

impl Scheduler {
    /// Drives the provider term after term until shutdown, standing by in between.
    pub(super) async fn drive_in_terms(mut self, stop: CancellationToken) {
        let mut standing_by = false;
        loop {
            let Some(term) = self.next_term(&stop, &mut standing_by).await else { break };
            let end = self.run_term(&stop, &term).await;
            self.deadline.set(None);
            if let Err(e) = self.store.release_driver(term.clone()).await {
                tracing::warn!(provider = %term.provider, error = %store::error_chain(&e), "cannot release the provider's lease; it lapses on its own");
            }
            if end == TermEnd::Shutdown {
                break;
            }
            tracing::warn!(provider = %term.provider, epoch = term.epoch, ?end, "this instance's term driving the provider ended; the step in flight was abandoned");
            self.forget_term_state();
            self.health.update(|h| h.driver_terms_lost += 1);
        }
        tracing::info!(provider = self.provider.name(), "scheduler stopped");
    }

    /// Waits for a term, asking every standby interval; `None` if shutdown comes first.
    async fn next_term(&self, stop: &CancellationToken, standing_by: &mut bool) -> Option<DriverTerm> {
        let provider = self.provider.name().to_string();
        let lease = self.settings.driver_lease;
        loop {
            let sent = Instant::now();
            match self.store.acquire_driver(provider.clone(), lease).await {
                Ok(Some(term)) => {
                    self.deadline.renewed(sent, lease);
                    if *standing_by {
                        tracing::info!(%provider, epoch = term.epoch, "took over driving this provider's batches");
                    }
                    *standing_by = false;
                    return Some(term);
                }
                Ok(None) if !*standing_by => {
                    tracing::info!(%provider, "standing by: another instance drives this provider's batches");
                    *standing_by = true;
                }
                Ok(None) => {}
                // The database may be restarting: keep asking.
                Err(e) => {
                    tracing::warn!(%provider, error = %store::error_chain(&e), "cannot ask for the provider's lease")
                }
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = tokio::time::sleep(standby_interval(lease)) => {}
            }
        }
    }

    async fn run_term(&mut self, stop: &CancellationToken, term: &DriverTerm) -> TermEnd {
        let keeper = keep(Arc::clone(&self.store), term.clone(), self.settings.driver_lease, self.deadline.clone());
        tokio::select! {
            // Polled first: a step is never resumed after the term's deadline has passed.
            biased;
            end = keeper => end,
            end = self.run(stop) => end,
        }
    }

    /// What a term learnt only holds within it: intents formed in it may have been sent by
    /// another driver since, so a new term looks every unresolved intent up first.
    fn forget_term_state(&mut self) {
        self.formed_here.clear();
        self.trials_formed_here.clear();
        self.trials_sent.clear();
        self.rate_limits.clear();
        self.waiting.clear();
        self.evaluations_listed = None;
        self.holds_in_a_row = 0;
    }
}

/// How often a standby asks for the lease: often enough to take over soon after it lapses.
fn standby_interval(lease: Duration) -> Duration {
    (lease / 5).clamp(Duration::from_millis(200), Duration::from_secs(2))
}

/// Renews the term until it ends; returns why it ended.
async fn keep(store: SharedStore, term: DriverTerm, lease: Duration, deadline: TermDeadline) -> TermEnd {
    let every = lease / RENEWALS_PER_LEASE;
    loop {
        let Some(until) = deadline.get() else { return TermEnd::Lapsed };
        tokio::select! {
            () = tokio::time::sleep_until(until) => return TermEnd::Lapsed,
            () = tokio::time::sleep(every) => {}
        }
        let sent = Instant::now();
        match tokio::time::timeout_at(until, store.renew_driver(term.clone(), lease)).await {
            Err(_elapsed) => return TermEnd::Lapsed,
            Ok(Ok(true)) => deadline.renewed(sent, lease),
            Ok(Ok(false)) => return TermEnd::TakenOver,
            Ok(Err(e)) => {
                tracing::warn!(provider = %term.provider, error = %store::error_chain(&e), "cannot renew the provider's lease; trying again");
            }
        }
    }
}

/// The provider as a driver sees it: no call starts outside a live term. A call asked for
/// after the deadline waits forever instead of failing, because the term's keeper drops
/// the whole step at that deadline; an error here would be taken for the provider's.
#[derive(Debug)]
pub(crate) struct FencedProvider {
    inner: Arc<dyn BatchProvider>,
    deadline: TermDeadline,
}

impl FencedProvider {
    pub(crate) fn new(inner: Arc<dyn BatchProvider>, deadline: TermDeadline) -> FencedProvider {
        FencedProvider { inner, deadline }
    }

    async fn within_term(&self) {
        if !self.deadline.live() {
            std::future::pending::<()>().await;
        }
    }
}

#[async_trait]
impl BatchProvider for FencedProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn output_budget(&self) -> OutputBudget {
        self.inner.output_budget()
    }

    fn batch_api(&self) -> bool {
        self.inner.batch_api()
    }

    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
        self.within_term().await;
        self.inner.submit(spec).await
    }

    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        self.within_term().await;
        self.inner.find_job(intent).await
    }

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
        self.within_term().await;
        self.inner.poll(job_id).await
    }

    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError> {
        self.within_term().await;
        self.inner.stream_results(job, out).await
    }

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
        self.within_term().await;
        self.inner.cancel(job_id).await
    }

    async fn probe(&self, schema: &Schema) -> Probe {
        self.inner.probe(schema).await
    }

    /// Not fenced: it runs beside the scheduler after a batch's close was stored within
    /// the term, and deleting a finished job's files twice is harmless.
    async fn delete_files(&self, job: &JobStatus) -> Result<u64, ProviderError> {
        self.inner.delete_files(job).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::providers::JobPhase;

    /// Counts the calls that reached it.
    #[derive(Debug, Default)]
    struct Counting(AtomicU32);

    impl Counting {
        fn status(&self, job_id: &str) -> JobStatus {
            self.0.fetch_add(1, Ordering::SeqCst);
            JobStatus { job_id: job_id.to_string(), phase: JobPhase::Running, result_files: Vec::new() }
        }
    }

    #[async_trait]
    impl BatchProvider for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn output_budget(&self) -> OutputBudget {
            OutputBudget { default: None, cap: 1 }
        }
        async fn submit(&self, _spec: &BatchSpec<'_>) -> Result<String, ProviderError> {
            Ok(self.status("job").job_id)
        }
        async fn find_job(&self, _intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
            self.status("job");
            Ok(Lookup::Absent)
        }
        async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError> {
            Ok(self.status(job_id))
        }
        async fn stream_results(
            &self,
            _job: &JobStatus,
            _out: &mpsc::Sender<ResultLine>,
        ) -> Result<StreamCounts, ProviderError> {
            self.status("job");
            Ok(StreamCounts::default())
        }
        async fn cancel(&self, job_id: &str) -> Result<(), ProviderError> {
            self.status(job_id);
            Ok(())
        }
        async fn delete_files(&self, job: &JobStatus) -> Result<u64, ProviderError> {
            self.status(&job.job_id);
            Ok(1)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_provider_call_starts_after_the_terms_deadline() {
        let inner = Arc::new(Counting::default());
        let deadline = TermDeadline::default();
        let fenced = FencedProvider::new(Arc::clone(&inner) as Arc<dyn BatchProvider>, deadline.clone());
        let patience = Duration::from_secs(60);

        // Between terms nothing goes out.
        assert!(tokio::time::timeout(patience, fenced.poll("j")).await.is_err());
        assert_eq!(inner.0.load(Ordering::SeqCst), 0);

        deadline.renewed(Instant::now(), Duration::from_secs(10));
        assert!(tokio::time::timeout(patience, fenced.poll("j")).await.is_ok());
        assert_eq!(inner.0.load(Ordering::SeqCst), 1);

        // 90 % of the lease: the deadline is a second short of the lease's expiry.
        tokio::time::advance(Duration::from_millis(8_900)).await;
        assert!(tokio::time::timeout(patience, fenced.cancel("j")).await.is_ok());
        tokio::time::advance(Duration::from_millis(200)).await;
        assert!(tokio::time::timeout(patience, fenced.poll("j")).await.is_err());
        assert!(tokio::time::timeout(patience, fenced.cancel("j")).await.is_err());
        assert_eq!(inner.0.load(Ordering::SeqCst), 2, "no call reached the provider after the deadline");

        // Deleting a finished job's files is not the driver's to fence.
        let job = JobStatus { job_id: "j".into(), phase: JobPhase::Running, result_files: Vec::new() };
        assert_eq!(fenced.delete_files(&job).await.ok(), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_term_on_a_store_that_never_lapses_is_kept_until_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, _writer) = crate::store::Store::open(dir.path(), 16 << 20).expect("open a store");
        let store: SharedStore = Arc::new(store);
        let lease = Duration::from_secs(4);
        let term = store.acquire_driver("p".into(), lease).await.expect("acquire").expect("a term");
        let deadline = TermDeadline::default();
        deadline.renewed(Instant::now(), lease);
        // A minute of renewals: the keeper never ends the term, and the deadline moves on.
        let kept = tokio::time::timeout(Duration::from_secs(60), keep(store, term, lease, deadline.clone())).await;
        assert!(kept.is_err(), "the keeper ended a term that was renewed: {kept:?}");
        assert!(deadline.live());
    }

    #[test]
    fn standbys_ask_often_but_not_too_often() {
        assert_eq!(standby_interval(Duration::from_secs(10)), Duration::from_secs(2));
        assert_eq!(standby_interval(Duration::from_secs(2)), Duration::from_millis(400));
        assert_eq!(standby_interval(Duration::from_secs(600)), Duration::from_secs(2));
    }
}
