//! Handing a job straight to an idle worker: the transaction that queues a job (a submission, a
//! decision's or a task result's wake-up) claims it for a worker of this process that waits for work, and gives
//! it the claim once that transaction is durable. The worker skips the look at the queue and
//! the claim transaction of its own, which on PostgreSQL are five round trips per job, and no
//! other replica is told of a job that is already taken.
//!
//! The claim is the mailbox's own (`mailbox::tx::claim`), in the same transaction: the same
//! checks (the job can run now, its thread has no claimed job), the same lease and fencing
//! token. A job it cannot claim stays queued for the workers' usual claim.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, AtomicUsize, Ordering},
};

use arbor_shared::domain::JobStatus;
use tokio::sync::oneshot;

use crate::{
    error::RunnerError,
    mailbox::{Claim, Job, Leases, Mailbox, tx as mtx},
    store::{T, Tx, TxResult, lift},
};

/// The workers of this process waiting for work, each with the channel a claim reaches it by.
/// The most recently idle is handed the next job.
#[derive(Default)]
pub(crate) struct IdleWorkers {
    waiting: Mutex<Vec<(String, oneshot::Sender<Claim>)>>,
    /// How many wait (read by the store: see `Backend::idle_workers`).
    count: Arc<AtomicUsize>,
    /// Jobs handed over since the process started.
    handed: Arc<AtomicU64>,
}

impl IdleWorkers {
    pub fn count(&self) -> Arc<AtomicUsize> {
        self.count.clone()
    }

    /// Jobs handed to their worker since the process started.
    pub fn handed(&self) -> u64 {
        self.handed.load(Ordering::Relaxed)
    }

    /// The list, whatever a panic elsewhere left: a waiter must always be found again, or its
    /// worker would wait for a claim that never comes.
    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<(String, oneshot::Sender<Claim>)>> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts `worker` as idle until it is handed a job or [`stops`](Self::stop) waiting.
    pub fn wait(&self, worker: &str) -> oneshot::Receiver<Claim> {
        let (to, from) = oneshot::channel();
        let mut waiting = self.waiting();
        waiting.push((worker.to_string(), to));
        self.count.store(waiting.len(), Ordering::Relaxed);
        from
    }

    /// Whether `worker` was still waiting (and now is not). `false`: a transaction took it
    /// meanwhile, and its receiver answers as soon as that transaction ends.
    pub fn stop(&self, worker: &str) -> bool {
        let mut waiting = self.waiting();
        let Some(at) = waiting.iter().position(|(w, _)| w == worker) else {
            return false;
        };
        waiting.swap_remove(at);
        self.count.store(waiting.len(), Ordering::Relaxed);
        true
    }

    /// Takes an idle worker for a job about to be queued.
    pub fn take(&self, mailbox: &Mailbox) -> Option<HandOff> {
        let (worker, to) = {
            let mut waiting = self.waiting();
            let taken = waiting.pop()?;
            self.count.store(waiting.len(), Ordering::Relaxed);
            taken
        };
        // Without a token the worker is dropped, and goes back to claiming from the queue.
        let token = mailbox.claim_token(&worker).ok()?;
        Some(HandOff {
            claimer: Claimer {
                worker,
                token,
                leases: mailbox.leases(),
                at: mailbox.clock().wall_ms(),
            },
            to,
            handed: self.handed.clone(),
        })
    }
}

/// An idle worker taken for one job. Dropped without [`give`](Self::give) (the transaction
/// failed, or did not claim the job), the worker goes back to claiming from the queue.
pub(crate) struct HandOff {
    claimer: Claimer,
    to: oneshot::Sender<Claim>,
    handed: Arc<AtomicU64>,
}

impl HandOff {
    /// What the transaction body claims with (bodies may run more than once).
    pub fn claimer(&self) -> Claimer {
        self.claimer.clone()
    }

    /// After the claiming transaction committed: the claim goes to the worker (see
    /// `Runner::commit_queuing`, which gets it here even when the caller has gone away). A
    /// claim that finds its worker gone (shutdown) runs out with its lease, tracked since the
    /// claim, and goes back to the queue, as any claim of a worker that went away.
    pub fn give(self, job: Job) {
        self.handed.fetch_add(1, Ordering::Relaxed);
        let token = self.claimer.token;
        if let Err(unsent) = self.to.send(Claim { job, token }) {
            tracing::debug!(job = %unsent.job.job_id, "worker gone before its job was handed over");
        }
    }
}

/// The claim a hand-off makes inside the queuing transaction.
#[derive(Clone)]
pub(crate) struct Claimer {
    worker: String,
    token: String,
    leases: Leases,
    /// The mailbox's clock when the worker was taken.
    at: u64,
}

impl Claimer {
    /// Claims `job`, which this transaction just queued, when it can run now and its thread
    /// has no claimed job; otherwise it stays queued. "Now" is the later of the mailbox's clock
    /// and the transaction's time (the job's creation), so a job due at once is always due. The
    /// claim's lease is tracked from here (see [`Leases`]).
    pub fn claim(&self, tx: &Tx<'_>, job: &Job) -> TxResult<Option<Job>, RunnerError> {
        let now = self.at.max(job.created_at_ms);
        if job.status != JobStatus::Queued || job.available_at_ms > now {
            return Ok(None);
        }
        let thread = job.mailbox_id.as_bytes();
        tx.prefetch(&[(T::Mailboxes, thread), (T::Active, thread)])?;
        let claimed = lift(mtx::claim(
            tx,
            &job.job_id,
            &self.worker,
            &self.token,
            now,
            self.leases.lease(),
        ))?;
        let claimed = claimed.ok();
        if let Some(job) = &claimed {
            self.leases.track(&job.job_id, &self.token);
        }
        Ok(claimed)
    }
}
