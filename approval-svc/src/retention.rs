//! Retention: keeps the approval store's size bounded by the rate of work, not its history. A
//! background task deletes final approvals (PRUNED, CANCELLED) and their audit trail once they
//! have not changed for the retention period; anything a person or the runner may still act on
//! (PENDING, RESOLVED, EXPIRED, ACKED) stays, however old.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::{
    error::Result,
    metrics::Metrics,
    store::{ApprovalStore, Compacted},
};

pub use crate::config::RetentionConfig;

/// One compaction pass at wall-clock `now_ms`; counts what it removed.
pub async fn compact_once<S: ApprovalStore>(
    store: &S,
    m: &Metrics,
    cfg: &RetentionConfig,
    now_ms: u64,
) -> Result<Compacted> {
    let cutoff = cfg.cutoff(now_ms, store.cursor_acked_at()?);
    let done = store.compact(cutoff).await?;
    Metrics::add(&m.retained_approvals, done.approvals);
    Metrics::add(&m.retained_audit_entries, done.audit_entries);
    Ok(done)
}

/// Runs a compaction pass every `cfg.interval` until `shutdown`.
pub struct Compactor<S> {
    pub store: Arc<S>,
    pub metrics: Arc<Metrics>,
    pub cfg: RetentionConfig,
    pub shutdown: CancellationToken,
}

impl<S: ApprovalStore> Compactor<S> {
    pub async fn run(self) {
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.cfg.interval) => {}
            }
            let now = self.store.now_ms();
            match compact_once(&*self.store, &self.metrics, &self.cfg, now).await {
                Ok(c) if c != Compacted::default() => tracing::info!(
                    approvals = c.approvals,
                    audit_entries = c.audit_entries,
                    "compacted"
                ),
                Ok(_) => {}
                Err(e) => tracing::error!(error = %e, "compaction failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_cutoff_never_passes_the_last_ack() {
        let cfg = RetentionConfig {
            keep: Duration::from_millis(1000),
            interval: Duration::from_millis(10),
        };
        assert_eq!(cfg.cutoff(10_000, Some(9_900)), 9_000);
        assert_eq!(cfg.cutoff(10_000, Some(5_000)), 5_000);
        assert_eq!(cfg.cutoff(10_000, None), 0, "never acked: nothing goes");
        assert_eq!(cfg.cutoff(500, Some(400)), 0);
    }
}
