//! Reading a request body within bounds: a size limit checked against `Content-Length`
//! before anything is read (so `Expect: 100-continue` gets its 413 at once), a deadline
//! for the whole body, and gzip decoded under the same size limit.

use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Frame;

use super::limits::{DEFAULT_MAX_BODY_BYTES, ServerLimits};

/// What every body read on a route may take; a layer puts it on each request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    pub max_bytes: usize,
    pub deadline: Duration,
}

impl Default for BodyLimits {
    fn default() -> Self {
        Self { max_bytes: DEFAULT_MAX_BODY_BYTES, deadline: ServerLimits::default().body_read_timeout }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the request body exceeds the {limit}-byte limit ({setting})")]
    TooLarge { limit: usize, setting: &'static str },
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    #[error("cannot read the request body: {0}")]
    Unreadable(String),
    #[error("Content-Encoding {0:?} is not supported; send the body as is, or gzip")]
    UnsupportedEncoding(String),
    #[error("the gzip body does not decode: {0}")]
    BadGzip(String),
    #[error("Content-Type {0:?} is not JSON; send the body with Content-Type: application/json")]
    NotJson(String),
}

enum Encoding {
    Identity,
    Gzip,
}

fn encoding(headers: &HeaderMap) -> Result<Encoding, BodyError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else { return Ok(Encoding::Identity) };
    let text = value.to_str().map_err(|_| BodyError::UnsupportedEncoding(format!("{value:?}")))?.trim();
    if text.is_empty() || text.eq_ignore_ascii_case("identity") {
        Ok(Encoding::Identity)
    } else if text.eq_ignore_ascii_case("gzip") || text.eq_ignore_ascii_case("x-gzip") {
        Ok(Encoding::Gzip)
    } else {
        Err(BodyError::UnsupportedEncoding(text.to_string()))
    }
}

/// The body, decoded, at most `max_bytes` both as sent and once decoded. `setting` names
/// the limit in the refusal, so the sender knows which knob it hit.
pub(super) async fn read(
    headers: &HeaderMap,
    body: Body,
    max_bytes: usize,
    deadline: Duration,
    setting: &'static str,
) -> Result<Bytes, BodyError> {
    let encoding = encoding(headers)?;
    let too_large = || BodyError::TooLarge { limit: max_bytes, setting };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(too_large());
    }
    let raw = match tokio::time::timeout(deadline, axum::body::to_bytes(body, max_bytes)).await {
        Err(_) => return Err(BodyError::TimedOut(deadline)),
        Ok(Err(e)) if over_limit(&e) => return Err(too_large()),
        Ok(Err(e)) if caused_by::<PastDeadline>(&e) => return Err(BodyError::TimedOut(deadline)),
        Ok(Err(e)) => return Err(BodyError::Unreadable(e.to_string())),
        Ok(Ok(raw)) => raw,
    };
    match encoding {
        Encoding::Identity => Ok(raw),
        // Decompression is CPU work of up to `max_bytes` of output: off the async threads.
        Encoding::Gzip => tokio::task::spawn_blocking(move || gunzip(&raw, max_bytes))
            .await
            .map_err(|e| BodyError::Unreadable(e.to_string()))?
            .map_err(|e| match e {
                Gunzip::TooLarge => too_large(),
                Gunzip::Bad(text) => BodyError::BadGzip(text),
            }),
    }
}

fn over_limit(e: &axum::Error) -> bool {
    caused_by::<http_body_util::LengthLimitError>(e)
}

fn caused_by<E: std::error::Error + 'static>(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<E>() {
            return true;
        }
        source = err.source();
    }
    false
}

/// The layer on the whole router (`mod.rs`): every request's body ends with an error once
/// `deadline` has passed since its first read, whoever reads it (an axum extractor, a
/// handler streaming it, [`read`]). One layer, so that no route family can be added
/// without it. tower-http's `TimeoutBody` is not used: it restarts its clock at each frame,
/// and a client trickling a byte at a time never trips it.
pub(super) async fn deadline(State(deadline): State<Duration>, request: Request, next: Next) -> Response {
    next.run(request.map(|body| Body::new(Deadline { body, deadline, timer: None }))).await
}

/// What a body read past its deadline fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub(super) struct PastDeadline(Duration);

struct Deadline {
    body: Body,
    deadline: Duration,
    /// Started at the first poll: a handler that never reads the body owes it no deadline.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for Deadline {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let deadline = self.deadline;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(deadline)));
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(axum::Error::new(PastDeadline(deadline)))));
        }
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

enum Gunzip {
    TooLarge,
    Bad(String),
}

/// Decodes at most one byte past the limit, so a gzip bomb costs `max_bytes` of memory
/// and no more before it is refused.
fn gunzip(raw: &[u8], max_bytes: usize) -> Result<Bytes, Gunzip> {
    let mut out = Vec::new();
    let cap = (max_bytes as u64).saturating_add(1);
    flate2::read::MultiGzDecoder::new(raw).take(cap).read_to_end(&mut out).map_err(|e| Gunzip::Bad(e.to_string()))?;
    if out.len() > max_bytes {
        return Err(Gunzip::TooLarge);
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_decoded_limit() {
        let bomb = gzip(&vec![b'a'; 4 << 20]);
        assert!(bomb.len() < 64 * 1024, "the bomb is small on the wire");
        assert!(matches!(gunzip(&bomb, 1 << 20), Err(Gunzip::TooLarge)));
        assert_eq!(gunzip(&bomb, 4 << 20).ok().map(|b| b.len()), Some(4 << 20));
        assert!(matches!(gunzip(b"not gzip", 1024), Err(Gunzip::Bad(_))));
    }

    #[test]
    fn encodings_other_than_identity_and_gzip_are_refused() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::CONTENT_ENCODING, value.parse().unwrap());
            encoding(&headers)
        };
        assert!(matches!(with("GZIP"), Ok(Encoding::Gzip)));
        assert!(matches!(with("identity"), Ok(Encoding::Identity)));
        for bad in ["br", "deflate", "gzip, br", "zstd"] {
            assert!(matches!(with(bad), Err(BodyError::UnsupportedEncoding(_))), "{bad}");
        }
    }
}
