//! Reading a request body within bounds: a size limit checked against `Content-Length`
//! before anything is read (so `Expect: 100-continue` gets its 413 at once), a deadline
//! for the whole body, and gzip decoded under the same size limit.

use std::io::Read;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
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
/// the limit in the refusal, so the sender knows which knob it hit. The deadline is the
/// body's own ([`Deadline`], on every request): a second timer here would cost as much again.
pub(super) async fn read(
    headers: &HeaderMap,
    body: Body,
    max_bytes: usize,
    setting: &'static str,
) -> Result<Bytes, BodyError> {
    let encoding = encoding(headers)?;
    let too_large = || BodyError::TooLarge { limit: max_bytes, setting };
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(too_large());
    }
    let raw = match axum::body::to_bytes(body, max_bytes).await {
        Err(e) if over_limit(&e) => return Err(too_large()),
        Err(e) => match find::<PastDeadline>(&e) {
            Some(PastDeadline(deadline)) => return Err(BodyError::TimedOut(*deadline)),
            None => return Err(BodyError::Unreadable(e.to_string())),
        },
        Ok(raw) => raw,
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
    find::<http_body_util::LengthLimitError>(e).is_some()
}

fn find<E: std::error::Error + 'static>(e: &axum::Error) -> Option<&E> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(found) = err.downcast_ref::<E>() {
            return Some(found);
        }
        source = err.source();
    }
    None
}

/// A request body that ends with an error once `deadline` has passed since its first
/// read, whoever reads it (an axum extractor, a handler streaming it, [`read`]). `front.rs`
/// puts it on every request, so that no route family can be added without it.
/// tower-http's `TimeoutBody` is not used: it restarts its clock at each frame, and a
/// client trickling a byte at a time never trips it.
pub(super) struct Deadline<B> {
    body: B,
    deadline: Duration,
    /// Set at the first poll: a handler that never reads the body owes it no deadline.
    started: Option<tokio::time::Instant>,
    /// Armed only when the body first makes its reader wait. Most bodies are in hand by then
    /// or soon after, and arming a timer (and taking it out again) costs a lock on the
    /// runtime's timer wheel each way.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<B> Deadline<B> {
    pub(super) fn new(body: B, deadline: Duration) -> Self {
        Self { body, deadline, started: None, timer: None }
    }
}

/// What a body read past its deadline fails with.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub(super) struct PastDeadline(Duration);

impl<B> http_body::Body for Deadline<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let started = *this.started.get_or_insert_with(tokio::time::Instant::now);
        let past = PastDeadline(this.deadline);
        if let Some(timer) = this.timer.as_mut()
            && timer.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(axum::Error::new(past))));
        }
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(axum::Error::new))),
            Poll::Pending => {
                let timer =
                    this.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(started + this.deadline)));
                if timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(axum::Error::new(past))));
                }
                Poll::Pending
            }
        }
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

    /// A frame every 400 ms never waits long at any one read, so only a clock over the
    /// whole body (not one restarted per frame) cuts it off, at 1 s from the first read.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_is_cut_at_the_whole_body_deadline() {
        let trickle = futures_util::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_millis(400)).await;
            Some((Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(b" "))), ()))
        });
        let body = Body::new(Deadline::new(http_body_util::StreamBody::new(Box::pin(trickle)), Duration::from_secs(1)));
        let start = tokio::time::Instant::now();
        let outcome = read(&HeaderMap::new(), body, 1 << 20, "test").await;
        assert!(matches!(outcome, Err(BodyError::TimedOut(d)) if d == Duration::from_secs(1)), "{outcome:?}");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_secs(1) && waited < Duration::from_millis(1200), "{waited:?}");
    }

    /// A body already in hand never makes its reader wait, so it never arms a timer.
    #[tokio::test(start_paused = true)]
    async fn a_complete_body_arms_no_timer() {
        use http_body_util::BodyExt as _;
        let mut body = Deadline::new(http_body_util::Full::new(Bytes::from_static(b"{}")), Duration::from_secs(1));
        while let Some(frame) = body.frame().await {
            assert!(frame.is_ok());
        }
        assert!(body.started.is_some() && body.timer.is_none());
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
