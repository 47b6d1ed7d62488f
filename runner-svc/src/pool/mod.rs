//! The job pool: N pool tasks claim mailbox jobs, keep their lease alive while a run is
//! processed, and hand each job to `Runner::process`; a reaper returns expired leases to the
//! queue so another pool task takes the run over from its checkpoint.
//!
//! In the code "worker" means a task worker (the remote processes of `tasks`). What users see
//! keeps its old name on purpose, as deployments and dashboards depend on it: the `--workers`
//! flag and `ARBOR_WORKERS`, the `claimed_by` names (`pid@host/worker-N`), the log fields and
//! the metric names.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::{
    mailbox::{Claim, MailboxStore},
    runs::Runner,
};

/// Claims being processed right now (job id → token), whose leases the heartbeat keeps alive.
#[derive(Default)]
pub struct InFlight(Mutex<HashMap<String, String>>);

impl InFlight {
    fn start(&self, claim: &Claim) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(claim.job.job_id.clone(), claim.token.clone());
        }
    }

    fn finish(&self, claim: &Claim) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(&claim.job.job_id);
        }
    }

    fn snapshot(&self) -> Vec<(String, String)> {
        self.0
            .lock()
            .map(|m| m.iter().map(|(j, t)| (j.clone(), t.clone())).collect())
            .unwrap_or_default()
    }
}

/// The pool's size unless configured (see [`crate::defaults::POOL_SIZE`]).
pub const DEFAULT_SIZE: usize = crate::defaults::POOL_SIZE;

/// Starts `size` pool tasks, the lease heartbeat and the reaper; they stop when `shutdown` is
/// cancelled.
pub fn spawn(runner: Arc<Runner>, size: usize, shutdown: CancellationToken) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let in_flight = Arc::new(InFlight::default());
    let process = process_identity();
    for i in 0..size.max(1) {
        let runner = runner.clone();
        let shutdown = shutdown.clone();
        let in_flight = in_flight.clone();
        let worker_id = format!("{process}/worker-{i}");
        set.spawn(async move { claim_loop(runner, worker_id, in_flight, shutdown).await });
    }
    set.spawn(heartbeat_loop(runner.clone(), in_flight, shutdown.clone()));
    let reaper_runner = runner.clone();
    set.spawn(async move { reaper_loop(reaper_runner, shutdown).await });
    set
}

/// `pid@host` of this process, as Temporal names its workers: a job's `claimed_by` tells which
/// replica holds it (the pod's name on Kubernetes), not only which of its workers.
fn process_identity() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{}@{host}", std::process::id())
}

/// Claims and processes jobs until shutdown. Idle workers sleep until woken by a new job or
/// until the next delayed job becomes available — never a busy loop — or until a transaction
/// queuing a job hands it to them already claimed (see `runs::handoff`). A worker that
/// finishes a job waits the same way, after a look at the queue only when the mailbox knows
/// that look may find something (see `mailbox::backlog`).
pub async fn claim_loop(
    runner: Arc<Runner>,
    worker_id: String,
    in_flight: Arc<InFlight>,
    shutdown: CancellationToken,
) {
    // Whether to look at the queue after it: a job of its thread waits, or a delayed job is due.
    let process = |claim: Claim| {
        let (runner, in_flight) = (runner.clone(), in_flight.clone());
        async move {
            in_flight.start(&claim);
            runner.process(&claim).await;
            in_flight.finish(&claim);
            runner.mailbox().finished(&claim.job)
        }
    };
    let mut look = true;
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let Some(claim) = next_claim(&runner, &worker_id, look, &shutdown).await else {
            // Woken, or its sleep ended: it looks next.
            look = true;
            continue;
        };
        look = process(claim).await;
    }
}

/// The worker's next claim: from a look at the queue (when `look`), or handed over while it
/// waits; `None` when woken or its sleep ended without one, and at shutdown. Its wake-up
/// registration ends here, before the claim is processed: a busy worker's registration would
/// take a wake-up meant for an idle one and hold it until its job was done.
async fn next_claim(
    runner: &Runner,
    worker_id: &str,
    look: bool,
    shutdown: &CancellationToken,
) -> Option<Claim> {
    let woken = runner.work_available();
    tokio::pin!(woken);
    // Register interest before looking, so a wake-up between the look and the wait is kept. A
    // wake-up already waiting is taken here, and asks for a look.
    let look = woken.as_mut().enable() || look;
    let next = match look {
        true => match runner.mailbox().claim_next(worker_id).await {
            Ok((Some(claim), more)) => {
                // Workers are woken one at a time: pass the wake-up on while work remains.
                if more.is_some() {
                    runner.wake_pool();
                }
                return Some(claim);
            }
            Ok((None, next)) => next,
            Err(e) => {
                tracing::error!(worker = %worker_id, "claim failed: {e}");
                None
            }
        },
        false => runner.mailbox().next_due(),
    };
    let idle = match next {
        Some(at) => Duration::from_millis(at.saturating_sub(runner.now_ms()).max(1)),
        None => Duration::from_secs(5),
    };
    let mut handed = runner.wait_for_work(worker_id);
    let woken = tokio::select! {
        claim = &mut handed => return claim.ok(),
        _ = &mut woken => true,
        _ = tokio::time::sleep(idle) => false,
        _ = shutdown.cancelled() => {
            // A job being handed over now stays claimed until its lease runs out.
            runner.stop_waiting(worker_id);
            return None;
        }
    };
    match runner.stop_waiting(worker_id) {
        true => None,
        false => {
            // Woken to look at the queue just as a job was handed to it: the look is another
            // worker's to make.
            if woken {
                runner.wake_pool();
            }
            handed.await.ok()
        }
    }
}

/// Extends the lease of every job being processed, every third of the lease: a tick that
/// takes long (a slow tool) keeps its claim; a worker that is stuck for real (its whole process
/// frozen) stops extending and loses it.
async fn heartbeat_loop(
    runner: Arc<Runner>,
    in_flight: Arc<InFlight>,
    shutdown: CancellationToken,
) {
    let period = (runner.mailbox().config().lease / 3).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.cancelled() => return,
        }
        for (job_id, token) in in_flight.snapshot() {
            if let Err(e) = runner.mailbox().extend_lease(&job_id, &token) {
                tracing::debug!(job = %job_id, "lease not extended (finished or lost): {e}");
            }
        }
    }
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
