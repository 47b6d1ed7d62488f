//! The webhook outbox in PostgreSQL: one row per message and endpoint, inserted by the change's
//! transaction; `seq` orders an endpoint's messages oldest first.

use arbor_shared::postgres::{Prepared, wait};

use super::{PgStore, clamp, db_error, statements::Param, tx::Fail};
use crate::{
    error::Result,
    store::webhooks::{self, Queued, QueuedAt, WebhookOutbox},
    webhooks::Routes,
};

/// Appended to the schema's migrations.
pub const MIGRATION: &str = "
CREATE TABLE approval_webhooks (
    seq bigserial PRIMARY KEY,
    endpoint text NOT NULL,
    message text NOT NULL
);
CREATE INDEX approval_webhooks_by_endpoint ON approval_webhooks (endpoint, seq);
";

const INSERT: &str = "INSERT INTO approval_webhooks (endpoint, message) VALUES ($1, $2)";

/// The statement that queues `message` for `endpoint`, and its parameters.
pub(super) fn insert(endpoint: &str, message: &Queued) -> Result<(&'static str, Vec<Param>), Fail> {
    let text = webhooks::encode(message)?;
    Ok((INSERT, vec![Box::new(endpoint.to_string()), Box::new(text)]))
}

impl WebhookOutbox for PgStore {
    fn route_webhooks(&self, routes: Routes) {
        let _ = self.routes.set(routes);
    }

    fn webhook_page(&self, endpoint: &str, limit: usize) -> Result<Vec<QueuedAt>> {
        let client = self.db.client_blocking()?;
        let limit = clamp(limit as u64);
        let rows = wait(client.prepared_query(
            "SELECT seq, message FROM approval_webhooks WHERE endpoint = $1 ORDER BY seq LIMIT $2",
            &[&endpoint, &limit],
        ))
        .map_err(db_error)?;
        rows.iter()
            .map(|r| {
                Ok(QueuedAt {
                    seq: r.get::<_, i64>(0).max(0) as u64,
                    message: webhooks::decode(r.get::<_, &str>(1).as_bytes())?,
                })
            })
            .collect()
    }

    fn webhook_delivered(&self, endpoint: &str, seq: u64) -> Result<()> {
        let client = self.db.client_blocking()?;
        wait(client.prepared_execute(
            "DELETE FROM approval_webhooks WHERE endpoint = $1 AND seq = $2",
            &[&endpoint, &clamp(seq)],
        ))
        .map_err(db_error)?;
        Ok(())
    }

    fn webhook_backlog(&self, endpoint: &str) -> Result<u64> {
        let client = self.db.client_blocking()?;
        let row = wait(client.prepared_query_one(
            "SELECT count(*) FROM approval_webhooks WHERE endpoint = $1",
            &[&endpoint],
        ))
        .map_err(db_error)?;
        Ok(row.get::<_, i64>(0).max(0) as u64)
    }
}
