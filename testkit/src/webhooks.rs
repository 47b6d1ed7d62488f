//! A webhook receiver for tests: a real HTTP server on `127.0.0.1:0` that checks every
//! message's Standard Webhooks signature with the published `standardwebhooks` crate (not the
//! service's own code), answers as the test tells it (fail the first calls, or hang), and
//! deduplicates what it accepted by `webhook-id`, as a receiver should.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
};

use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use standardwebhooks::Webhook;
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};

/// One message the receiver accepted (answered 2xx).
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub timestamp: String,
    pub body: serde_json::Value,
    /// How many times it was accepted (more than once: delivered again).
    pub accepted: usize,
}

#[derive(Default)]
struct State {
    /// Calls still to answer 500, whatever they hold.
    fail_next: usize,
    calls: usize,
    /// Calls whose signature did not verify.
    forged: Vec<String>,
    /// Accepted messages by `webhook-id`, in the order first accepted.
    accepted: BTreeMap<String, (usize, Received)>,
}

/// The receiver; dropping it stops it.
pub struct WebhookReceiver {
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    hang: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl WebhookReceiver {
    /// A receiver verifying with `secret` (`whsec_…`).
    pub async fn start(secret: &str) -> Self {
        Self::start_on("127.0.0.1:0", secret).await
    }

    /// [`start`](Self::start) on `addr` (a receiver started again where it was).
    pub async fn start_on(addr: &str, secret: &str) -> Self {
        let verifier = Arc::new(Webhook::new(secret).unwrap_or_else(|e| panic!("secret: {e}")));
        let listener = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let state = Arc::new(Mutex::new(State::default()));
        let (hang, hung) = watch::channel(false);
        let (st, hung) = (state.clone(), hung.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (st, verifier, hung) = (st.clone(), verifier.clone(), hung.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        answer(st.clone(), verifier.clone(), hung.clone(), req)
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            state,
            hang,
            task,
        }
    }

    /// Where to send messages.
    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The next `n` calls are answered 500.
    pub fn fail_next(&self, n: usize) {
        self.with(|s| s.fail_next = n);
    }

    /// While `true`, calls are held without an answer.
    pub fn hang(&self, hang: bool) {
        self.hang.send_replace(hang);
    }

    /// Every call so far, answered, held or not.
    pub fn calls(&self) -> usize {
        self.with(|s| s.calls)
    }

    /// The `webhook-id`s of calls whose signature did not verify.
    pub fn forged(&self) -> Vec<String> {
        self.with(|s| s.forged.clone())
    }

    /// What it accepted, each `webhook-id` once, in the order first accepted.
    pub fn unique(&self) -> Vec<Received> {
        self.with(|s| {
            let mut all: Vec<_> = s.accepted.values().cloned().collect();
            all.sort_by_key(|(order, _)| *order);
            all.into_iter().map(|(_, r)| r).collect()
        })
    }

    /// The accepted messages of `type` about `request_id`.
    pub fn about(&self, kind: &str, request_id: &str) -> Vec<Received> {
        self.unique()
            .into_iter()
            .filter(|r| r.body["type"] == kind && r.body["data"]["request_id"] == request_id)
            .collect()
    }
}

async fn answer(
    state: Arc<Mutex<State>>,
    verifier: Arc<Webhook>,
    mut hung: watch::Receiver<bool>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    state.lock().unwrap_or_else(PoisonError::into_inner).calls += 1;
    let _ = hung.wait_for(|h| !*h).await;
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let id = header("webhook-id");
    let mut s = state.lock().unwrap_or_else(PoisonError::into_inner);
    if s.fail_next > 0 {
        s.fail_next -= 1;
        return Ok(reply(StatusCode::INTERNAL_SERVER_ERROR));
    }
    if verifier.verify(&body, &parts.headers).is_err() {
        s.forged.push(id);
        return Ok(reply(StatusCode::BAD_REQUEST));
    }
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&body) else {
        s.forged.push(id);
        return Ok(reply(StatusCode::BAD_REQUEST));
    };
    let order = s.accepted.len();
    let entry = s.accepted.entry(id.clone()).or_insert_with(|| {
        (
            order,
            Received {
                id,
                timestamp: header("webhook-timestamp"),
                body: json,
                accepted: 0,
            },
        )
    });
    entry.1.accepted += 1;
    Ok(reply(StatusCode::NO_CONTENT))
}

fn reply(status: StatusCode) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = status;
    r
}
