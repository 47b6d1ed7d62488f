//! An OTLP/gRPC trace collector for tests and the bench: the services export to it as to any
//! collector, and it keeps every span with its service's resource attributes and counts the
//! connections made to it.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, KeyValue, any_value::Value},
    trace::v1::Span,
};
use tokio_stream::StreamExt;

/// One received span, with what a test asks of it.
#[derive(Debug, Clone)]
pub struct Received {
    pub span: Span,
    /// The resource attributes of the service that exported it.
    pub resource: HashMap<String, String>,
}

impl Received {
    pub fn name(&self) -> &str {
        &self.span.name
    }
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }
    /// `""` for a root span.
    pub fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }
    pub fn service(&self) -> &str {
        self.resource
            .get("service.name")
            .map(String::as_str)
            .unwrap_or("")
    }
    /// A string attribute of the span (`""`: none).
    pub fn attr(&self, key: &str) -> String {
        self.span
            .attributes
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| text(kv.value.as_ref()))
            .unwrap_or_default()
    }
}

/// The collector, serving on a loopback port until dropped.
pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Received>>>,
    received: Arc<AtomicU64>,
    exports: Arc<AtomicU64>,
    connections: Arc<AtomicU64>,
    server: tokio::task::JoinHandle<()>,
}

impl Collector {
    /// Starts a collector on a free loopback port.
    pub async fn start() -> Collector {
        Self::start_on("127.0.0.1:0").await
    }

    /// Starts a collector on `addr` (panics, naming the address, when it cannot be bound).
    pub async fn start_on(addr: &str) -> Collector {
        Self::serve(addr, true).await
    }

    /// A collector that only counts the spans it receives (a bench's millions would not fit).
    pub async fn counting() -> Collector {
        Self::serve("127.0.0.1:0", false).await
    }

    async fn serve(addr: &str, keep: bool) -> Collector {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("cannot bind the test OTLP collector on {addr}: {e}"));
        let addr = listener.local_addr().expect("local addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let received = Arc::new(AtomicU64::new(0));
        let exports = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let service = Sink {
            spans: spans.clone(),
            received: received.clone(),
            exports: exports.clone(),
            keep,
        };
        let counted = connections.clone();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |c| {
            counted.fetch_add(1, Ordering::SeqCst);
            c
        });
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(service))
                .serve_with_incoming(incoming)
                .await;
        });
        Collector {
            addr,
            spans,
            received,
            exports,
            connections,
            server,
        }
    }

    /// The endpoint to give a service (`--otlp-endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Received> {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many spans were received so far (kept or not).
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }

    /// Export calls received so far.
    pub fn exports(&self) -> u64 {
        self.exports.load(Ordering::SeqCst)
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    /// Forgets the spans received so far.
    pub fn clear(&self) {
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.server.abort();
    }
}

struct Sink {
    spans: Arc<Mutex<Vec<Received>>>,
    received: Arc<AtomicU64>,
    exports: Arc<AtomicU64>,
    keep: bool,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.exports.fetch_add(1, Ordering::SeqCst);
        let request = request.into_inner();
        let count = request
            .resource_spans
            .iter()
            .flat_map(|rs| &rs.scope_spans)
            .map(|ss| ss.spans.len() as u64)
            .sum();
        self.received.fetch_add(count, Ordering::SeqCst);
        if !self.keep {
            return Ok(tonic::Response::new(ExportTraceServiceResponse::default()));
        }
        let mut received = Vec::new();
        for rs in request.resource_spans {
            let resource: HashMap<String, String> = rs
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default()
                .iter()
                .map(|KeyValue { key, value, .. }| (key.clone(), text(value.as_ref())))
                .collect();
            for ss in rs.scope_spans {
                received.extend(ss.spans.into_iter().map(|span| Received {
                    span,
                    resource: resource.clone(),
                }));
            }
        }
        self.spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
