//! The one reader of streamed JSONL result files, shared by every batch adapter, so that
//! they agree on what a line is: split on `\n` (a `\r` before it is trimmed with the
//! other whitespace), the last line may lack its newline, a blank line is no result, and
//! a line longer than any real answer is skipped unread and counted malformed rather than
//! buffered or failing the whole file. At most one line (capped) is held in memory.

use std::pin::Pin;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use tokio::sync::mpsc;

use super::{ErrorClass, ProviderError, ResultLine, StreamCounts, describe_transport};

/// No result line is this long (a request is capped at well under it); longer is garbage.
pub(crate) const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Chunks of a body; a broken transfer is already described as text.
type Body = Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    Text(Vec<u8>),
    /// A line longer than the reader's limit, dropped unread.
    Oversized,
}

/// Sends every result `parse` reads from `lines` to `out` (reasons redacted), counting the
/// lines and the malformed ones. A malformed line's content is model output: its reason is
/// logged, never the line, and its member gets no result (so it goes round again).
pub(crate) async fn forward(
    lines: &mut Lines,
    parse: fn(&str) -> Result<ResultLine, String>,
    out: &mpsc::Sender<ResultLine>,
    counts: &mut StreamCounts,
) -> Result<(), ProviderError> {
    while let Some(line) = lines.next().await? {
        let Some(parsed) = line.parse(parse) else { continue };
        counts.lines += 1;
        match parsed {
            Ok(result) => out.send(super::scrub(result)).await.map_err(|_| ProviderError {
                provider: lines.provider,
                class: ErrorClass::Transient,
                status: None,
                message: "result consumer stopped".to_string(),
                retry_after: None,
            })?,
            Err(reason) => {
                counts.malformed += 1;
                tracing::warn!(provider = lines.provider, %reason, "skipping a malformed result line");
            }
        }
    }
    Ok(())
}

impl Line {
    /// Hands the line's text, lossily decoded and trimmed, to `parse`. `None` for a blank
    /// line; an oversized line is an `Err`, a malformed line like any other.
    pub(crate) fn parse<T>(&self, parse: impl FnOnce(&str) -> Result<T, String>) -> Option<Result<T, String>> {
        match self {
            Line::Text(bytes) => {
                let text = String::from_utf8_lossy(bytes);
                let text = text.trim();
                (!text.is_empty()).then(|| parse(text))
            }
            Line::Oversized => Some(Err("a result line over the line limit, skipped unread".to_string())),
        }
    }
}

/// Splits a streamed body into lines.
pub(crate) struct Lines {
    body: Body,
    /// Names the adapter in a broken download's error.
    provider: &'static str,
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no newline.
    scanned: usize,
    max_line: usize,
    oversized: bool,
    ended: bool,
}

/// Hands one file line to the result consumer: parsed by `parse`, its reason redacted,
/// counted. A malformed line is counted and logged (why, never what: its content is model
/// output) and skipped, so one torn line never fails the file.
pub(crate) async fn deliver(
    provider: &'static str,
    line: &Line,
    parse: impl FnOnce(&str) -> Result<ResultLine, String>,
    counts: &mut StreamCounts,
    out: &mpsc::Sender<ResultLine>,
) -> Result<(), ProviderError> {
    let Some(parsed) = line.parse(parse) else {
        return Ok(());
    };
    counts.lines += 1;
    match parsed {
        Ok(parsed) => out
            .send(super::scrub(parsed))
            .await
            .map_err(|_| ProviderError::new(provider, ErrorClass::Transient, None, "result consumer stopped")),
        Err(reason) => {
            counts.malformed += 1;
            tracing::warn!(provider, %reason, "skipping a malformed result line");
            Ok(())
        }
    }
}

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines").field("provider", &self.provider).field("pending", &self.pending.len()).finish()
    }
}

impl Lines {
    pub(crate) fn new(response: reqwest::Response, provider: &'static str) -> Self {
        let body = response.bytes_stream().map(|chunk| chunk.map_err(|e| describe_transport(&e)));
        Self::from_stream(Box::pin(body), MAX_LINE_BYTES, provider)
    }

    /// A body from elsewhere than reqwest (an S3 object), its errors already described.
    pub(crate) fn from_described(body: Body, provider: &'static str) -> Self {
        Self::from_stream(body, MAX_LINE_BYTES, provider)
    }

    fn from_stream(body: Body, max_line: usize, provider: &'static str) -> Self {
        Self { body, provider, pending: Vec::new(), scanned: 0, max_line, oversized: false, ended: false }
    }

    /// The next line (with its `\n`, if it had one); `None` at the end of the body.
    pub(crate) async fn next(&mut self) -> Result<Option<Line>, ProviderError> {
        loop {
            if let Some(at) = self.pending[self.scanned..].iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=self.scanned + at).collect();
                self.scanned = 0;
                return Ok(Some(self.finish(line)));
            }
            self.scanned = self.pending.len();
            if self.pending.len() > self.max_line {
                self.pending.clear();
                self.scanned = 0;
                self.oversized = true;
            }
            if self.ended {
                if self.pending.is_empty() && !self.oversized {
                    return Ok(None);
                }
                let line = std::mem::take(&mut self.pending);
                self.scanned = 0;
                return Ok(Some(self.finish(line)));
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.pending.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    return Err(ProviderError {
                        provider: self.provider,
                        class: ErrorClass::Transient,
                        status: None,
                        message: format!("download broke: {e}"),
                        retry_after: None,
                    });
                }
                None => self.ended = true,
            }
        }
    }

    fn finish(&mut self, line: Vec<u8>) -> Line {
        let too_long = line.strip_suffix(b"\n").unwrap_or(&line).len() > self.max_line;
        if std::mem::take(&mut self.oversized) || too_long { Line::Oversized } else { Line::Text(line) }
    }
}

/// Every line of a body already in memory, split exactly as a download is, so the fuzz
/// targets hand the parsers what the adapters would.
#[cfg(feature = "fuzzing")]
pub(crate) fn split(data: &[u8]) -> Vec<Line> {
    use futures_util::FutureExt;
    let body: Vec<Result<Bytes, String>> = vec![Ok(Bytes::copy_from_slice(data))];
    let mut lines = Lines::from_stream(Box::pin(futures_util::stream::iter(body)), MAX_LINE_BYTES, "fuzzing");
    let mut split = Vec::new();
    // A stream over memory never waits, so every step is ready at once and never fails.
    while let Some(Ok(Some(line))) = lines.next().now_or_never() {
        split.push(line);
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line `chunks` splits into, with a cap of `max_line`, as text (`<oversized>`
    /// for a skipped one), asserting memory stays near the cap throughout.
    async fn read(chunks: &[&[u8]], max_line: usize) -> Vec<String> {
        let chunks: Vec<Result<Bytes, String>> = chunks.iter().map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let mut lines = Lines::from_stream(Box::pin(futures_util::stream::iter(chunks)), max_line, "test");
        let mut seen = Vec::new();
        while let Some(line) = lines.next().await.unwrap() {
            seen.push(match line {
                Line::Text(bytes) => String::from_utf8(bytes).unwrap(),
                Line::Oversized => "<oversized>".to_string(),
            });
            assert!(lines.pending.capacity() < 4 * max_line, "memory stays near the line limit");
        }
        seen
    }

    #[tokio::test]
    async fn a_line_split_across_chunks_is_joined() {
        let seen = read(&[b"{\"a\"", b":1}\n{\"b\":", b"2}\n"], 64).await;
        assert_eq!(seen, ["{\"a\":1}\n", "{\"b\":2}\n"]);
    }

    #[tokio::test]
    async fn the_last_line_needs_no_newline() {
        assert_eq!(read(&[b"one\ntwo"], 64).await, ["one\n", "two"]);
        assert_eq!(read(&[b"one\n"], 64).await, ["one\n"], "a final newline adds no empty line");
        assert!(read(&[], 64).await.is_empty());
    }

    #[tokio::test]
    async fn crlf_line_ends_parse_like_lf() {
        let seen = read(&[b"{\"a\":1}\r", b"\n\r\n{\"b\":2}\r\n"], 64).await;
        let parsed: Vec<Option<Result<String, String>>> =
            seen.iter().map(|s| Line::Text(s.clone().into_bytes()).parse(|t| Ok(t.to_string()))).collect();
        assert_eq!(parsed, [Some(Ok("{\"a\":1}".into())), None, Some(Ok("{\"b\":2}".into()))]);
    }

    #[tokio::test]
    async fn an_overlong_line_is_skipped_and_the_rest_still_read() {
        let long = "x".repeat(100);
        // In one chunk, across chunks, at the end without a newline.
        let seen =
            read(&[b"first\n", long.as_bytes(), b"\nthird\n", &long.as_bytes()[..50], &long.as_bytes()[50..]], 40)
                .await;
        assert_eq!(seen, ["first\n", "<oversized>", "third\n", "<oversized>"]);
        let exactly = "y".repeat(40);
        assert_eq!(read(&[exactly.as_bytes(), b"\n"], 40).await, [format!("{exactly}\n")], "the limit itself is fine");
    }

    #[test]
    fn an_oversized_line_parses_as_malformed_and_a_blank_one_as_nothing() {
        let malformed = Line::Oversized.parse(|_| -> Result<(), String> { panic!("an oversized line is never read") });
        assert!(matches!(malformed, Some(Err(_))));
        assert_eq!(Line::Text(b" \r\n".to_vec()).parse(|t| Ok(t.len())), None);
        assert_eq!(Line::Text(b"\xff{}\n".to_vec()).parse(|t| Ok(t.to_string())), Some(Ok("\u{fffd}{}".into())));
    }
}
