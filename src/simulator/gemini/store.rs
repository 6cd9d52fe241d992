//! The Gemini dialect's memory inside the simulator's shared state: batches in creation
//! order, files by name (`files/{id}`), and resumable uploads not yet finalized.

use std::collections::HashMap;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use serde_json::{Value, json};

use super::lifecycle::{Record, rfc3339};

/// "Files are stored for 48 hours" (Files API guide).
const FILE_TTL: std::time::Duration = std::time::Duration::from_secs(48 * 3600);

#[derive(Debug, Default)]
pub(crate) struct Store {
    pub batches: Vec<Record>,
    pub files: HashMap<String, StoredFile>,
    pub uploads: HashMap<String, Upload>,
}

#[derive(Debug)]
pub(crate) struct StoredFile {
    pub display_name: String,
    pub bytes: Bytes,
    created: SystemTime,
}

/// An upload session opened by `X-Goog-Upload-Command: start`.
#[derive(Debug)]
pub(crate) struct Upload {
    pub display_name: String,
    /// `X-Goog-Upload-Header-Content-Length`, as declared at start.
    pub declared: u64,
    pub received: BytesMut,
}

impl Store {
    pub(crate) fn store_file(&mut self, name: String, display_name: String, bytes: Bytes) {
        self.files.insert(name, StoredFile { display_name, bytes, created: crate::domain::clock::now() });
    }
}

impl StoredFile {
    /// The `File` resource, as the finalized upload answers it.
    pub(crate) fn resource(&self, name: &str, origin: &str) -> Value {
        json!({
            "name": name,
            "displayName": self.display_name,
            "mimeType": "application/jsonl",
            "sizeBytes": self.bytes.len().to_string(),
            "createTime": rfc3339(self.created),
            "updateTime": rfc3339(self.created),
            "expirationTime": rfc3339(self.created + FILE_TTL),
            "uri": format!("{origin}/v1beta/{name}"),
            "state": "ACTIVE",
            "source": "UPLOADED",
        })
    }
}
