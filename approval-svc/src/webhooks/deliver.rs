//! The leader's delivery of webhook messages: one task per endpoint sends that endpoint's
//! messages oldest first, each with the Standard Webhooks headers, and deletes a message from
//! the outbox once the endpoint answered 2xx. Any other answer, no answer within the timeout
//! or no connection retries the same message (same `webhook-id`, new timestamp and signature)
//! after a capped exponential backoff with jitter, kept per endpoint, so a dead endpoint holds
//! up only its own messages. Deciding never waits for any of this: messages are queued in the
//! decision's own transaction and sent afterwards. Failures are logged rate-limited.

use std::{sync::Arc, time::Duration};

use http::{HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, sync::broadcast, task::JoinHandle};
use tokio_util::sync::CancellationToken;

use super::config::{Endpoint, Retry, WebhookConfig};
use crate::{
    metrics::{EndpointLabels, Metrics, WebhookLabels},
    model::Approval,
    ratelog::RateLimitedLog,
    runner::backoff::Backoff,
    store::{ApprovalStore, webhooks::Queued},
};

/// Messages read from the outbox at a time.
const PAGE: usize = 32;
/// How often an idle endpoint's queue is looked at without being woken (another replica's
/// change, a wake-up missed).
const IDLE_LOOK: Duration = Duration::from_secs(1);
/// A failure of one kind at one endpoint is logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Starts one delivery task per endpoint of `cfg`, until `shutdown`; `changes` wakes them.
pub fn start<S: ApprovalStore>(
    store: Arc<S>,
    metrics: Arc<Metrics>,
    cfg: &WebhookConfig,
    changes: impl Fn() -> broadcast::Receiver<Approval>,
    shutdown: CancellationToken,
) -> Vec<JoinHandle<()>> {
    cfg.endpoints
        .iter()
        .map(|endpoint| {
            tokio::spawn(
                EndpointDelivery {
                    store: store.clone(),
                    metrics: metrics.clone(),
                    endpoint: endpoint.clone(),
                    retry: cfg.retry.clone(),
                    changes: changes(),
                    shutdown: shutdown.clone(),
                    log: RateLimitedLog::new(LOG_EVERY),
                }
                .run(),
            )
        })
        .collect()
}

struct EndpointDelivery<S> {
    store: Arc<S>,
    metrics: Arc<Metrics>,
    endpoint: Arc<Endpoint>,
    retry: Retry,
    changes: broadcast::Receiver<Approval>,
    shutdown: CancellationToken,
    log: RateLimitedLog,
}

/// Why a delivery failed, as the metric's `outcome` tells it.
#[derive(Debug)]
enum Failure {
    /// The endpoint answered, not 2xx.
    Rejected(StatusCode),
    /// No answer: no connection, a broken one, or the timeout.
    Failed(String),
}

impl<S: ApprovalStore> EndpointDelivery<S> {
    async fn run(mut self) {
        let name = self.endpoint.name.clone();
        let mut backoff = Backoff::new(self.retry.min, self.retry.max);
        tracing::info!(endpoint = %name, "delivering webhooks");
        // Every outcome is exported from the start, so rate() and absent() behave.
        for outcome in ["delivered", "rejected", "failed"] {
            let _ = self
                .metrics
                .webhook_deliveries
                .get_or_create(&WebhookLabels {
                    endpoint: name.clone(),
                    outcome,
                });
        }
        while !self.shutdown.is_cancelled() {
            let page = match self.store.webhook_page(&name, PAGE) {
                Ok(page) => page,
                Err(e) => {
                    self.logged("outbox", || format!("cannot read the webhook outbox: {e}"));
                    if !self.pause(backoff.next_delay()).await {
                        break;
                    }
                    continue;
                }
            };
            // Counted once a page (and after a failure, when new messages may have come), and
            // counted down as messages go: a count per message would read a long backlog over
            // and over while it drains.
            let mut backlog = self.show_backlog();
            if page.is_empty() {
                self.idle().await;
                continue;
            }
            for queued in page {
                loop {
                    let outcome = self.send(&queued.message).await;
                    let label = match &outcome {
                        Ok(()) => "delivered",
                        Err(Failure::Rejected(_)) => "rejected",
                        Err(Failure::Failed(_)) => "failed",
                    };
                    self.count(label);
                    match outcome {
                        Ok(()) => {
                            backoff.reset();
                            if let Err(e) = self.store.webhook_delivered(&name, queued.seq) {
                                // Sent again later: the receiver deduplicates by webhook-id.
                                self.logged("outbox", || {
                                    format!("cannot remove a delivered webhook: {e}")
                                });
                            }
                            break;
                        }
                        Err(failure) => {
                            let (kind, why) = match failure {
                                Failure::Rejected(s) => (s.to_string(), format!("answered {s}")),
                                Failure::Failed(why) => ("failed".to_string(), why),
                            };
                            self.logged(&kind, || {
                                format!("webhook {} not delivered: {why}", queued.message.id)
                            });
                            backlog = self.show_backlog();
                            if !self.pause(backoff.next_delay()).await {
                                return self.stopped();
                            }
                        }
                    }
                }
                backlog = backlog.map(|n| n.saturating_sub(1));
                if let Some(n) = backlog {
                    self.backlog_gauge()
                        .set(i64::try_from(n).unwrap_or(i64::MAX));
                }
                if self.shutdown.is_cancelled() {
                    break;
                }
            }
        }
        self.stopped()
    }

    /// Leaves the backlog to the next leader's count.
    fn stopped(&self) {
        self.backlog_gauge().set(0);
    }

    fn backlog_gauge(&self) -> prometheus_client::metrics::gauge::Gauge {
        self.metrics
            .webhook_backlog
            .get_or_create(&EndpointLabels {
                endpoint: self.endpoint.name.clone(),
            })
            .clone()
    }

    /// Counts the messages waiting and shows the count; `None` when they cannot be counted.
    fn show_backlog(&self) -> Option<u64> {
        let n = self.store.webhook_backlog(&self.endpoint.name).ok()?;
        self.backlog_gauge()
            .set(i64::try_from(n).unwrap_or(i64::MAX));
        Some(n)
    }

    fn count(&self, outcome: &'static str) {
        self.metrics
            .webhook_deliveries
            .get_or_create(&WebhookLabels {
                endpoint: self.endpoint.name.clone(),
                outcome,
            })
            .inc();
    }

    /// Logs a failure of kind `kind`, at most once per `LOG_EVERY` with how many were passed
    /// over; never the secret, the payload or the URL (some services put a token in it).
    fn logged(&self, kind: &str, message: impl FnOnce() -> String) {
        if let Some(passed_over) = self.log.admit(kind) {
            tracing::warn!(
                endpoint = %self.endpoint.name,
                passed_over,
                "{}",
                message()
            );
        }
    }

    /// Waits `delay`; false when shutting down.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            _ = self.shutdown.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }

    /// Waits for a change, `IDLE_LOOK` or shutdown.
    async fn idle(&mut self) {
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            _ = self.changes.recv() => {}
            _ = tokio::time::sleep(IDLE_LOOK) => {}
        }
    }

    /// One attempt: the message signed now, posted, the answer awaited up to the timeout.
    async fn send(&self, message: &Queued) -> Result<(), Failure> {
        let ts = arbor_shared::time::now_ms() / 1000;
        let signature = self.endpoint.secret.sign(&message.id, ts, &message.body);
        let request = build(&self.endpoint.url, message, ts, &signature)
            .map_err(|e| Failure::Failed(format!("cannot build the request: {e}")))?;
        let status = tokio::time::timeout(self.retry.timeout, post(&self.endpoint.url, request))
            .await
            .map_err(|_| Failure::Failed(format!("no answer within {:?}", self.retry.timeout)))?
            .map_err(Failure::Failed)?;
        match status.is_success() {
            true => Ok(()),
            false => Err(Failure::Rejected(status)),
        }
    }
}

/// The POST of `message` to `url` with the three Standard Webhooks headers.
fn build(
    url: &Uri,
    message: &Queued,
    timestamp: u64,
    signature: &str,
) -> Result<Request<Full<Bytes>>, http::Error> {
    let path = url.path_and_query().map_or("/", |p| p.as_str());
    let host = match url.port() {
        Some(p) => format!("{}:{p}", url.host().unwrap_or_default()),
        None => url.host().unwrap_or_default().to_string(),
    };
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, host)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::USER_AGENT, "arbor-approval-svc")
        .header("webhook-id", HeaderValue::from_str(&message.id)?)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(Full::new(Bytes::from(message.body.clone())))
}

/// Sends `request` over a new connection to `url` (TLS for `https`), and answers the status.
async fn post(url: &Uri, request: Request<Full<Bytes>>) -> Result<StatusCode, String> {
    let host = url.host().unwrap_or_default().trim_matches(['[', ']']);
    let https = url.scheme_str() == Some("https");
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let _ = tcp.set_nodelay(true);
    match https {
        false => exchange(TokioIo::new(tcp), request).await,
        true => {
            let tls = super::tls::connect(host, tcp).await?;
            exchange(TokioIo::new(tls), request).await
        }
    }
}

async fn exchange<I>(io: I, request: Request<Full<Bytes>>) -> Result<StatusCode, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    let conn = tokio::spawn(conn);
    let answer = sender.send_request(request).await;
    conn.abort();
    answer
        .map(|response| response.status())
        .map_err(|e| format!("no answer: {e}"))
}
