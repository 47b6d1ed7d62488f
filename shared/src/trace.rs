//! W3C trace context through both services: what a caller sends in gRPC metadata, what is stored
//! with a run or an approval to carry the trace across a durable hop, and what goes out with a
//! call. Reading and writing `traceparent`/`tracestate` is the OpenTelemetry propagator's; while
//! spans are exported (see [`crate::otel`]) a hop's context is the span that made it, otherwise
//! the trace id is passed along with one new span id per hop, so log lines still join up.

use std::{
    fmt,
    sync::atomic::{AtomicBool, Ordering},
};

use opentelemetry::{
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState},
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    trace::{IdGenerator, RandomIdGenerator},
};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The gRPC metadata key (and event field) that carries the trace context.
pub const TRACEPARENT: &str = "traceparent";
/// The vendor part of the trace context, carried beside `traceparent` on calls (not stored).
pub const TRACESTATE: &str = "tracestate";

static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported over OTLP; the spans that exist only for the export are made only
/// then, so a service that exports nothing does no extra work.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

pub(crate) fn set_exporting() {
    EXPORTING.store(true, Ordering::Relaxed);
}

/// One span's place in a trace: trace id, span id, sampled flag (and, on calls, `tracestate`).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceContext(SpanContext);

impl TraceContext {
    /// A fresh trace (random ids, sampled), for work that arrived without a trace.
    pub fn new_root() -> Self {
        let ids = RandomIdGenerator::default();
        Self(SpanContext::new(
            ids.new_trace_id(),
            ids.new_span_id(),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        ))
    }

    /// The same trace with a new span id: the context of a hop this context caused.
    pub fn child(&self) -> Self {
        let c = &self.0;
        Self(SpanContext::new(
            c.trace_id(),
            RandomIdGenerator::default().new_span_id(),
            c.trace_flags(),
            true,
            c.trace_state().clone(),
        ))
    }

    /// Parses `00-<32 hex>-<16 hex>-<2 hex>` (later versions: their first four fields). Anything
    /// else (upper-case hex, all-zero ids, short fields) is `None`: the W3C rules say to ignore an
    /// invalid header and start over.
    pub fn parse(text: &str) -> Option<Self> {
        Self::extract(&One(text.trim()))
    }

    /// Reads `traceparent` (and `tracestate`) from a gRPC request's metadata, if valid.
    pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Option<Self> {
        Self::extract(&Metadata(metadata))
    }

    /// Reads `traceparent` (and `tracestate`) from HTTP/2 headers, if valid.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<Self> {
        Self::extract(&Headers(headers))
    }

    fn extract(carrier: &dyn Extractor) -> Option<Self> {
        // The propagator reads ids of any length up to theirs; the spec wants them exact.
        let fields: Vec<&str> = carrier.get(TRACEPARENT)?.trim().split('-').collect();
        match fields.as_slice() {
            [v, t, s, f, ..] if v.len() == 2 && t.len() == 32 && s.len() == 16 && f.len() == 2 => {}
            _ => return None,
        }
        let cx = TraceContextPropagator::new().extract(carrier);
        let span = cx.span().span_context().clone();
        span.is_valid().then_some(Self(span))
    }

    /// The trace id as 32 lower-case hex digits (what log lines carry as `trace_id`).
    pub fn trace_id(&self) -> String {
        self.0.trace_id().to_string()
    }

    pub fn span_id(&self) -> String {
        self.0.span_id().to_string()
    }

    /// The OpenTelemetry span context.
    pub fn span_context(&self) -> &SpanContext {
        &self.0
    }

    /// Sets this context as the `traceparent` (and `tracestate`) metadata of an outgoing call.
    pub fn inject<T>(&self, request: &mut tonic::Request<T>) {
        let cx = opentelemetry::Context::new().with_remote_span_context(self.0.clone());
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataMut(request.metadata_mut()));
    }

    /// The context of a `tracing` span while spans are exported (`None` otherwise, or for a
    /// span no layer records).
    pub fn of_span(span: &tracing::Span) -> Option<Self> {
        if !exporting() {
            return None;
        }
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        (sc.is_valid() && sc.trace_id() != TraceId::INVALID && sc.span_id() != SpanId::INVALID)
            .then_some(Self(sc))
    }

    /// The context a hop made in `span` hands on: the span itself while spans are exported, else
    /// `parent`'s trace with a new span id (a new trace without one).
    pub fn hop(span: &tracing::Span, parent: Option<&Self>) -> Self {
        Self::of_span(span).unwrap_or_else(|| parent.map_or_else(Self::new_root, Self::child))
    }
}

/// Makes `parent` the parent of `span` while spans are exported; call it before the span is
/// first entered. Without export (or a parent) the span stays where it is.
pub fn adopt(span: &tracing::Span, parent: Option<&TraceContext>) {
    if let (true, Some(parent)) = (exporting(), parent) {
        let cx = opentelemetry::Context::new().with_remote_span_context(parent.0.clone());
        // Fails only for a span that was entered already or is disabled: it then keeps its place.
        let _ = span.set_parent(cx);
    }
}

/// Links `span` to `to` (a span that led to it without being its parent) while spans are
/// exported.
pub fn link(span: &tracing::Span, to: Option<&TraceContext>) {
    if let (true, Some(to)) = (exporting(), to) {
        span.add_link(to.0.clone());
    }
}

impl fmt::Display for TraceContext {
    /// The `traceparent` form, as stored and sent.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // What the propagator injects (version 00), written without its map: events are
        // stamped with it on every step, exported or not.
        let c = &self.0;
        write!(
            f,
            "00-{}-{}-{:02x}",
            c.trace_id(),
            c.span_id(),
            c.trace_flags().to_u8() & TraceFlags::SAMPLED.to_u8()
        )
    }
}

/// The trace id of a `traceparent` string, or `""` when it is empty or invalid.
pub fn trace_id_of(traceparent: &str) -> String {
    TraceContext::parse(traceparent)
        .map(|c| c.trace_id())
        .unwrap_or_default()
}

/// A stored `traceparent` on its own.
struct One<'a>(&'a str);

impl Extractor for One<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == TRACEPARENT).then_some(self.0)
    }
    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT]
    }
}

struct Metadata<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

struct Headers<'a>(&'a http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

struct MetadataMut<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn round_trips_the_spec_example() {
        let ctx = TraceContext::parse(EXAMPLE).unwrap();
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id(), "00f067aa0ba902b7");
        assert_eq!(ctx.to_string(), EXAMPLE);
    }

    #[test]
    fn a_child_keeps_the_trace_and_changes_the_span() {
        let ctx = TraceContext::parse(EXAMPLE).unwrap();
        let child = ctx.child();
        assert_eq!(child.trace_id(), ctx.trace_id());
        assert_ne!(child.span_id(), ctx.span_id());
        assert_eq!(TraceContext::parse(&child.to_string()), Some(child));
    }

    #[test]
    fn invalid_headers_are_ignored() {
        for bad in [
            "",
            "00",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1g",
            "00-d1-01",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
        assert_eq!(trace_id_of("garbage"), "");
    }

    #[test]
    fn later_versions_are_read_by_their_first_fields() {
        let ctx =
            TraceContext::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later")
                .unwrap();
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    }

    #[test]
    fn roots_are_valid_and_distinct() {
        let a = TraceContext::new_root();
        let b = TraceContext::new_root();
        assert_ne!(a.trace_id(), b.trace_id());
        assert_eq!(TraceContext::parse(&a.to_string()), Some(a));
    }

    #[test]
    fn written_as_the_propagator_writes_it() {
        let ctx = TraceContext::new_root().child();
        let cx = opentelemetry::Context::new().with_remote_span_context(ctx.0.clone());
        let mut out = std::collections::HashMap::new();
        TraceContextPropagator::new().inject_context(&cx, &mut out);
        assert_eq!(out[TRACEPARENT], ctx.to_string());
    }

    #[test]
    fn metadata_round_trips_with_tracestate() {
        let mut request = tonic::Request::new(());
        request
            .metadata_mut()
            .insert(TRACEPARENT, EXAMPLE.parse().unwrap());
        request
            .metadata_mut()
            .insert(TRACESTATE, "vendor=x".parse().unwrap());
        let ctx = TraceContext::from_metadata(request.metadata()).unwrap();
        let mut out = tonic::Request::new(());
        ctx.inject(&mut out);
        assert_eq!(out.metadata().get(TRACEPARENT).unwrap(), EXAMPLE);
        assert_eq!(out.metadata().get(TRACESTATE).unwrap(), "vendor=x");
    }
}
