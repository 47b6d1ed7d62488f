//! The Prometheus side both services share: the `--metrics-listen` setting, a collector for
//! values computed at scrape time (read from the store or from counters the code already keeps), and
//! a tiny HTTP/1.1 server that answers `GET /metrics` in the OpenMetrics text format.
//!
//! The endpoint runs on its own port so a mesh or a NetworkPolicy can expose it to the monitoring
//! namespace without exposing the gRPC port, and so a slow scrape never queues behind RPCs.

use std::{
    convert::Infallible, fmt, future::Future, net::SocketAddr, str::FromStr, sync::Arc,
    time::Duration,
};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};

/// The content type of the OpenMetrics text exposition Prometheus negotiates.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where `/metrics` is served: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsListen(pub Option<SocketAddr>);

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim().eq_ignore_ascii_case("off") {
            return Ok(Self(None));
        }
        s.trim()
            .parse()
            .map(|a| Self(Some(a)))
            .map_err(|e| format!("expected HOST:PORT or 'off', got {s:?}: {e}"))
    }
}

impl fmt::Display for MetricsListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("off"),
        }
    }
}

/// Values one scrape reports, grouped into families by name.
#[derive(Debug, Default)]
pub struct Samples {
    families: Vec<Family>,
}

#[derive(Debug)]
struct Family {
    name: String,
    help: String,
    kind: MetricType,
    points: Vec<(Vec<(String, String)>, Value)>,
}

#[derive(Debug, Clone, Copy)]
enum Value {
    Gauge(f64),
    Counter(u64),
}

impl Samples {
    /// A gauge sample; samples of one family must share the label names.
    pub fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.push(name, help, MetricType::Gauge, labels, Value::Gauge(value));
    }

    /// A counter sample (`_total` is appended to the name on the wire).
    pub fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: u64) {
        self.push(
            name,
            help,
            MetricType::Counter,
            labels,
            Value::Counter(value),
        );
    }

    fn push(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        labels: &[(&str, &str)],
        value: Value,
    ) {
        let labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match self.families.iter_mut().find(|f| f.name == name) {
            Some(f) => f.points.push((labels, value)),
            None => self.families.push(Family {
                name: name.to_string(),
                help: help.to_string(),
                kind,
                points: vec![(labels, value)],
            }),
        }
    }
}

type Sampler = dyn Fn(&mut Samples) + Send + Sync;

/// A collector whose values a closure computes on every scrape.
pub struct ScrapeCollector(Box<Sampler>);

impl ScrapeCollector {
    pub fn new(f: impl Fn(&mut Samples) + Send + Sync + 'static) -> Self {
        Self(Box::new(f))
    }
}

impl fmt::Debug for ScrapeCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ScrapeCollector")
    }
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut samples = Samples::default();
        (self.0)(&mut samples);
        for family in &samples.families {
            let mut metric =
                encoder.encode_descriptor(&family.name, &family.help, None, family.kind)?;
            for (labels, value) in &family.points {
                let point = metric.encode_family(labels)?;
                match *value {
                    Value::Gauge(v) => ConstGauge::new(v).encode(point)?,
                    Value::Counter(v) => ConstCounter::new(v).encode(point)?,
                }
            }
        }
        Ok(())
    }
}

/// The registry as OpenMetrics text.
pub fn render(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// Binds the metrics listener (`None` when off), so a busy port fails start-up at once.
pub async fn bind(listen: MetricsListen) -> std::io::Result<Option<tokio::net::TcpListener>> {
    match listen.0 {
        Some(addr) => Ok(Some(tokio::net::TcpListener::bind(addr).await?)),
        None => Ok(None),
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    tracing::info!(addr = ?listener.local_addr().ok(), "metrics endpoint serving /metrics");
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "metrics endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let registry = registry.clone();
                async move { Ok::<_, Infallible>(respond(registry, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn respond<B>(registry: Arc<Registry>, req: Request<B>) -> Response<Full<Bytes>> {
    if req.uri().path() != "/metrics" {
        return plain(StatusCode::NOT_FOUND, "not found: try /metrics\n");
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "GET /metrics\n");
    }
    // Scrape-time collectors read the store; keep that off the async workers.
    match tokio::task::spawn_blocking(move || render(&registry)).await {
        Ok(Ok(text)) => Response::builder()
            .header(hyper::header::CONTENT_TYPE, CONTENT_TYPE)
            .body(Full::new(Bytes::from(text)))
            .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "")),
        _ => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics could not be encoded\n",
        ),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *resp.status_mut() = status;
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_setting_parses_addresses_and_off() {
        assert_eq!("off".parse::<MetricsListen>().unwrap(), MetricsListen(None));
        assert_eq!("OFF".parse::<MetricsListen>().unwrap(), MetricsListen(None));
        let on: MetricsListen = "127.0.0.1:9464".parse().unwrap();
        assert_eq!(on.to_string(), "127.0.0.1:9464");
        assert!("9464".parse::<MetricsListen>().is_err());
    }

    #[test]
    fn scrape_collector_renders_families_with_labels() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ScrapeCollector::new(|s| {
            s.gauge(
                "arbor_things",
                "Things by colour.",
                &[("colour", "red")],
                2.0,
            );
            s.gauge(
                "arbor_things",
                "Things by colour.",
                &[("colour", "blue")],
                0.0,
            );
            s.counter("arbor_events", "Events seen.", &[], 7);
        })));
        let text = render(&registry).unwrap();
        assert!(text.contains("# TYPE arbor_things gauge"), "{text}");
        assert!(text.contains("arbor_things{colour=\"red\"} 2"), "{text}");
        assert!(text.contains("arbor_things{colour=\"blue\"} 0"), "{text}");
        assert!(text.contains("# TYPE arbor_events counter"), "{text}");
        assert!(text.contains("arbor_events_total 7"), "{text}");
        assert!(text.trim_end().ends_with("# EOF"), "{text}");
    }

    #[tokio::test]
    async fn serves_metrics_over_http() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ScrapeCollector::new(|s| {
            s.gauge("arbor_up", "Always one.", &[], 1.0);
        })));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = tokio_util_free_stop();
        let server = tokio::spawn(serve(listener, Arc::new(registry), stop.1));
        let get = |path: &'static str| async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(
                format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("arbor_up 1"), "{ok}");
        assert!(ok.contains("openmetrics-text"), "{ok}");
        assert!(get("/other").await.starts_with("HTTP/1.1 404"));
        let _ = stop.0.send(());
        server.await.unwrap();
    }

    fn tokio_util_free_stop() -> (
        tokio::sync::oneshot::Sender<()>,
        impl Future<Output = ()> + Send + 'static,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        (tx, async move {
            let _ = rx.await;
        })
    }
}
