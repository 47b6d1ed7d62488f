//! The webhook outbox in sled: each message under `webhook/{endpoint}\0{seq}` in the `meta`
//! tree (written in the change's transaction, which already spans it), `seq` from the tree's
//! id generator, so an endpoint's messages read back oldest first by key.

use super::{SledStore, Tx, TxResult, lift};
use crate::{
    error::Result,
    store::webhooks::{self, Queued, QueuedAt, WebhookOutbox},
    webhooks::Routes,
};

fn prefix(endpoint: &str) -> Vec<u8> {
    let mut k = b"webhook/".to_vec();
    k.extend_from_slice(endpoint.as_bytes());
    k.push(0);
    k
}

fn key(endpoint: &str, seq: u64) -> Vec<u8> {
    let mut k = prefix(endpoint);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn put(tx: &Tx<'_>, endpoint: &str, message: &Queued) -> TxResult<()> {
    let seq = tx.meta.generate_id()?;
    let value = lift(webhooks::encode(message))?;
    tx.meta.insert(key(endpoint, seq), value.as_bytes())?;
    Ok(())
}

impl WebhookOutbox for SledStore {
    fn route_webhooks(&self, routes: Routes) {
        let _ = self.trees.routes.set(routes);
    }

    fn webhook_page(&self, endpoint: &str, limit: usize) -> Result<Vec<QueuedAt>> {
        let prefix = prefix(endpoint);
        let mut page = Vec::new();
        for item in self.trees.meta.scan_prefix(&prefix).take(limit) {
            let (k, v) = item?;
            let seq = k
                .get(prefix.len()..)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .unwrap_or_default();
            page.push(QueuedAt {
                seq,
                message: webhooks::decode(&v)?,
            });
        }
        Ok(page)
    }

    fn webhook_delivered(&self, endpoint: &str, seq: u64) -> Result<()> {
        self.trees.meta.remove(key(endpoint, seq))?;
        Ok(())
    }

    fn webhook_backlog(&self, endpoint: &str) -> Result<u64> {
        Ok(self.trees.meta.scan_prefix(prefix(endpoint)).count() as u64)
    }
}
