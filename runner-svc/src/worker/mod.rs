//! The worker pool: N workers claim jobs, keep their lease alive while a run is processed, and
//! hand each job to `Runner::process`; a reaper returns expired leases to the queue so another
//! worker takes the run over from its checkpoint.

use std::{sync::Arc, time::Duration};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    mailbox::{Claim, MailboxStore},
    runs::Runner,
};

/// Starts `workers` workers and the reaper; they stop when `shutdown` is cancelled.
pub fn spawn(runner: Arc<Runner>, workers: usize, shutdown: CancellationToken) -> JoinSet<()> {
    let mut set = JoinSet::new();
    for i in 0..workers.max(1) {
        let runner = runner.clone();
        let shutdown = shutdown.clone();
        set.spawn(async move { worker_loop(runner, format!("worker-{i}"), shutdown).await });
    }
    let reaper_runner = runner.clone();
    set.spawn(async move { reaper_loop(reaper_runner, shutdown).await });
    set
}

/// Claims and processes jobs until shutdown. Idle workers sleep until woken by a new job or
/// until the next delayed job becomes available — never a busy loop.
pub async fn worker_loop(runner: Arc<Runner>, worker_id: String, shutdown: CancellationToken) {
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let woken = runner.work_available();
        tokio::pin!(woken);
        // Register interest before looking, so a wake-up between the look and the wait is kept.
        woken.as_mut().enable();
        match runner.mailbox().claim(&worker_id) {
            Ok(Some(claim)) => {
                process_with_heartbeat(&runner, &claim).await;
                continue;
            }
            Ok(None) => {}
            Err(e) => tracing::error!(worker = %worker_id, "claim failed: {e}"),
        }
        let idle = match runner.mailbox().next_available_at() {
            Ok(Some(at)) => {
                Duration::from_millis(at.saturating_sub(arbor_shared::time::now_ms()).max(1))
            }
            _ => Duration::from_secs(5),
        };
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep(idle) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Extends the lease every third of its length while the job is processed.
async fn process_with_heartbeat(runner: &Arc<Runner>, claim: &Claim) {
    let lease = runner.mailbox().config().lease;
    let beat_runner = runner.clone();
    let job_id = claim.job.job_id.clone();
    let token = claim.token.clone();
    let heartbeat = tokio::spawn(async move {
        let mut every = tokio::time::interval(lease / 3);
        every.tick().await;
        loop {
            every.tick().await;
            if beat_runner.mailbox().extend_lease(&job_id, &token).is_err() {
                return;
            }
        }
    });
    runner.process(claim).await;
    heartbeat.abort();
}

async fn reaper_loop(runner: Arc<Runner>, shutdown: CancellationToken) {
    let period = (runner.mailbox().config().lease / 4).max(Duration::from_millis(20));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.cancelled() => return,
        }
        if let Err(e) = runner.reap().await {
            tracing::error!("reaper failed: {e}");
        }
    }
}
