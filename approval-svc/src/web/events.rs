//! `GET /events`: server-sent events fed by the same change broadcast as `WatchApprovals`.
//! Each change is numbered by this process (`id: BOOT:SEQ`), and the most recent are kept,
//! so a browser that reconnects with `Last-Event-ID` gets what it missed; when that is no
//! longer kept (or this replica may have missed changes made elsewhere) it is told `reset`
//! and refetches what it shows.

use std::{
    collections::VecDeque,
    convert::Infallible,
    sync::{Arc, Mutex, PoisonError},
};

use axum::{
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::{StreamExt, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;

use super::Shared;
use crate::{approvals::Approvals, store::ApprovalStore};

/// Changes kept for browsers that reconnect.
const KEPT: usize = 1024;

/// One numbered change: an approval's id and state; `id` empty: start over.
#[derive(Debug, Clone)]
struct Change {
    seq: u64,
    id: String,
    state: String,
}

/// The numbered change feed of this process.
#[derive(Clone)]
pub struct Feed {
    tx: broadcast::Sender<Change>,
    kept: Arc<Mutex<(u64, VecDeque<Change>)>>,
    /// Tells one process's numbers from another's (a restart starts over).
    boot: String,
    stop: CancellationToken,
}

impl Default for Feed {
    fn default() -> Self {
        Self {
            tx: broadcast::channel(KEPT).0,
            kept: Arc::default(),
            boot: uuid::Uuid::new_v4().simple().to_string()[..12].to_string(),
            stop: CancellationToken::new(),
        }
    }
}

impl Feed {
    fn push(&self, id: String, state: String) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.0 += 1;
        let c = Change {
            seq: kept.0,
            id,
            state,
        };
        if kept.1.len() >= KEPT {
            kept.1.pop_front();
        }
        kept.1.push_back(c.clone());
        // Sent under the lock, so a reader that replays and then subscribes sees each once.
        let _ = self.tx.send(c);
    }

    /// Numbers every change `approvals` publishes until `stop`.
    pub async fn run<S: ApprovalStore>(
        feed: Feed,
        approvals: Approvals<S>,
        stop: CancellationToken,
    ) {
        let mut changes = approvals.subscribe();
        let mut missed = approvals.missed();
        missed.mark_unchanged();
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    feed.stop.cancel();
                    return;
                }
                _ = missed.changed() => feed.push(String::new(), String::new()),
                c = changes.recv() => match c {
                    Ok(a) => feed.push(a.id().to_string(), format!("{:?}", a.state).to_lowercase()),
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        feed.push(String::new(), String::new())
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    }

    /// The changes after `last` (`BOOT:SEQ`) still kept, and the live feed after them; a
    /// reset first when what was missed is no longer kept.
    fn resume(&self, last: Option<&str>) -> (Vec<Change>, broadcast::Receiver<Change>) {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let rx = self.tx.subscribe();
        let Some(last) = last else {
            return (Vec::new(), rx);
        };
        let seq = last
            .strip_prefix(&format!("{}:", self.boot))
            .and_then(|s| s.parse::<u64>().ok());
        let oldest = kept.1.front().map_or(kept.0 + 1, |c| c.seq);
        let replay = match seq {
            Some(s) if s + 1 >= oldest => kept.1.iter().filter(|c| c.seq > s).cloned().collect(),
            _ => vec![Change {
                seq: kept.0,
                id: String::new(),
                state: String::new(),
            }],
        };
        (replay, rx)
    }

    fn event(&self, c: &Change) -> Event {
        let e = Event::default().id(format!("{}:{}", self.boot, c.seq));
        match c.id.is_empty() {
            true => e.event("reset").data("{}"),
            false => e
                .event("change")
                .data(serde_json::json!({"id": c.id, "state": c.state}).to_string()),
        }
    }
}

pub async fn stream<S: ApprovalStore>(State(w): State<Shared<S>>, headers: HeaderMap) -> Response {
    let Some(p) = w.person(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    if crate::grpc::require(&p.principal, crate::grpc::READERS, "watch approvals").is_err() {
        return StatusCode::FORBIDDEN.into_response();
    }
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let feed = w.feed.clone();
    let (replay, mut rx) = feed.resume(last.as_deref());
    let (tx, out) = mpsc::channel::<Event>(64);
    tokio::spawn(async move {
        for c in &replay {
            if tx.send(feed.event(c)).await.is_err() {
                return;
            }
        }
        loop {
            let c = tokio::select! {
                _ = feed.stop.cancelled() => return,
                _ = tx.closed() => return,
                c = rx.recv() => c,
            };
            let c = match c {
                Ok(c) => c,
                Err(broadcast::error::RecvError::Lagged(_)) => Change {
                    seq: 0,
                    id: String::new(),
                    state: String::new(),
                },
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if tx.send(feed.event(&c)).await.is_err() {
                return;
            }
        }
    });
    let stream = ReceiverStream::new(out).map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
