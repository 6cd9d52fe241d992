//! The body of `GET /v1/export`: the store's walk writes lines into chunks on a blocking
//! thread and hands them over a bounded channel, so the server holds a few chunks at most
//! whatever is exported.
//!
//! A client that stops reading must not pin the walk's thread, snapshot and (on
//! PostgreSQL) connection for ever (issue 30): each hand-over waits at most the stall
//! timeout, and a tenant erasure ends the walk too. An export that stops before its end
//! must not look complete, so the body ends cleanly only after the walk's own last piece;
//! a walk that ended any other way ends the body with an error, which cuts the chunked
//! response short (no terminating chunk).

use axum::body::{Body, Bytes};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use crate::service::ExportPermit;
use crate::store::Exported;
use crate::store::seam::ExportSink;

/// Bytes gathered into one chunk of the response body.
const CHUNK_BYTES: usize = 64 * 1024;
/// Chunks waiting for a slow client: with `CHUNK_BYTES`, the most an export buffers.
const CHUNKS_IN_FLIGHT: usize = 4;

enum Piece {
    Chunk(Bytes),
    /// The walk is complete: only after this does the body end cleanly.
    End,
}

/// Why a walk stopped before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The client went away (nothing left to tell).
    Gone,
    Stalled,
    Erased,
}

/// The walk's side: turns each extraction into a line and hands chunks to the body.
struct Feed {
    pieces: mpsc::Sender<Piece>,
    runtime: Handle,
    permit: ExportPermit,
    buf: Vec<u8>,
    write_line: LineWriter,
}

/// Turns one exported extraction into its line(s), appended to the buffer.
pub(super) type LineWriter = Box<dyn Fn(&mut Vec<u8>, &Exported) + Send>;

impl Feed {
    /// `false` ends the walk.
    fn take(&mut self, item: Option<Exported>) -> bool {
        if self.permit.ended().is_cancelled() {
            return self.stopped(Stop::Erased);
        }
        let Some(item) = item else {
            let last = std::mem::take(&mut self.buf);
            if !last.is_empty() && !self.hand(Piece::Chunk(Bytes::from(last))) {
                return false;
            }
            return self.hand(Piece::End);
        };
        (self.write_line)(&mut self.buf, &item);
        if self.buf.len() < CHUNK_BYTES {
            return true;
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK_BYTES)));
        self.hand(Piece::Chunk(chunk))
    }

    /// Waits for room in the channel (the back-pressure) on this blocking thread, at most
    /// the stall timeout, and no longer than the export may run.
    fn hand(&mut self, piece: Piece) -> bool {
        let stall = self.permit.stall_timeout();
        let ended = self.permit.ended().clone();
        let pieces = &self.pieces;
        let outcome = self.runtime.block_on(async {
            tokio::select! {
                sent = pieces.send(piece) => if sent.is_ok() { None } else { Some(Stop::Gone) },
                () = tokio::time::sleep(stall) => Some(Stop::Stalled),
                () = ended.cancelled() => Some(Stop::Erased),
            }
        });
        match outcome {
            None => true,
            Some(stop) => self.stopped(stop),
        }
    }

    fn stopped(&self, stop: Stop) -> bool {
        let tenant = self.permit.tenant();
        match stop {
            Stop::Gone => {}
            Stop::Stalled => tracing::warn!(
                %tenant, stall_timeout = ?self.permit.stall_timeout(),
                "export cut: the client took no data within server.stream_stall_timeout"
            ),
            Stop::Erased => tracing::warn!(%tenant, "export cut: its tenant was erased while it ran"),
        }
        false
    }
}

/// A sink for the store's walk and the response body it feeds. The permit is held until
/// the walk lets go of the sink.
pub(super) fn feed(permit: ExportPermit, write_line: LineWriter) -> (ExportSink, Body) {
    let (pieces, received) = mpsc::channel::<Piece>(CHUNKS_IN_FLIGHT);
    let mut feed =
        Feed { pieces, runtime: Handle::current(), permit, buf: Vec::with_capacity(CHUNK_BYTES), write_line };
    let sink: ExportSink = Box::new(move |item| feed.take(item));
    let stream = futures_util::stream::unfold(Some(received), |state| async move {
        let mut received = state?;
        match received.recv().await {
            Some(Piece::Chunk(chunk)) => Some((Ok(chunk), Some(received))),
            Some(Piece::End) => None,
            None => Some((Err(std::io::Error::other("the export stopped before its end")), None)),
        }
    });
    (sink, Body::from_stream(stream))
}
