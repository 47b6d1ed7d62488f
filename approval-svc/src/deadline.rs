//! The deadline timer: one task that sleeps until the earliest PENDING deadline in the store
//! and expires what is due. The store is the schedule, so it survives restarts without a
//! rebuild step, and a new earlier deadline wakes the task early.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{approvals::Approvals, store::ApprovalStore};

/// Sleeps are capped so a wall-clock jump (deadlines are wall-clock, to survive restarts) is
/// noticed within this long.
const MAX_SLEEP: Duration = Duration::from_secs(30);
const ON_ERROR: Duration = Duration::from_secs(1);

pub struct DeadlineTimer<S> {
    pub approvals: Approvals<S>,
    pub shutdown: CancellationToken,
}

impl<S: ApprovalStore> DeadlineTimer<S> {
    pub async fn run(self) {
        let wake = self.approvals.deadline_wake();
        loop {
            let woken = wake.notified();
            let now = self.approvals.store().now_ms();
            let sleep = match self.approvals.store().next_deadline() {
                Ok(Some((at, request_id))) if at <= now => {
                    match self.approvals.expire(&request_id).await {
                        Ok(_) => continue,
                        Err(e) => {
                            tracing::error!(request_id, error = %e, "could not expire an approval");
                            ON_ERROR
                        }
                    }
                }
                Ok(Some((at, _))) => Duration::from_millis(at.saturating_sub(now)).min(MAX_SLEEP),
                Ok(None) => MAX_SLEEP,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read approval deadlines");
                    ON_ERROR
                }
            };
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = woken => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }
}
