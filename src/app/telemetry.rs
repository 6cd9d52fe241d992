//! OpenTelemetry trace export (`[telemetry] otlp_endpoint`): the `tracing` spans of target
//! `domain::trace::TARGET` become OTLP/HTTP protobuf requests to a collector, batched by the
//! SDK's processor on our tokio runtime, flushed when `serve` stops.
//!
//! Which trace a span is in was set when it was created (`domain::trace`); what is left here
//! is the root. OpenTelemetry's SDK draws every span id at random, so the span marked as its
//! trace's root is given the derived root id on its way out, which the trace's other spans
//! already name as their parent.

use std::time::Duration;

use opentelemetry::Value;
use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, SpanData, SpanExporter};
use tracing_subscriber::Registry;
use tracing_subscriber::filter::{Filtered, Targets};
use tracing_subscriber::layer::Layer;

use super::config::TelemetryOptions;
use crate::domain::trace::{ROOT_FIELD, TARGET};

/// How long a graceful stop waits for the last spans to reach the collector.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// Each export request's deadline: a collector that does not answer costs spans, not the
/// scheduler's time (the processor's queue is bounded and drops when full).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The layer that hands spans to the SDK; it sees only the trace target.
pub(crate) type TraceLayer =
    Filtered<tracing_opentelemetry::OpenTelemetryLayer<Registry, SdkTracer>, Targets, Registry>;

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("telemetry.otlp_endpoint: cannot build the OTLP exporter")]
    Build(#[source] opentelemetry_otlp::ExporterBuildError),
}

/// A running export: the layer to install and the provider to shut down.
#[derive(Debug)]
pub(crate) struct Export {
    provider: SdkTracerProvider,
}

impl Export {
    /// Starts the export if the options ask for one. Must run inside the tokio runtime: the
    /// batch processor's task is spawned on it.
    pub(crate) fn start(options: &TelemetryOptions) -> Result<Option<Self>, Error> {
        let Some(url) = &options.traces_url else {
            return Ok(None);
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.as_str())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(Error::Build)?;
        let processor = BatchSpanProcessor::builder(Rooted(exporter), opentelemetry_sdk::runtime::Tokio).build();
        let resource = Resource::builder().with_service_name(options.service_name.clone()).build();
        let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();
        Ok(Some(Self { provider }))
    }

    pub(crate) fn layer(&self) -> TraceLayer {
        let tracer = self.provider.tracer("commitpoint");
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            // Source paths, thread ids and levels say nothing an operator navigates by.
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE))
    }

    /// Sends what is still queued and stops the processor, waiting [`SHUTDOWN_WAIT`] at most.
    pub(crate) async fn shutdown(self) {
        // The SDK's shutdown blocks until its task answers, so it runs off the runtime's workers.
        let provider = self.provider;
        let stop = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_WAIT));
        match tokio::time::timeout(SHUTDOWN_WAIT, stop).await {
            Ok(Ok(Ok(()))) => tracing::info!("trace export flushed"),
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "trace export did not flush cleanly"),
            Ok(Err(e)) => tracing::warn!(error = %e, "trace export shutdown failed"),
            Err(_) => tracing::warn!("trace export did not flush in time; the last spans are lost"),
        }
    }
}

/// Gives each span marked as its trace's root the root span id the trace's other spans
/// point at, and takes the mark off.
#[derive(Debug)]
struct Rooted<E>(E);

impl<E: SpanExporter> SpanExporter for Rooted<E> {
    async fn export(&self, mut batch: Vec<SpanData>) -> OTelSdkResult {
        batch.iter_mut().for_each(root);
        self.0.export(batch).await
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

fn root(span: &mut SpanData) {
    let Some(at) = span.attributes.iter().position(|kv| kv.key.as_str() == ROOT_FIELD) else {
        return;
    };
    let marked = matches!(span.attributes.remove(at).value, Value::Bool(true));
    // Only a span already placed under its trace's derived root (`TraceRoot::adopt`) is moved.
    if !marked || !span.parent_span_is_remote || span.parent_span_id == SpanId::INVALID {
        return;
    }
    let context = &span.span_context;
    span.span_context = SpanContext::new(
        context.trace_id(),
        span.parent_span_id,
        context.trace_flags() | TraceFlags::SAMPLED,
        false,
        context.trace_state().clone(),
    );
    span.parent_span_id = SpanId::INVALID;
    span.parent_span_is_remote = false;
}

/// The attribute the root mark is recorded as (for tests that build spans by hand).
#[cfg(test)]
fn root_mark(value: bool) -> opentelemetry::KeyValue {
    opentelemetry::KeyValue::new(ROOT_FIELD, value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{SpanKind, Status, TraceId, TraceState};
    use opentelemetry::{InstrumentationScope, KeyValue};

    fn span(parent: SpanId, remote: bool, attributes: Vec<KeyValue>) -> SpanData {
        SpanData {
            span_context: SpanContext::new(
                TraceId::from_bytes([7; 16]),
                SpanId::from_bytes([9; 8]),
                TraceFlags::SAMPLED,
                false,
                TraceState::default(),
            ),
            parent_span_id: parent,
            parent_span_is_remote: remote,
            span_kind: SpanKind::Internal,
            name: "intake".into(),
            start_time: std::time::UNIX_EPOCH,
            end_time: std::time::UNIX_EPOCH,
            attributes,
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: Status::Unset,
            instrumentation_scope: InstrumentationScope::builder("t").build(),
        }
    }

    #[test]
    fn a_marked_span_becomes_the_root_its_trace_points_at() {
        let derived = SpanId::from_bytes([3; 8]);
        let mut data = span(derived, true, vec![KeyValue::new("tenant", "a"), root_mark(true)]);
        root(&mut data);
        assert_eq!(data.span_context.span_id(), derived);
        assert_eq!(data.span_context.trace_id(), TraceId::from_bytes([7; 16]));
        assert_eq!(data.parent_span_id, SpanId::INVALID);
        assert_eq!(data.attributes, vec![KeyValue::new("tenant", "a")]);
    }

    #[test]
    fn unmarked_or_false_or_local_spans_keep_their_ids() {
        for (mark, remote) in [(None, true), (Some(false), true), (Some(true), false)] {
            let parent = SpanId::from_bytes([3; 8]);
            let mut data = span(parent, remote, mark.map(root_mark).into_iter().collect());
            root(&mut data);
            assert_eq!(data.span_context.span_id(), SpanId::from_bytes([9; 8]), "{mark:?} {remote}");
            assert_eq!(data.parent_span_id, parent);
            assert!(data.attributes.is_empty());
        }
    }
}
