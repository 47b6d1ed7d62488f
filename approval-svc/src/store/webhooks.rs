//! The webhook outbox, written once above the seam: a change queues one message for each
//! endpoint that wants its event, in the change's own transaction ([`enqueue`]), so the change
//! and its messages commit together or not at all. The leader's delivery reads each
//! endpoint's messages oldest first and deletes one once its endpoint took it
//! ([`WebhookOutbox`]); a message's id, the `webhook-id` header, is fixed when it is queued.

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::backend::Records;
use crate::{
    error::{Error, Result},
    model::Approval,
    webhooks::{EventKind, Routes, payload},
};

/// A message waiting in the outbox for one endpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queued {
    /// `msg_` and a unique id: the `webhook-id`, the same on every attempt.
    pub id: String,
    /// The payload's `type` (`approval.decided`, …).
    pub kind: String,
    /// The JSON body, signed as it is.
    pub body: String,
    pub queued_at_ms: u64,
}

/// A queued message and where it is in its endpoint's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedAt {
    /// Its place in the queue: larger is younger.
    pub seq: u64,
    pub message: Queued,
}

/// The routes a store queues by, set once when the service starts (none until then).
pub type RouteCell = Arc<OnceLock<Routes>>;

/// The routes in `cell`, or none.
pub fn routes_in(cell: &RouteCell) -> &Routes {
    static NONE: Routes = Routes::NONE;
    cell.get().unwrap_or(&NONE)
}

/// Queues a message about `a` (as it is after the change) for each endpoint that wants `kind`,
/// in the transaction `tx`. The rules call it after writing the change it tells of.
pub fn enqueue<R: Records>(tx: &R, kind: EventKind, a: &Approval) -> Result<(), R::Fail> {
    let routes = tx.webhook_routes();
    let mut body = None;
    for endpoint in routes.wanting(kind) {
        let body = body.get_or_insert_with(|| payload(kind, a, tx.now(), routes));
        let message = Queued {
            id: format!("msg_{}", uuid::Uuid::now_v7().simple()),
            kind: kind.type_name().to_string(),
            body: body.clone(),
            queued_at_ms: tx.now(),
        };
        tx.put_webhook(endpoint, &message)?;
    }
    Ok(())
}

/// What the webhook delivery reads and deletes; every store keeps an outbox. Reads outside
/// any transaction, like the other reads of the store.
pub trait WebhookOutbox {
    /// Sets the routes the store queues messages by; only the first call counts.
    fn route_webhooks(&self, routes: Routes);

    /// Up to `limit` of `endpoint`'s messages, oldest first.
    fn webhook_page(&self, endpoint: &str, limit: usize) -> Result<Vec<QueuedAt>>;

    /// Deletes `endpoint`'s message `seq` (delivered). Deleting one already gone is no error.
    fn webhook_delivered(&self, endpoint: &str, seq: u64) -> Result<()>;

    /// How many messages wait for `endpoint`.
    fn webhook_backlog(&self, endpoint: &str) -> Result<u64>;
}

/// The message `queued` as bytes a store keeps; see [`decode`].
pub(super) fn encode(queued: &Queued) -> Result<String> {
    serde_json::to_string(queued).map_err(|e| Error::Storage(format!("cannot encode webhook: {e}")))
}

pub(super) fn decode(text: &[u8]) -> Result<Queued> {
    serde_json::from_slice(text).map_err(|e| Error::Storage(format!("corrupt webhook: {e}")))
}
