//! `POST /v1/files` (multipart upload), `GET /v1/files/{id}`, `DELETE /v1/files/{id}` and
//! `GET /v1/files/{id}/content` (raw bytes, no JSON envelope).

use std::sync::Arc;

use axum::Json;
use axum::extract::multipart::{Field, MultipartError, MultipartRejection};
use axum::extract::{Multipart, Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};

use super::error::ApiError;
use super::input::{self, MAX_FILE_BYTES};
use super::state::{DEFAULT_FILE_TTL_SECS, Shared, unix_now};
use super::wire::{DeletedFile, OpenAiFile, PURPOSE_BATCH, UPLOAD_PURPOSES};

/// Form fields other than `file` are short words and numbers.
const MAX_FIELD_BYTES: usize = 4096;
const MIN_EXPIRY_SECS: i64 = 3600;
const MAX_EXPIRY_SECS: i64 = 2_592_000;

#[derive(Default)]
struct Form {
    file: Option<(String, Bytes)>,
    purpose: Option<String>,
    anchor: Option<String>,
    seconds: Option<String>,
}

pub(super) async fn upload(
    State(shared): State<Arc<Shared>>,
    uri: axum::http::Uri,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<OpenAiFile>, ApiError> {
    let mut multipart =
        multipart.map_err(|e| ApiError::invalid(format!("Expected a multipart/form-data body: {e}")))?;
    let variant = shared.variant.clone();
    let form = read_form(&mut multipart, variant.azure && super::variant::azure_expiry_accepted(uri.query())).await?;
    let Some((filename, content)) = form.file else {
        return Err(missing("file"));
    };
    let Some(purpose) = form.purpose else {
        return Err(missing("purpose"));
    };
    // Azure's front end answers a purpose it does not take in its own shape (the body
    // quoted in BerriAI/litellm#6582 and Azure/AI-in-a-Box#46).
    if variant.azure && !UPLOAD_PURPOSES.contains(&purpose.as_str()) {
        return Err(ApiError::azure("invalidPayload", "Invalid value for purpose."));
    }
    if !UPLOAD_PURPOSES.contains(&purpose.as_str()) {
        return Err(ApiError::invalid(format!(
            "Invalid value for 'purpose': '{purpose}'. Expected one of {}.",
            UPLOAD_PURPOSES.join(", ")
        ))
        .param("purpose")
        .code("invalid_value"));
    }
    let ttl = expiry(form.anchor, form.seconds)?;
    if variant.azure && ttl.is_some_and(|s| !super::variant::AZURE_EXPIRY_SECS.contains(&s)) {
        return Err(ApiError::invalid("expires_after.seconds must be between 1209600 and 2592000 (14 to 30 days).")
            .param("expires_after")
            .code("invalid_value"));
    }
    let now = unix_now();
    // Azure keeps a batch file without an expiry until it is deleted, 500 of them at most.
    let unexpiring = variant.azure && ttl.is_none();
    let (expires_at, parsed) = if purpose == PURPOSE_BATCH {
        check_refused_payload(&shared, variant.azure)?;
        check_lowered_size_limit(&shared, content.len())?;
        if unexpiring {
            check_unexpiring_quota(&shared)?;
        }
        let parsed = check_batch_input(&filename, content.clone(), &variant).await?;
        let expires_at = (!unexpiring).then(|| now + ttl.unwrap_or(DEFAULT_FILE_TTL_SECS));
        (expires_at, Some(Arc::new(parsed)))
    } else {
        tracing::warn!(%purpose, "SIMULATED provider: file uploaded with a purpose no batch can use");
        (ttl.map(|s| now + s), None)
    };
    let mut inner = shared.lock();
    let meta = inner.insert_file(&purpose, filename, now, expires_at, content, parsed);
    inner.stats.files_uploaded += 1;
    if purpose == PURPOSE_BATCH {
        inner.stats.last_upload_bytes = meta.bytes;
    }
    tracing::info!(file = %meta.id, bytes = meta.bytes, "SIMULATED provider: file uploaded");
    Ok(Json(meta))
}

pub(super) async fn retrieve(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<OpenAiFile>, ApiError> {
    let inner = shared.lock();
    let file = inner.files.get(&id).ok_or_else(|| no_such_file(&id))?;
    Ok(Json(file.meta.clone()))
}

pub(super) async fn delete(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<DeletedFile>, ApiError> {
    let mut inner = shared.lock();
    inner.files.remove(&id).ok_or_else(|| no_such_file(&id))?;
    inner.stats.files_deleted += 1;
    Ok(Json(DeletedFile { id, object: "file".to_string(), deleted: true }))
}

pub(super) async fn content(State(shared): State<Arc<Shared>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let mut inner = shared.lock();
    let bytes = inner.files.get(&id).map(|f| f.content.clone()).ok_or_else(|| no_such_file(&id))?;
    inner.stats.content_downloads += 1;
    let content_type = [(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"))];
    Ok((content_type, bytes).into_response())
}

/// `azure`: also Azure's documented `expires_after.anchor` / `expires_after.seconds` (where
/// the request's api-version takes them; elsewhere they are unrecognized arguments).
async fn read_form(multipart: &mut Multipart, azure: bool) -> Result<Form, ApiError> {
    let mut form = Form::default();
    while let Some(field) = multipart.next_field().await.map_err(bad_multipart)? {
        let name = field.name().unwrap_or_default().to_string();
        match name.as_str() {
            "file" => {
                let filename = field.file_name().unwrap_or("file").to_string();
                let content = read_field(field, MAX_FILE_BYTES).await?.ok_or_else(|| {
                    ApiError::invalid("File is too large: the Batch API accepts .jsonl files up to 200 MB.")
                        .param("file")
                })?;
                form.file = Some((filename, content));
            }
            "purpose" => form.purpose = Some(read_text(field, &name).await?),
            "expires_after[anchor]" => form.anchor = Some(read_text(field, &name).await?),
            "expires_after[seconds]" => form.seconds = Some(read_text(field, &name).await?),
            "expires_after.anchor" if azure => form.anchor = Some(read_text(field, &name).await?),
            "expires_after.seconds" if azure => form.seconds = Some(read_text(field, &name).await?),
            _ => {
                return Err(ApiError::invalid(format!("Unrecognized request argument supplied: {name}"))
                    .param(&name)
                    .code("unknown_parameter"));
            }
        }
    }
    Ok(form)
}

/// Reads a field up to `limit` bytes; `None` when it is larger (the rest is not read).
async fn read_field(mut field: Field<'_>, limit: usize) -> Result<Option<Bytes>, ApiError> {
    let mut buffer = BytesMut::new();
    while let Some(chunk) = field.chunk().await.map_err(bad_multipart)? {
        if buffer.len() + chunk.len() > limit {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk);
    }
    Ok(Some(buffer.freeze()))
}

async fn read_text(field: Field<'_>, name: &str) -> Result<String, ApiError> {
    let bytes = read_field(field, MAX_FIELD_BYTES)
        .await?
        .ok_or_else(|| ApiError::invalid(format!("'{name}' is too long.")).param(name))?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::invalid(format!("'{name}' must be UTF-8 text.")).param(name))
}

fn expiry(anchor: Option<String>, seconds: Option<String>) -> Result<Option<i64>, ApiError> {
    let bad = |message: &str| ApiError::invalid(message).param("expires_after").code("invalid_value");
    match (anchor, seconds) {
        (None, None) => Ok(None),
        (Some(anchor), Some(seconds)) => {
            if anchor != "created_at" {
                return Err(bad("expires_after[anchor] must be 'created_at'."));
            }
            match seconds.trim().parse::<i64>() {
                Ok(s) if (MIN_EXPIRY_SECS..=MAX_EXPIRY_SECS).contains(&s) => Ok(Some(s)),
                _ => Err(bad("expires_after[seconds] must be an integer between 3600 and 2592000.")),
            }
        }
        _ => Err(bad("expires_after needs both [anchor] and [seconds].")),
    }
}

/// Azure's cap on batch files without an expiry, in its words (a 400 body quoted in
/// Azure/azure-sdk-for-java#47401): `{"error": {"code": "quotaExceeded", "message": "The
/// quota for files without expiry is reached. The maximum is 500."}}`.
fn check_unexpiring_quota(shared: &Shared) -> Result<(), ApiError> {
    let mut inner = shared.lock();
    let cap = match inner.faults.azure_unexpiring_file_quota {
        0 => AZURE_UNEXPIRING_FILES,
        n => n as usize,
    };
    let held = inner.files.values().filter(|f| f.meta.purpose == PURPOSE_BATCH && f.meta.expires_at.is_none()).count();
    if held < cap {
        return Ok(());
    }
    inner.stats.uploads_refused += 1;
    Err(ApiError::azure(
        "quotaExceeded",
        format!("The quota for files without expiry is reached. The maximum is {cap}."),
    ))
}

/// `refuse_upload_next`: a batch file the service will not take, in each dialect's words
/// for a payload it refuses (not its size). Azure: 400 `invalidPayload` "The file has no or
/// an empty content type specified." (Azure/azure-sdk-for-net#44710); OpenAI: 400
/// `invalid_request_error` "Invalid file for Batch API. Must be utf-8 encoded"
/// (mkht/PSOpenAI#19).
fn check_refused_payload(shared: &Shared, azure: bool) -> Result<(), ApiError> {
    let mut inner = shared.lock();
    if inner.faults.refuse_upload_next == 0 {
        return Ok(());
    }
    inner.faults.refuse_upload_next -= 1;
    inner.stats.uploads_refused += 1;
    tracing::warn!("SIMULATED fault: batch upload refused as an invalid payload");
    Err(if azure {
        ApiError::azure("invalidPayload", "The file has no or an empty content type specified.")
    } else {
        ApiError::invalid("Invalid file for Batch API. Must be utf-8 encoded").param("file")
    })
}

/// "There is a max limit of 500 batch files per resource when no expiration is set" (Azure's
/// batch how-to).
const AZURE_UNEXPIRING_FILES: usize = 500;

/// The size limit a test lowered (`max_input_file_bytes`), refused as the real one is.
fn check_lowered_size_limit(shared: &Shared, bytes: usize) -> Result<(), ApiError> {
    let mut inner = shared.lock();
    let limit = inner.faults.max_input_file_bytes;
    if limit == 0 || u64::try_from(bytes).unwrap_or(u64::MAX) <= limit {
        return Ok(());
    }
    inner.stats.uploads_refused += 1;
    Err(ApiError::invalid(format!(
        "File is too large: the Batch API accepts .jsonl files up to {limit} bytes. \
         (SIMULATED limit: max_input_file_bytes)"
    ))
    .param("file"))
}

/// Upload-time checks for `purpose=batch`: file type and hard limits. Line contents are
/// judged later, at batch validation, as the real API does.
async fn check_batch_input(
    filename: &str,
    content: Bytes,
    variant: &super::variant::Variant,
) -> Result<input::Input, ApiError> {
    if !filename.ends_with(".jsonl") {
        return Err(ApiError::invalid("Invalid file format for Batch API. Must be .jsonl").param("file"));
    }
    // Parsing up to 200 MB is CPU work; keep it off the request threads.
    let (urls, max_lines) = (variant.request_urls(), variant.max_lines());
    let parsed = tokio::task::spawn_blocking(move || {
        let lines = input::count_lines(&content);
        (lines <= max_lines).then(|| input::parse_for(&content, urls)).ok_or(lines)
    })
    .await
    .map_err(|e| ApiError::server(format!("input parsing stopped: {e}")))?;
    parsed.map_err(|lines| {
        ApiError::invalid(format!("The input file has {lines} requests; the Batch API accepts at most {max_lines}."))
            .param("file")
    })
}

fn missing(param: &str) -> ApiError {
    ApiError::invalid(format!("Missing required parameter: '{param}'.")).param(param).code("missing_required_parameter")
}

fn bad_multipart(e: MultipartError) -> ApiError {
    ApiError::invalid(format!("Malformed multipart body: {}", e.body_text()))
}

pub(super) fn no_such_file(id: &str) -> ApiError {
    ApiError::not_found(format!("No such File object: {id}")).param("id")
}
