//! The Mistral dialect's memory inside the simulator's shared state: files by id and batch
//! jobs in creation order. Ids are UUIDs, as the API's are.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::{Value, json};

use super::lifecycle::Job;
use crate::simulator::state::Inner;

#[derive(Debug, Default)]
pub(crate) struct Store {
    pub files: HashMap<String, StoredFile>,
    pub jobs: Vec<Job>,
}

#[derive(Debug)]
pub(crate) struct StoredFile {
    pub filename: String,
    pub purpose: String,
    pub bytes: Bytes,
    pub created_at: i64,
    /// Lines of a `batch` input, counted at upload.
    pub lines: Option<u64>,
}

impl StoredFile {
    /// The file object `POST /v1/files` answers (client-python `UploadFileOut`).
    pub(crate) fn object(&self, id: &str) -> Value {
        json!({
            "id": id,
            "object": "file",
            "bytes": self.bytes.len(),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "sample_type": if self.purpose == "batch" { "batch_request" } else { "instruct" },
            "num_lines": self.lines,
            "source": "upload",
        })
    }
}

/// A fresh UUID-shaped id, deterministic for the simulator's seed.
pub(crate) fn uuid(inner: &mut Inner) -> String {
    let hex: String =
        inner.new_id("", 32).bytes().map(|b| char::from_digit(u32::from(b & 0xf), 16).unwrap_or('0')).collect();
    format!("{}-{}-4{}-a{}-{}", &hex[..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..32])
}
