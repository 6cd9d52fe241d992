//! The scheduler drives built-in provider batches: it forms batches from pending work,
//! submits them, polls them, ingests their results and commits what is ready.
//!
//! It is one task with one loop. Every decision it takes is read from, and written to,
//! the store before it acts, so a restart resumes exactly where it stopped: intents are
//! reconciled against the provider, polls resume at their persisted `next_action_at`,
//! staged results are committed. Idle means waiting on a wake-up (new intake) or on the
//! next persisted deadline; there is no busy loop.

mod cleanup;
mod form;
mod ingest;
mod submit;
mod term;
mod traces;
mod trials;

pub(crate) use term::DEFAULT_DRIVER_LEASE;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::domain::health::SharedHealth;

use crate::domain::backoff::backoff_delay;
use crate::domain::clock;
use crate::domain::lifecycle::FailureClass;
use crate::domain::schema::Registry;
use crate::engine::commit::{Committer, WorkSignals};
use crate::engine::routing::Router;
use crate::engine::supervisor::Supervisor;
use crate::providers::{BatchProvider, ErrorClass, ProviderError};
use crate::store::{self, BatchRecord, BatchState, CloseReport, Leftover, MemberRules, SharedStore};

#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub batch_max_size: usize,
    /// OpenAI caps a batch input file at 200 MB; prompts, schema and JSON escaping add to
    /// the raw content, hence the margin.
    pub batch_max_content_bytes: u64,
    pub batch_max_wait: Duration,
    pub poll_interval: Duration,
    /// Consecutive transient failures after which a submit intent's members are failed
    /// (class `transient`) for an operator to retry, instead of being retried forever.
    pub max_submit_failures: u32,
    /// How long polls of a job we created must keep answering 404 before it is declared
    /// gone and its members requeued. Providers answer 404 for live jobs now and then.
    pub job_gone_after: Duration,
    /// Delete uploaded and result files at the provider once a batch is ingested.
    pub delete_provider_files: bool,
    /// Provider attempts one extraction may use across requeues (expired or lost batches,
    /// unreadable or retryable lines, truncation retries) before it fails
    /// `attempts_exhausted`. An operator's retry grants a fresh allowance.
    pub max_attempts: u32,
    /// This provider's re-ask limit, overriding each schema's (`[providers.<name>] reask`).
    pub reask: Option<u32>,
    /// What its members are reserved at against their tenants' budgets is estimated from
    /// this (`None`: no reservations, budgets act on charged spend only).
    pub profile: Option<crate::engine::ledger::estimate::ProviderProfile>,
    /// The fewest members the provider takes in one job (Bedrock's `min_records`; 1: no
    /// minimum). Fewer wait for more work, up to `min_batch_wait`, and are then handed to
    /// `min_batch_fallback` where one is configured, else failed.
    pub min_batch_size: usize,
    pub min_batch_wait: Duration,
    pub min_batch_fallback: Option<String>,
    /// How long a term driving the provider lasts unless renewed (`[store] driver_lease`):
    /// a standby takes over this long after a driver stopped renewing.
    pub driver_lease: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            batch_max_size: 100,
            batch_max_content_bytes: 100 * 1024 * 1024,
            batch_max_wait: Duration::from_secs(2),
            poll_interval: Duration::from_secs(5),
            max_submit_failures: 8,
            job_gone_after: Duration::from_secs(600),
            delete_provider_files: true,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            reask: None,
            profile: None,
            min_batch_size: 1,
            min_batch_wait: DEFAULT_MIN_BATCH_WAIT,
            min_batch_fallback: None,
            driver_lease: term::DEFAULT_DRIVER_LEASE,
        }
    }
}

/// How long work under a provider's minimum job size waits for more unless configured
/// (`[providers.<name>] min_batch_wait`).
pub(crate) const DEFAULT_MIN_BATCH_WAIT: Duration = Duration::from_secs(3600);
/// Provider attempts per extraction unless configured (`scheduler.max_attempts`).
pub(crate) const DEFAULT_MAX_ATTEMPTS: u32 = 5;
/// After a 401/403, how long to leave the provider alone before probing again.
const AUTH_PAUSE: Duration = Duration::from_secs(300);
/// After quota exhaustion, how long new submissions wait before probing again.
const BUDGET_PAUSE: Duration = Duration::from_secs(900);
/// The longest wait a provider's `Retry-After` is honoured for.
const MAX_PROVIDER_DELAY: Duration = Duration::from_secs(24 * 3600);
/// Polls and submits back off at most this long between transient failures.
const BACKOFF_CAP: Duration = Duration::from_secs(300);
/// The first hold of submissions after a batch failed for want of room at the provider;
/// it doubles with each failure in a row, up to `HOLD_CAP`, unless a job ends first.
const HOLD_BASE: Duration = Duration::from_secs(60);
const HOLD_CAP: Duration = Duration::from_secs(1800);
/// Lines handed to one store write: big enough to share an fsync, small enough to
/// keep memory flat whatever the result file's size.
const STAGE_CHUNK: usize = 512;
/// The loop re-checks at least this often, whatever the deadlines say.
const MAX_SLEEP: Duration = Duration::from_secs(3600);
/// Staged answers validated and committed at once (they share group commits).
const COMMIT_CONCURRENCY: usize = 64;
/// Where other instances take intake (PostgreSQL), the driver looks for their work every
/// batch wait, within these bounds.
const FOREIGN_WORK_LOOK: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(5));

/// How often, in ms, a driver on a shared store looks for work other instances took in.
fn foreign_work_look(settings: &Settings) -> u64 {
    settings.batch_max_wait.clamp(FOREIGN_WORK_LOOK.0, FOREIGN_WORK_LOOK.1).as_millis() as u64
}
/// After an unexpected error in a step, the loop waits this long before trying again.
const STEP_ERROR_PAUSE: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(crate) struct Scheduler {
    store: SharedStore,
    committer: Committer,
    signals: WorkSignals,
    router: Arc<Router>,
    registry: Registry,
    provider: Arc<dyn BatchProvider>,
    settings: Settings,
    wake: Arc<Notify>,
    health: SharedHealth,
    /// Side tasks (provider file cleanup) run under the same supervision as the loop.
    supervisor: Supervisor,
    /// Intents formed by this process and not yet sent. Anything else — an intent found on
    /// start, or one whose submit failed — may already exist at the provider and is looked
    /// up by its batch key first.
    formed_here: HashSet<u64>,
    /// Consecutive rate limits per batch: they set the backoff when the provider gives no
    /// delay, but never use up the attempts reserved for transient failures.
    rate_limits: HashMap<u64, u32>,
    /// Per schema: the last look for a batch found too little work. Looking scans pending
    /// records in the writer, so it is not repeated on every intake until enough new work
    /// could have arrived to fill a batch, or the wait is over.
    waiting: HashMap<String, form::WaitingWork>,
    /// Failed batches in a row returned for want of room: sets the next hold's length.
    holds_in_a_row: u32,
    /// Trial batches formed by this process and not yet sent (`formed_here`, for trials).
    trials_formed_here: HashSet<u64>,
    /// Evaluations this provider has sent every trial of (`trials.rs`): not looked at again.
    trials_sent: HashSet<(String, u64)>,
    /// When evaluations were last listed, and the creations seen then (`trials.rs`).
    evaluations_listed: Option<(u64, u64)>,
    /// When this instance's term driving the provider ends (`term.rs`); the provider
    /// above is fenced by it.
    deadline: term::TermDeadline,
}

/// Everything a scheduler needs besides its provider and settings.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    pub store: SharedStore,
    pub committer: Committer,
    pub signals: WorkSignals,
    pub router: Arc<Router>,
    pub registry: Registry,
    pub wake: Arc<Notify>,
    pub health: SharedHealth,
}

impl Scheduler {
    /// Starts the provider's loop under `supervisor`; it stops when shutdown starts.
    pub(crate) fn spawn(
        context: Context,
        provider: Arc<dyn BatchProvider>,
        settings: Settings,
        supervisor: &Supervisor,
    ) {
        let Context { store, committer, signals, router, registry, wake, health } = context;
        let name = format!("scheduler {}", provider.name());
        let stop = supervisor.token();
        let deadline = term::TermDeadline::default();
        let provider: Arc<dyn BatchProvider> = Arc::new(term::FencedProvider::new(provider, deadline.clone()));
        let scheduler = Scheduler {
            store,
            committer,
            signals,
            router,
            registry,
            provider,
            settings,
            wake,
            health,
            supervisor: supervisor.clone(),
            formed_here: HashSet::new(),
            rate_limits: HashMap::new(),
            waiting: HashMap::new(),
            holds_in_a_row: 0,
            trials_formed_here: HashSet::new(),
            trials_sent: HashSet::new(),
            evaluations_listed: None,
            deadline,
        };
        supervisor.spawn(name, async move {
            scheduler.drive_in_terms(stop).await;
            Ok::<(), std::convert::Infallible>(())
        });
    }

    /// Steps until shutdown or until the store refuses a write as made outside this
    /// instance's term. A shutdown lets the step finish (10 s at most).
    async fn run(&mut self, stop: &CancellationToken) -> term::TermEnd {
        tracing::info!(provider = self.provider.name(), "scheduler started");
        loop {
            let next = match self.step().await {
                Ok(next) => next,
                Err(store::Error::NotDriving { .. }) => return term::TermEnd::TakenOver,
                Err(e) => {
                    tracing::error!(error = %crate::store::error_chain(&e), "scheduler step failed");
                    Some(clock::now_ms() + STEP_ERROR_PAUSE.as_millis() as u64)
                }
            };
            let sleep = async {
                match next {
                    Some(at_ms) => {
                        let wait = Duration::from_millis(at_ms.saturating_sub(clock::now_ms())).min(MAX_SLEEP);
                        tokio::time::sleep(wait).await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = stop.cancelled() => return term::TermEnd::Shutdown,
                () = self.wake.notified() => {}
                () = sleep => {}
            }
        }
    }

    /// One pass over everything due. Returns when the loop should wake next (`None`:
    /// nothing scheduled, wait for new work).
    async fn step(&mut self) -> Result<Option<u64>, store::Error> {
        crate::domain::failpoint::panic_if("scheduler-panic");
        self.commit_ready().await?;
        let mut next: Option<u64> = None;
        let mut earliest = |at: u64| next = Some(next.map_or(at, |n: u64| n.min(at)));
        for batch in self.store.open_batches().await? {
            if batch.provider != self.provider.name() {
                continue;
            }
            let now = clock::now_ms();
            if let Some(paused_until) = self.health.paused_until(now, matches!(batch.state, BatchState::Intent)) {
                earliest(paused_until.max(batch.next_action_at_ms));
                continue;
            }
            if batch.next_action_at_ms > now {
                earliest(batch.next_action_at_ms);
                continue;
            }
            if let Some(at) = self.drive(batch).await? {
                earliest(at);
            }
        }
        if let Some(at) = self.form_batches().await? {
            earliest(at);
        }
        if let Some(at) = self.step_trials().await? {
            earliest(at);
        }
        // Intake on other instances sharing the store wakes no one here: look for it again
        // within a batch's wait.
        if self.store.commits().is_none() {
            earliest(clock::now_ms() + foreign_work_look(&self.settings));
        }
        self.commit_ready().await?;
        Ok(next)
    }

    /// Advances one due batch. Returns its next deadline if it stays open.
    async fn drive(&mut self, batch: BatchRecord) -> Result<Option<u64>, store::Error> {
        match &batch.state {
            BatchState::Intent => self.submit(batch).await,
            BatchState::Submitted { job_id } => {
                let job_id = job_id.clone();
                self.poll(batch, &job_id).await
            }
            BatchState::Closed { .. } => Ok(None),
        }
    }

    /// How this provider's members are released and its answers charged.
    fn rules(&self) -> MemberRules {
        MemberRules {
            max_attempts: self.settings.max_attempts.max(1),
            budget: self.provider.output_budget(),
            batch_api: self.provider.batch_api(),
        }
    }

    /// Closes a batch under this provider's rules and counts what happened to its leftovers.
    async fn close(
        &self,
        batch: &BatchRecord,
        outcome: String,
        leftover: Leftover,
    ) -> Result<CloseReport, store::Error> {
        let report = self.store.close_batch(batch.seq, outcome, leftover, self.rules()).await?;
        self.health.update(|h| {
            h.members_requeued += report.requeued;
            h.attempts_exhausted += report.exhausted;
        });
        count_failures(FailureClass::AttemptsExhausted, report.exhausted);
        Ok(report)
    }

    /// Validates and commits every staged answer. Commits run concurrently so the
    /// writer's group commit shares one fsync among many of them.
    async fn commit_ready(&self) -> Result<(), store::Error> {
        let batch_api = self.provider.batch_api();
        loop {
            let items = self.store.ready_items(self.provider.name().to_string(), STAGE_CHUNK).await?;
            if items.is_empty() {
                return Ok(());
            }
            let results: Vec<_> = futures_util::stream::iter(items)
                .map(|item| async move {
                    let id = item.record.id;
                    let span = traces::commit(&item);
                    let result = self
                        .committer
                        .commit_ready(item, batch_api, self.settings.reask)
                        .instrument(span.clone())
                        .await;
                    span.record("outcome", result.as_ref().map_or("error", crate::engine::commit::outcome_name));
                    (id, result)
                })
                .buffer_unordered(COMMIT_CONCURRENCY)
                .collect()
                .await;
            let mut failed = false;
            for (id, result) in results {
                if let Err(e) = result {
                    tracing::warn!(extraction = %id, error = %e, "could not commit a staged result");
                    failed = true;
                }
            }
            // Leave what could not be committed for the next step instead of spinning on it.
            if failed {
                return Ok(());
            }
        }
    }

    /// After a batch failed without blaming a member (OpenAI's enqueued-token limit, or a
    /// validation naming no line): new submissions wait until one of this provider's jobs
    /// ends or the hold is over. Nothing else is counted against the members.
    fn hold_submissions(&mut self, batch: &BatchRecord, reason: String, returned: u64) {
        let delay = HOLD_BASE.saturating_mul(1u32.checked_shl(self.holds_in_a_row.min(16)).unwrap_or(u32::MAX));
        let delay = delay.min(HOLD_CAP);
        self.holds_in_a_row = self.holds_in_a_row.saturating_add(1);
        let until = clock::now_ms().saturating_add(delay.as_millis() as u64);
        tracing::warn!(
            batch_key = %batch.batch_key, %reason, returned, hold_secs = delay.as_secs(),
            "the provider failed a batch without blaming its members; they go back as the same attempt and new submissions wait"
        );
        self.health.hold(until, reason);
        self.health.update(|h| h.batches_returned += 1);
    }

    /// A job of this provider ended: whatever room it held is free again.
    fn job_ended(&mut self) {
        self.holds_in_a_row = 0;
        if self.health.release_hold() {
            tracing::info!("a job ended: submissions held for room at the provider resume");
            self.wake.notify_one();
        }
    }

    /// Decides what a failed provider call means for the batch, persisting the decision.
    async fn on_error(
        &mut self,
        batch: &BatchRecord,
        error: &ProviderError,
        submitting: bool,
    ) -> Result<Option<u64>, store::Error> {
        let now = clock::now_ms();
        self.health.update(|h| h.last_error = Some(error.to_string()));
        let (provider, class) = (self.provider.name().to_string(), error.class.as_str());
        metrics::counter!(crate::domain::metric_names::PROVIDER_ERRORS_TOTAL, "provider" => provider, "class" => class)
            .increment(1);
        tracing::warn!(batch_key = %batch.batch_key, class = ?error.class, error = %error, "provider call failed");
        // A provider may ask for any delay; none is honoured past a day (and none overflows).
        let retry_at = |delay: Duration| now.saturating_add(delay.min(MAX_PROVIDER_DELAY).as_millis() as u64);
        if error.class == ErrorClass::RateLimited {
            self.health.update(|h| h.rate_limited += 1);
            let streak = self.rate_limits.entry(batch.seq).or_default();
            *streak += 1;
            let delay = error.retry_after.unwrap_or_else(|| backoff_delay(*streak, BACKOFF_CAP));
            let at = retry_at(delay);
            self.store.reschedule_batch(batch.seq, at, Some(error.to_string()), false).await?;
            return Ok(Some(at));
        }
        self.rate_limits.remove(&batch.seq);
        let backoff = || error.retry_after.unwrap_or_else(|| backoff_delay(batch.failures, BACKOFF_CAP));
        match error.class {
            ErrorClass::Auth => {
                let until = retry_at(AUTH_PAUSE);
                self.health.pause(until, false, error.to_string());
                self.store.reschedule_batch(batch.seq, until, Some(error.to_string()), false).await?;
                Ok(Some(until))
            }
            // Quota exhaustion stops new submissions; a live job is still polled (and its
            // results ingested) on the normal backoff.
            ErrorClass::Budget => {
                let until = retry_at(BUDGET_PAUSE);
                self.health.pause(until, true, error.to_string());
                let at = if submitting { until } else { retry_at(backoff()) };
                self.store.reschedule_batch(batch.seq, at, Some(error.to_string()), false).await?;
                Ok(Some(at))
            }
            // Over the provider's size limits: split, since no member is at fault. Only a
            // single member too large for a job of its own is refused.
            ErrorClass::TooLarge if submitting && batch.members.len() > 1 => {
                let keep = batch.members.len().div_ceil(2);
                let returned = self.store.shrink_intent(batch.seq, keep).await?;
                tracing::info!(batch_key = %batch.batch_key, keep, returned, error = %error, "batch too large for the provider; split");
                // The refusal came before any job existed: the shrunk intent goes as fresh.
                self.formed_here.insert(batch.seq);
                self.health.update(|h| h.members_requeued += returned);
                Ok(Some(now))
            }
            ErrorClass::InvalidRequest | ErrorClass::TooLarge if submitting => {
                let leftover = Leftover::Fail { class: FailureClass::InvalidRequest, reason: error.to_string() };
                self.close(batch, "rejected by the provider".to_string(), leftover).await?;
                Ok(None)
            }
            // One 404 does not prove a job gone (providers answer it for live jobs now and
            // then); requeueing would pay for work that may still be running. Only 404s
            // that go on for the whole window do.
            ErrorClass::Gone if !submitting => {
                let since = batch.not_found_since_ms.unwrap_or(now);
                let window = self.settings.job_gone_after.as_millis() as u64;
                if now.saturating_sub(since) < window {
                    self.health.update(|h| h.polls_not_found += 1);
                    let at = retry_at(self.settings.poll_interval).min(since.saturating_add(window));
                    self.store.note_not_found(batch.seq, since, at.max(now + 1), error.to_string()).await?;
                    return Ok(Some(at.max(now + 1)));
                }
                let outcome =
                    format!("the provider answered 404 for the job for {}s", now.saturating_sub(since) / 1000);
                self.close(batch, outcome, Leftover::Requeue).await?;
                self.job_ended();
                Ok(None)
            }
            _ if submitting && batch.failures + 1 >= self.settings.max_submit_failures => {
                let reason = format!("gave up submitting after {} attempts: {error}", batch.failures + 1);
                let leftover = Leftover::Fail { class: FailureClass::Transient, reason };
                self.close(batch, "submit attempts exhausted".to_string(), leftover).await?;
                Ok(None)
            }
            _ => {
                let at = retry_at(backoff());
                self.store.reschedule_batch(batch.seq, at, Some(error.to_string()), true).await?;
                Ok(Some(at))
            }
        }
    }
}

/// Counts extractions that entered the failed state with `class` (`commitpoint_failures_total`).
fn count_failures(class: FailureClass, n: u64) {
    if n > 0 {
        metrics::counter!(crate::domain::metric_names::FAILURES_TOTAL, "class" => class.as_str()).increment(n);
    }
}
