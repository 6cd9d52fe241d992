//! Finding the job an earlier submit of an intent may have created, on a platform that
//! may not keep batch `metadata` (docs/PROVIDERS.md, "OpenAI-compatible batch platforms").
//!
//! Where metadata is kept, the batch key in it settles the question (`find_by_batch_key`).
//! Where it is not, a batch without the key proves nothing, so the lookup goes by the one
//! thing every OpenAI-shaped platform keeps: the input file. Our upload is named after
//! the batch key; a batch whose `input_file_id` is one of those files is ours. No such
//! file means the submit never got as far as a create; files but no batch naming them,
//! in a batch list walked to its end, means the create never happened. Anything short of
//! a complete walk is Undecided, never Absent: a resubmission could pay twice.

use std::sync::atomic::Ordering;

use serde::Deserialize;

use super::{
    CREATED_AT_SLACK, ErrorClass, IntentRef, Lookup, MAX_LIST_PAGES, OpenAiBatches, ProviderError, undecided, wire,
};

/// The upload's file name: the batch key makes it findable without metadata.
pub(super) fn input_file_name(batch_key: &str) -> String {
    format!("commitpoint-{batch_key}.jsonl")
}

#[derive(Debug, Deserialize)]
struct FileEntry {
    id: String,
    #[serde(default)]
    filename: Option<String>,
    #[serde(default, deserialize_with = "wire::unix_time")]
    created_at: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct FileList {
    data: Vec<FileEntry>,
    /// Absent on platforms that list everything at once (Groq's `GET /files`).
    #[serde(default)]
    has_more: bool,
    #[serde(default)]
    last_id: Option<String>,
}

/// Batches created since the intent (newest first), and whether the walk reached the end.
struct Walk {
    batches: Vec<wire::Batch>,
    complete: Result<(), String>,
}

impl OpenAiBatches {
    /// Metadata counts as proof only where the platform keeps it and nothing this process
    /// saw says otherwise (a create answered without our key, or refused for metadata).
    pub(super) fn metadata_trusted(&self) -> bool {
        self.flavour.metadata_kept && !self.metadata_lost.load(Ordering::Relaxed)
    }

    pub(super) async fn lookup(&self, intent: &IntentRef<'_>) -> Result<Lookup, ProviderError> {
        if self.metadata_trusted() {
            return self.find_by_batch_key(intent.batch_key, intent.created_at_ms).await;
        }
        let oldest_secs = oldest_secs(intent.created_at_ms);
        let files = match self.our_input_files(intent.batch_key, oldest_secs).await? {
            Ok(files) => files,
            Err(reason) => return Ok(undecided(reason)),
        };
        if files.is_empty() {
            return Ok(Lookup::Absent);
        }
        let walk = self.batches_since(oldest_secs).await?;
        for batch in &walk.batches {
            let key = batch.metadata.as_ref().and_then(|m| m.get(wire::BATCH_KEY_METADATA));
            let by_file = batch.input_file_id.as_ref().is_some_and(|f| files.contains(f));
            if by_file || key.is_some_and(|k| k == intent.batch_key) {
                return Ok(Lookup::Found(batch.id.clone()));
            }
        }
        match walk.complete {
            Ok(()) => Ok(Lookup::Absent),
            Err(reason) => Ok(undecided(reason)),
        }
    }

    /// The ids of files uploaded under this batch key since the intent; `Err(reason)` when
    /// the file list cannot be read to its end.
    async fn our_input_files(
        &self,
        batch_key: &str,
        oldest_secs: u64,
    ) -> Result<Result<Vec<String>, String>, ProviderError> {
        let name = input_file_name(batch_key);
        let mut ours = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut request = self.http.get(self.url("/files"));
            if let Some(cursor) = &after {
                request = request.query(&[("after", cursor.as_str())]);
            }
            let page: FileList = match self.json(request).await {
                Ok(page) => page,
                Err(e) if e.class == ErrorClass::Gone || e.status == Some(405) => {
                    return Ok(Err(format!(
                        "the platform lists no files ({}), so a batch without metadata cannot be ruled out",
                        e.message()
                    )));
                }
                Err(e) => return Err(e),
            };
            ours.extend(
                page.data.iter().filter(|f| f.filename.as_deref() == Some(name.as_str())).map(|f| f.id.clone()),
            );
            let reached_older = page.data.iter().any(|f| f.created_at.is_some_and(|c| c < oldest_secs));
            if !page.has_more || reached_older {
                return Ok(Ok(ours));
            }
            after = page.last_id.or_else(|| page.data.last().map(|f| f.id.clone()));
            if after.is_none() {
                return Ok(Err("the file list says it has more but gives no cursor".to_string()));
            }
        }
        Ok(Err(format!("more than {MAX_LIST_PAGES} pages of files since the intent; cannot rule one out")))
    }

    async fn batches_since(&self, oldest_secs: u64) -> Result<Walk, ProviderError> {
        let mut batches = Vec::new();
        let mut after: Option<String> = None;
        for _ in 0..MAX_LIST_PAGES {
            let mut request = self.http.get(self.url("/batches")).query(&[("limit", "100")]);
            if let Some(cursor) = &after {
                request = request.query(&[("after", cursor.as_str())]);
            }
            let page: wire::BatchList = self.json(request).await?;
            let reached_older = page.data.iter().any(|b| b.created_at.is_some_and(|c| c < oldest_secs));
            after = page.last_id.clone().or_else(|| page.data.last().map(|b| b.id.clone()));
            batches.extend(page.data);
            if !page.has_more || reached_older {
                return Ok(Walk { batches, complete: Ok(()) });
            }
            if after.is_none() {
                let reason = "the batch list says it has more but gives no cursor".to_string();
                return Ok(Walk { batches, complete: Err(reason) });
            }
        }
        let reason = format!("more than {MAX_LIST_PAGES} pages of batches since the intent; cannot rule one out");
        Ok(Walk { batches, complete: Err(reason) })
    }
}

fn oldest_secs(created_at_ms: u64) -> u64 {
    created_at_ms.saturating_sub(CREATED_AT_SLACK.as_millis() as u64) / 1000
}
