//! Provider adapters behind one small trait. Wire types and error bodies stay inside
//! each adapter; what crosses this boundary is our own vocabulary: job ids, phases,
//! per-member line results, and errors already sorted into DESIGN §3 classes.

pub mod anthropic;
pub mod chat;
pub mod generic;
pub mod openai;
mod retry;
mod transport;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

pub use retry::{backoff_delay, classify_status, parse_retry_after};
pub use transport::ApiKey;
pub(crate) use transport::{describe_transport, truncate};

use crate::identity::ExtractionId;
use crate::schema::Schema;
use crate::store::{BatchMember, LineResult, OutputBudget};

/// How a provider call failed, in the terms the scheduler acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// 429 / overload: wait as told, then try again; never gives up.
    RateLimited,
    /// 5xx, timeouts, resets: exponential backoff with jitter, bounded attempts.
    Transient,
    /// 401/403: stop calling this provider; keep the work queued.
    Auth,
    /// Quota or billing exhausted: not a rate limit; stop submitting and surface it.
    Budget,
    /// The request itself is wrong: terminal for the items in it.
    InvalidRequest,
    /// The provider does not know the job (or file) any more.
    Gone,
    /// The provider answered something we cannot understand.
    Protocol,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{provider}: {message}")]
pub struct ProviderError {
    pub provider: &'static str,
    pub class: ErrorClass,
    pub status: Option<u16>,
    pub message: String,
    /// The delay the provider asked for (`retry-after-ms` / `Retry-After`).
    pub retry_after: Option<Duration>,
}

/// One batch as the adapter must send it.
#[derive(Debug)]
pub struct BatchSpec<'a> {
    pub batch_key: &'a str,
    pub schema: &'a Schema,
    pub members: &'a [BatchMember],
}

/// A submit intent the provider may or may not have acted on (a crash or a timeout
/// after the call), as an adapter needs it to look the job up.
#[derive(Debug)]
pub struct IntentRef<'a> {
    pub batch_key: &'a str,
    /// When the intent was committed: no job created before it can be ours.
    pub created_at_ms: u64,
    pub members: &'a [ExtractionId],
    /// Job ids already recorded for other batches since about then: never this intent's.
    /// Lets a provider without batch metadata rule candidates out without waiting.
    pub known_jobs: &'a [String],
}

/// What a lookup of an intent's job found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Found(String),
    /// The provider has no job for the intent: submitting is safe.
    Absent,
    /// A job that might be ours cannot be told apart yet (a provider without batch
    /// metadata, whose candidate is still running): ask again later, never resubmit now.
    Undecided {
        recheck_after: Duration,
        reason: String,
    },
}

/// Where a provider job stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPhase {
    Running,
    Completed,
    /// Ended before every request ran; what ran is in the result files and is billed.
    Expired,
    Cancelled,
    /// The whole batch was rejected (e.g. input validation).
    Failed {
        reason: String,
    },
}

impl JobPhase {
    pub fn is_terminal(&self) -> bool {
        !matches!(self, JobPhase::Running)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    pub job_id: String,
    pub phase: JobPhase,
    /// Opaque handles of the files holding result lines (output and error files).
    pub result_files: Vec<String>,
}

/// One parsed result line, joined on our custom id (never on line order).
pub type ResultLine = (String, LineResult);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounts {
    pub lines: u64,
    pub malformed: u64,
}

#[async_trait]
pub trait BatchProvider: Send + Sync + fmt::Debug {
    /// The name stored with each batch and shown to operators.
    fn name(&self) -> &str;

    /// The output token budget requests ask for by default, and the cap a truncation
    /// retry may raise it to (a member's own raised budget travels on [`BatchMember`]).
    fn output_budget(&self) -> OutputBudget;

    /// True when calls go through a batch API and are billed at its discount; a
    /// synchronous API behind this trait answers false and is priced at list price.
    fn batch_api(&self) -> bool {
        true
    }

    /// Creates the job. Not idempotent at every provider: callers look the intent up with
    /// [`BatchProvider::find_job`] before calling this again.
    async fn submit(&self, spec: &BatchSpec<'_>) -> Result<String, ProviderError>;

    /// Finds the job an earlier submit of this intent created, if any.
    async fn find_job(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError>;

    async fn poll(&self, job_id: &str) -> Result<JobStatus, ProviderError>;

    /// Streams every result line of a finished job into `out`; memory stays bounded by
    /// the channel, whatever the file size.
    async fn stream_results(
        &self,
        job: &JobStatus,
        out: &mpsc::Sender<ResultLine>,
    ) -> Result<StreamCounts, ProviderError>;

    async fn cancel(&self, job_id: &str) -> Result<(), ProviderError>;
}
