//! OpenTelemetry export: when an OTLP endpoint is configured, the `tracing` spans both services
//! make are also exported over OTLP/gRPC (batched, flushed on a clean shutdown), and each RPC gets
//! a server span whose parent is the caller's `traceparent`. Without an endpoint no layer is
//! installed and no RPC span is made: nothing is exported and nothing extra runs.

use std::task::{Context, Poll};

use futures_util::future::Either;
use opentelemetry::{KeyValue, trace::TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::{
    Resource,
    resource::{EnvResourceDetector, ResourceDetector, TelemetryResourceDetector},
    trace::SdkTracerProvider,
};
use tracing::Instrument;
use tracing_subscriber::{Layer, Registry, layer::SubscriberExt, util::SubscriberInitExt};

use crate::trace::{TraceContext, adopt};

/// Where and as what a service exports its spans.
#[derive(Debug, Clone)]
pub struct Export {
    /// `--otlp-endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT` (both: an OTLP/gRPC address such as
    /// `http://localhost:4317`); `None` with neither, unless the traces-only variable is set.
    pub endpoint: Option<String>,
    /// `service.name` unless `OTEL_SERVICE_NAME` (or `service.name` in
    /// `OTEL_RESOURCE_ATTRIBUTES`) says otherwise.
    pub service: &'static str,
    /// `service.version`.
    pub version: &'static str,
}

impl Export {
    /// Whether anything is to be exported: an endpoint is given (the flag, the general or the
    /// traces variable) and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`.
    pub fn enabled(&self) -> bool {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let endpoint = self
            .endpoint
            .as_deref()
            .is_some_and(|e| !e.trim().is_empty())
            || var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some();
        let disabled = var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        endpoint && !disabled
    }

    /// The resource every span is exported with: the service's name, version and a new instance
    /// id, overridden by what the standard variables say.
    pub fn resource(&self) -> Resource {
        let detected = EnvResourceDetector::new().detect();
        let mut builder = Resource::builder_empty()
            .with_attributes([
                KeyValue::new("service.name", self.service),
                KeyValue::new("service.version", self.version),
                KeyValue::new("service.instance.id", uuid::Uuid::new_v4().to_string()),
            ])
            .with_detectors(&[Box::new(TelemetryResourceDetector)])
            .with_attributes(
                detected
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            );
        if let Some(name) = std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|n| !n.is_empty())
        {
            builder = builder.with_service_name(name);
        }
        builder.build()
    }
}

/// Keeps the exporter alive; [`Telemetry::shutdown`] exports what is batched (dropping it
/// stops the exporter too).
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still batched and stops the exporter (bounded by the SDK's timeouts).
    /// The SDK waits for its export thread, whose gRPC calls run on this runtime: the wait is
    /// on a blocking thread, so the runtime's own threads stay free to carry them.
    pub async fn shutdown(&mut self) {
        if let Some(provider) = self.provider.take() {
            let done = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(e)) = done {
                tracing::warn!("exporting the last spans failed: {e}");
            }
        }
    }
}

/// Initialises the global tracing subscriber (`RUST_LOG` filter, `info` by default; with `json`
/// every line is one JSON object whose `spans` carry fields such as `trace_id`), exporting spans
/// (those at `info` and above) over OTLP as `export` says. Call it inside the Tokio runtime (the
/// gRPC exporter needs one).
pub fn init_tracing(json: bool, export: Option<&Export>) -> Result<Telemetry, String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour codes only for a person at a terminal; in files and collectors they are noise.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let Some(export) = export.filter(|e| e.enabled()) else {
        // Nothing exported: one global filter, so a span `RUST_LOG` leaves out is never made
        // (a per-layer filter still has the registry track every span it turns away).
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(ansi)
            .with_writer(std::io::stderr);
        let _ = match json {
            true => builder.json().try_init(),
            false => builder.try_init(),
        };
        return Ok(Telemetry::default());
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    // `RUST_LOG` says what is logged; what is exported does not follow it (a service that logs
    // only warnings still exports its spans).
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
    if let Some(endpoint) = export.endpoint.as_deref().filter(|e| !e.trim().is_empty()) {
        exporter = exporter.with_endpoint(endpoint);
    }
    let exporter = exporter
        .build()
        .map_err(|e| format!("cannot set up the OTLP exporter: {e}"))?;
    // The sampler, span limits and batch sizes come from the standard variables.
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(export.resource())
        .build();
    let tracer = provider.tracer("arbor");
    let layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![
        match json {
            true => fmt.json().with_filter(filter).boxed(),
            false => fmt.with_filter(filter).boxed(),
        },
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
            .boxed(),
    ];
    crate::trace::set_exporting();
    // A second initialisation (tests) keeps the first subscriber.
    let _ = Registry::default().with(layers).try_init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// A tower layer giving each API call a server span named after its method, whose parent is the
/// caller's `traceparent`, while spans are exported; otherwise calls pass straight through.
/// Health and reflection calls get none (they are polled, and say nothing of the work).
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcSpanLayer;

impl<S> tower::Layer<S> for RpcSpanLayer {
    type Service = RpcSpan<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RpcSpan { inner }
    }
}

#[derive(Debug, Clone)]
pub struct RpcSpan<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for RpcSpan<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    // No allocation and no span when nothing is exported: the call's own future as it is.
    type Future = Either<S::Future, tracing::instrument::Instrumented<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match rpc_span(&req) {
            None => Either::Left(self.inner.call(req)),
            Some(span) => Either::Right(self.inner.call(req).instrument(span)),
        }
    }
}

/// The server span of one call (`None`: none is made for it).
fn rpc_span<B>(req: &http::Request<B>) -> Option<tracing::Span> {
    if !crate::trace::exporting() {
        return None;
    }
    let path = req.uri().path().trim_start_matches('/');
    let (service, method) = path.split_once('/')?;
    if service.starts_with("grpc.") {
        return None;
    }
    let span = tracing::info_span!(
        "rpc",
        otel.name = method,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method
    );
    adopt(&span, TraceContext::from_headers(req.headers()).as_ref());
    Some(span)
}
