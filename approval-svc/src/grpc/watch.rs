//! WatchApprovals: a snapshot of the matching approvals, SNAPSHOT_END, then every change.
//!
//! The watcher subscribes to the change broadcast *before* reading the snapshot, so nothing
//! falls between the two; changes already covered by the snapshot are dropped by comparing
//! record versions. An approval that leaves the filter after the watcher saw it is still sent
//! once (as UPDATED), so a UI learns that it left. A watcher that falls more than the broadcast
//! buffer behind is ended with RESOURCE_EXHAUSTED instead of holding memory for it. On a shared
//! store, changes other replicas make arrive through the same broadcast; when this replica may
//! have missed some (its notification connection was lost), the watch ends with UNAVAILABLE and
//! the client re-watches for a fresh snapshot.

use std::collections::HashMap;

use arbor_shared::proto::approval::v1 as pb;
use tokio::sync::{broadcast::error::RecvError, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use crate::{
    approvals::Approvals,
    error::Error,
    model::{Approval, Filter},
    store::ApprovalStore,
};

type Item = Result<pb::WatchApprovalsResponse, Status>;

/// Approvals read per snapshot page.
const SNAPSHOT_PAGE: usize = 500;
/// Items buffered for a slow client before the watcher blocks (and may then lag).
const STREAM_BUFFER: usize = 64;

pub fn start<S: ApprovalStore>(
    approvals: Approvals<S>,
    filter: Filter,
    shutdown: CancellationToken,
) -> ReceiverStream<Item> {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let changes = approvals.subscribe();
    let mut missed = approvals.missed();
    missed.mark_unchanged();
    tokio::spawn(async move {
        let watcher = Watcher {
            tx,
            filter,
            sent: HashMap::new(),
        };
        if let Err(status) = watcher.run(approvals, changes, missed, shutdown).await {
            tracing::debug!(code = ?status.code(), "watch ended");
        }
    });
    ReceiverStream::new(rx)
}

struct Watcher {
    tx: mpsc::Sender<Item>,
    filter: Filter,
    /// request id → the version last sent, for every approval the client knows about.
    sent: HashMap<String, u64>,
}

/// The client went away; nothing more to do.
struct Gone;

impl Watcher {
    async fn send(&mut self, change: pb::ChangeKind, a: Option<&Approval>) -> Result<(), Gone> {
        if let Some(a) = a {
            if a.state.is_final() {
                self.sent.remove(a.id());
            } else {
                self.sent.insert(a.id().to_string(), a.version);
            }
        }
        let item = pb::WatchApprovalsResponse {
            change: change as i32,
            approval: a.map(Into::into),
        };
        self.tx.send(Ok(item)).await.map_err(|_| Gone)
    }

    async fn end(&self, status: Status) -> Status {
        let _ = self.tx.send(Err(status.clone())).await;
        status
    }

    async fn run<S: ApprovalStore>(
        mut self,
        approvals: Approvals<S>,
        mut changes: tokio::sync::broadcast::Receiver<Approval>,
        mut missed: tokio::sync::watch::Receiver<u64>,
        shutdown: CancellationToken,
    ) -> Result<(), Status> {
        let mut token: Option<String> = None;
        loop {
            let page = match approvals.store().list(
                &self.filter,
                SNAPSHOT_PAGE,
                token.as_deref(),
                approvals.store().now_ms(),
            ) {
                Ok(p) => p,
                Err(e) => return Err(self.end(e.into()).await),
            };
            for a in &page.items {
                if self.send(pb::ChangeKind::Snapshot, Some(a)).await.is_err() {
                    return Ok(());
                }
            }
            match page.next {
                Some(next) => token = Some(next),
                None => break,
            }
        }
        if self.send(pb::ChangeKind::SnapshotEnd, None).await.is_err() {
            return Ok(());
        }
        loop {
            let change = tokio::select! {
                _ = shutdown.cancelled() => return Err(self.end(Error::ShuttingDown.into()).await),
                _ = self.tx.closed() => return Ok(()),
                _ = missed.changed() => {
                    let why = "changes made on another replica may have been missed; re-watch";
                    return Err(self.end(Error::Unavailable(why.into()).into()).await);
                }
                c = changes.recv() => c,
            };
            let a = match change {
                Ok(a) => a,
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "watcher lagged; ending it");
                    return Err(self.end(Error::Lagged.into()).await);
                }
                Err(RecvError::Closed) => {
                    return Err(self.end(Error::ShuttingDown.into()).await);
                }
            };
            let known = self.sent.get(a.id()).copied();
            if known.is_some_and(|v| a.version <= v) {
                continue; // the snapshot or an earlier change already showed this
            }
            if known.is_none() && !self.filter.matches(&a, approvals.store().now_ms()) {
                continue;
            }
            let kind = if a.version == 1 {
                pb::ChangeKind::Created
            } else {
                pb::ChangeKind::Updated
            };
            if self.send(kind, Some(&a)).await.is_err() {
                return Ok(());
            }
        }
    }
}
