//! Which trace a span belongs to, derived from what it is about, so that work on one
//! extraction done by different tasks, hours apart or across restarts, lands in one trace.
//!
//! An extraction's trace id is the first 16 bytes of its identity, and its root span id the
//! next 8; a batch's come from a blake3 hash of its batch key the same way. Spans here are
//! `tracing` spans of target [`TARGET`]: nothing but the OpenTelemetry layer
//! (`app::telemetry`) listens to that target, so with export off they cost a disabled
//! callsite. The one span of each trace that stands for the root (an extraction's first
//! intake, a batch's formation) is marked [`ROOT_FIELD`]; the exporter gives it the
//! derived root span id, which every other span of the trace names as its parent.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::identity::ExtractionId;
use super::names::BatchKey;

/// The target of every span exported as a trace.
pub const TARGET: &str = "commitpoint::trace";
/// A boolean field: this span is its trace's root (recorded once it is known to be the first).
pub const ROOT_FIELD: &str = "commitpoint.root";

/// The trace and root span of one extraction or one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRoot {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl TraceRoot {
    pub fn of_extraction(id: &ExtractionId) -> Self {
        Self::from_bytes(id.as_bytes())
    }

    pub fn of_batch(key: &BatchKey) -> Self {
        Self::from_bytes(blake3::hash(key.as_str().as_bytes()).as_bytes())
    }

    fn from_bytes(bytes: &[u8; 32]) -> Self {
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        trace_id.copy_from_slice(&bytes[..16]);
        span_id.copy_from_slice(&bytes[16..24]);
        // An all-zero id is invalid in OpenTelemetry; blake3 will not give one in practice,
        // but a fixed byte keeps the ids valid by construction.
        if trace_id == [0; 16] {
            trace_id[15] = 1;
        }
        if span_id == [0; 8] {
            span_id[7] = 1;
        }
        Self { trace_id, span_id }
    }

    /// The root as a remote parent: sampled, since the choice to trace was made by turning
    /// export on.
    pub fn span_context(&self) -> SpanContext {
        SpanContext::new(
            TraceId::from_bytes(self.trace_id),
            SpanId::from_bytes(self.span_id),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        )
    }

    /// Puts `span` into this trace, as a child of its root. Call it before the span is
    /// entered; without the OpenTelemetry layer it does nothing.
    pub fn adopt(&self, span: &tracing::Span) {
        // With export off every trace span is disabled: build no context on the intake path.
        if span.is_disabled() {
            return;
        }
        let parent = opentelemetry::Context::new().with_remote_span_context(self.span_context());
        // Refused only when no layer records the span (export off, or filtered): nothing to do.
        let _ = span.set_parent(parent);
    }
}

/// Links `span` to `other` (e.g. a member's span to the batch call it was part of).
pub fn link(span: &tracing::Span, other: &tracing::Span) {
    if span.is_disabled() || other.is_disabled() {
        return;
    }
    let context = other.context();
    let target = context.span().span_context().clone();
    if target.is_valid() {
        span.add_link(target);
    }
}

/// Links `span` to an extraction's root (a batch call to one of its members).
pub fn link_root(span: &tracing::Span, root: &TraceRoot) {
    span.add_link(root.span_context());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extraction_trace_is_its_identity_prefix() {
        let id = ExtractionId::compute("t", "s", &crate::domain::identity::SourceHash::compute(b"x", "a@1"), "a@1");
        let root = TraceRoot::of_extraction(&id);
        assert_eq!(&root.trace_id[..], &id.as_bytes()[..16]);
        assert_eq!(&root.span_id[..], &id.as_bytes()[16..24]);
        assert_eq!(root.span_context().trace_id().to_string(), id.to_hex()[..32]);
    }

    #[test]
    fn batches_get_distinct_stable_traces() {
        let a = TraceRoot::of_batch(&BatchKey::from("sim-a-1"));
        assert_eq!(a, TraceRoot::of_batch(&BatchKey::from("sim-a-1")));
        assert_ne!(a.trace_id, TraceRoot::of_batch(&BatchKey::from("sim-a-2")).trace_id);
    }
}
