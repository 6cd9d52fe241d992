//! The simulator's memory: files, batches, fault counters and statistics behind one mutex.
//! Handlers hold the lock only for bookkeeping, never across an `.await`, so a slow or
//! dropped client cannot stall the others.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::distr::Alphanumeric;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::faults::Faults;
use super::input::Input;
use super::lifecycle::{BatchRecord, Timeline};
use super::wire::OpenAiFile;

/// What the simulator has seen and served; tests assert on these to prove a client's
/// behaviour (no resubmission of live work, retries honoured, …).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    pub files_uploaded: u64,
    pub batches_created: u64,
    pub batches_listed: u64,
    pub polls: u64,
    pub content_downloads: u64,
    /// Billed lines served as successes (output-file lines, counted once each).
    pub lines_completed: u64,
    /// Lines served in error files, including `batch_expired` / `batch_cancelled` ones.
    pub lines_failed: u64,
    /// Billed answers cut off at their output budget (`truncate_every`), batch lines and
    /// synchronous completions alike.
    #[serde(default)]
    pub lines_truncated: u64,
    /// Billed answers that declined (`refuse_every`), batch lines and completions alike.
    #[serde(default)]
    pub lines_refused: u64,
    /// Synchronous `POST /v1/chat/completions` answered with a completion (billed).
    #[serde(default)]
    pub chat_completions: u64,
    /// 429s served, `rate_limit_exceeded` and `insufficient_quota` alike.
    pub rate_limited: u64,
    pub server_errors: u64,
    /// Overload answers served (`overloaded_next`).
    #[serde(default)]
    pub overloaded: u64,
    pub dropped_connections: u64,
    /// custom_id → number of batches whose input contained it.
    pub submissions_per_custom_id: BTreeMap<String, u64>,
    /// custom_id → number of those batches that ended `failed` before running anything: the
    /// provider bills nothing for them, so a resubmission after one buys no second answer.
    #[serde(default)]
    pub unrun_submissions_per_custom_id: BTreeMap<String, u64>,
    /// Max over custom_ids of how many non-terminal batches contained it at the same time:
    /// stays 1 unless a client resubmits work that is still live.
    pub max_live_batches_per_custom_id: u64,
    /// Batches failed with `token_limit_exceeded` (`enqueued_token_limit`).
    #[serde(default)]
    pub token_limit_failures: u64,
    /// Input tokens of the most recently created batch, as the enqueued-token limit counts them.
    #[serde(default)]
    pub last_batch_tokens: u64,
    /// 404s served to retrievals of batches that exist (`poll_not_found_next`).
    #[serde(default)]
    pub polls_not_found: u64,
    /// Files deleted by clients (`DELETE /v1/files/{id}`), and batches (Anthropic).
    #[serde(default)]
    pub files_deleted: u64,
    /// Batch input uploads refused: for their size (`max_input_file_bytes`), Azure's quota of
    /// files without expiry, or as an invalid payload (`refuse_upload_next`).
    #[serde(default)]
    pub uploads_refused: u64,
    /// Size of the last batch input file accepted.
    #[serde(default)]
    pub last_upload_bytes: u64,
    /// Vertex `:countTokens` calls answered with a count (what `provider check` makes).
    #[serde(default)]
    pub tokens_counted: u64,
    /// Bedrock `GetFoundationModel` / `GetInferenceProfile` calls answered with the record
    /// (what `provider check` makes).
    #[serde(default)]
    pub models_looked_up: u64,
    /// Vertex metadata-server tokens handed out (the request said `Metadata-Flavor: Google`).
    #[serde(default)]
    pub metadata_tokens_issued: u64,
    /// Metadata-server token requests refused for a missing `Metadata-Flavor: Google`.
    #[serde(default)]
    pub metadata_refused: u64,
    /// The `scopes` the last metadata-server token request asked for, as sent.
    #[serde(default)]
    pub metadata_token_scopes: Option<String>,
    /// Vertex API calls admitted on a metadata-server token.
    #[serde(default)]
    pub calls_with_metadata_tokens: u64,
}

/// Batch input and output files expire after 30 days unless told otherwise.
pub(super) const DEFAULT_FILE_TTL_SECS: i64 = 30 * 24 * 3600;

#[derive(Debug)]
pub(super) struct StoredFile {
    pub meta: OpenAiFile,
    pub content: Bytes,
    /// Parsed once at upload for `purpose=batch` files.
    pub input: Option<Arc<Input>>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub api_key: Option<String>,
    /// The platform spoken (OpenAI's own by default; set before the server starts).
    pub variant: super::variant::Variant,
    pub seed: u64,
    pub timeline: Timeline,
    /// `http://host:port` as clients reach it, for absolute URLs such as `results_url`.
    pub origin: String,
    /// The S3 the Bedrock dialect reads input from and writes output to.
    pub s3: Option<super::S3Access>,
    /// The Cloud Storage JSON API the Vertex dialect reads input from and writes output to.
    pub gcs: Option<String>,
    request_ids: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub files: HashMap<String, StoredFile>,
    /// Creation order; listing walks it backwards.
    pub batches: Vec<BatchRecord>,
    /// Anthropic Message Batches, creation order (Anthropic dialect only).
    pub message_batches: Vec<super::anthropic::Record>,
    /// Gemini batches, files and uploads (Gemini dialect only).
    pub gemini: super::gemini::Store,
    /// Bedrock model invocation jobs, creation order (Bedrock dialect only).
    pub bedrock: Vec<super::bedrock::Job>,
    /// Mistral batch jobs and files (Mistral dialect only).
    pub mistral: super::mistral::Store,
    /// Vertex batch prediction jobs and issued tokens (Vertex dialect only).
    pub vertex: super::vertex::Store,
    pub faults: Faults,
    /// Answers per source while a misbehave knob is on (`invalid_first`, `ungrounded_first`).
    pub attempts: super::answer::Attempts,
    pub stats: Stats,
    pub timeline: Timeline,
    pub seed: u64,
    live: HashMap<String, u64>,
    ids: StdRng,
}

impl Shared {
    pub(super) fn new(
        api_key: Option<String>,
        complete_after: Duration,
        seed: u64,
        faults: Faults,
        origin: String,
    ) -> Self {
        let timeline = Timeline::new(complete_after);
        Self {
            api_key,
            variant: super::variant::Variant::default(),
            seed,
            timeline,
            origin,
            s3: None,
            gcs: None,
            request_ids: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                files: HashMap::new(),
                batches: Vec::new(),
                message_batches: Vec::new(),
                gemini: super::gemini::Store::default(),
                bedrock: Vec::new(),
                mistral: super::mistral::Store::default(),
                vertex: super::vertex::Store::default(),
                faults,
                attempts: super::answer::Attempts::default(),
                stats: Stats::default(),
                timeline,
                seed,
                live: HashMap::new(),
                ids: StdRng::seed_from_u64(seed),
            }),
        }
    }

    /// A panic elsewhere cannot leave this state half-updated in a way that matters to a
    /// simulator, so a poisoned lock is used as is rather than failing every request.
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn next_request_id(&self) -> String {
        let n = self.request_ids.fetch_add(1, Ordering::Relaxed);
        // Multiplying by an odd constant and `mix` are both bijections: ids never repeat.
        let high = mix(self.seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        format!("req_{high:016x}{:016x}", mix(high ^ n))
    }
}

impl Inner {
    pub(super) fn new_id(&mut self, prefix: &str, len: usize) -> String {
        let suffix: String = (&mut self.ids).sample_iter(Alphanumeric).take(len).map(char::from).collect();
        format!("{prefix}{suffix}")
    }

    pub(super) fn insert_file(
        &mut self,
        purpose: &str,
        filename: String,
        created_at: i64,
        expires_at: Option<i64>,
        content: Bytes,
        input: Option<Arc<Input>>,
    ) -> OpenAiFile {
        let meta = OpenAiFile {
            id: self.new_id("file-", 22),
            object: "file".to_string(),
            bytes: u64::try_from(content.len()).unwrap_or(u64::MAX),
            created_at,
            expires_at,
            filename,
            purpose: purpose.to_string(),
            status: "processed".to_string(),
        };
        self.files.insert(meta.id.clone(), StoredFile { meta: meta.clone(), content, input });
        meta
    }

    /// Brings every batch up to `now`, so that liveness counts are exact before a create.
    pub(super) fn advance_all(&mut self, now: Instant) {
        let mut batches = std::mem::take(&mut self.batches);
        for batch in &mut batches {
            batch.advance(now, self);
        }
        self.batches = batches;
    }

    /// Advances one batch by index and returns a copy of its wire view.
    pub(super) fn advance_one(&mut self, index: usize, now: Instant) -> Option<super::wire::Batch> {
        let mut batches = std::mem::take(&mut self.batches);
        let view = batches.get_mut(index).map(|batch| {
            batch.advance(now, self);
            batch.view.clone()
        });
        self.batches = batches;
        view
    }

    pub(super) fn find_batch(&self, id: &str) -> Option<usize> {
        self.batches.iter().position(|b| b.view.id == id)
    }

    pub(super) fn batch_went_live(&mut self, custom_ids: &[String]) {
        for id in custom_ids {
            *self.stats.submissions_per_custom_id.entry(id.clone()).or_default() += 1;
            let live = self.live.entry(id.clone()).or_default();
            *live += 1;
            self.stats.max_live_batches_per_custom_id = self.stats.max_live_batches_per_custom_id.max(*live);
        }
    }

    pub(super) fn batch_went_terminal(&mut self, custom_ids: &[String]) {
        for id in custom_ids {
            if let Some(live) = self.live.get_mut(id) {
                *live = live.saturating_sub(1);
                if *live == 0 {
                    self.live.remove(id);
                }
            }
        }
    }
}

pub(super) fn unix_now() -> i64 {
    i64::try_from(crate::domain::clock::now_secs()).unwrap_or(i64::MAX)
}

/// splitmix64: spreads a counter into an id-looking value, deterministic for a seed.
pub(super) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
