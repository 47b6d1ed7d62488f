//! Retention: keeps the approval store's size bounded by the rate of work, not its history. A
//! background task deletes final approvals (PRUNED, CANCELLED) and their audit trail once they
//! have not changed for the retention period; anything a person or the runner may still act on
//! (PENDING, RESOLVED, EXPIRED, ACKED) stays, however old.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{
    approvals::Approvals,
    error::Result,
    metrics::Metrics,
    store::{ApprovalStore, Compacted},
};

/// How long final approvals are kept, and how often the compactor looks.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Final approvals (and their audit entries) unchanged for this long are deleted.
    pub keep: Duration,
    /// How often the compactor runs.
    pub interval: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            keep: Duration::from_secs(7 * 24 * 3600),
            interval: Duration::from_secs(60),
        }
    }
}

impl RetentionConfig {
    /// The newest `updated_at` that may go at wall-clock `now_ms`. Never later than the last
    /// cursor ack: an approval changed by an event the runner could still replay (a lost ack)
    /// stays, so a replayed APPROVAL_REQUESTED finds its tombstone instead of a fresh PENDING.
    pub fn cutoff(&self, now_ms: u64, cursor_acked_at: Option<u64>) -> u64 {
        let by_age = now_ms.saturating_sub(self.keep.as_millis() as u64);
        by_age.min(cursor_acked_at.unwrap_or(0))
    }
}

/// One compaction pass at wall-clock `now_ms`; counts what it removed.
pub async fn compact_once<S: ApprovalStore>(
    approvals: &Approvals<S>,
    cfg: &RetentionConfig,
    now_ms: u64,
) -> Result<Compacted> {
    let store = approvals.store();
    let cutoff = cfg.cutoff(now_ms, store.cursor_acked_at()?);
    let done = store.compact(cutoff).await?;
    let m = approvals.metrics();
    Metrics::add(&m.retained_approvals, done.approvals);
    Metrics::add(&m.retained_audit_entries, done.audit_entries);
    Ok(done)
}

/// Runs a compaction pass every `cfg.interval` until `shutdown`.
pub struct Compactor<S> {
    pub approvals: Approvals<S>,
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
            match compact_once(&self.approvals, &self.cfg, self.approvals.store().now_ms()).await {
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
