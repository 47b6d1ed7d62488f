//! The durable mailbox (DESIGN §5): every run request is a `MailboxJob` that workers claim
//! atomically under a lease, ack or nack, and that retries, dead-letters, cancels and supersedes
//! through the explicit status machine in `state`.
//!
//! Time: `available_at` and backoff are wall-clock milliseconds because they must survive a
//! restart; lease expiry is judged on the server's monotonic clock only (never a client's clock).

mod backlog;
mod claim;
mod clock;
mod leases;
pub mod state;
mod store;
pub mod tx;

pub use clock::{Clock, ManualClock, StoreClock, SystemClock};
pub use leases::Leases;
pub use store::Mailbox;

use std::time::Duration;

use arbor_shared::domain::{JobKind, JobOrigin, JobStatus};

use crate::store::codec::Corrupt;
/// The stored job, kept with its table's keys so the layers below the mailbox can read it.
pub use crate::store::tables::jobs::{Job, RetryCause};
pub use state::{InvalidTransition, JobEvent};

/// What to enqueue.
#[derive(Debug, Clone, Default)]
pub struct EnqueueRequest {
    pub job_id: String,
    pub mailbox_id: String,
    pub run_id: String,
    pub origin: JobOrigin,
    pub kind: Option<JobKind>,
    pub priority: i32,
    pub dedupe_key: String,
    pub dedupe_while_claimed: bool,
    pub available_at_ms: u64,
    /// 0: the mailbox default.
    pub max_attempts: u32,
}

/// The result of an enqueue: the new job, or the live job with the same dedupe key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    pub job: Job,
    pub deduplicated: bool,
}

/// A successful claim: the job (status Claimed) and its fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub job: Job,
    pub token: String,
}

/// The answer to an interrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MailboxInterrupt {
    pub new_generation: u64,
    pub active_job: Option<Job>,
    pub superseded_count: u32,
    /// The jobs that were superseded (the runner marks their runs).
    pub superseded: Vec<Job>,
}

/// What the reaper did with an expired lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub job: Job,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum MailboxError {
    #[error("job {0} not found")]
    NotFound(String),
    /// The claim token is not (or no longer) the job's current one: the lease was lost.
    #[error("stale claim on job {job_id}: the lease was lost or the token is wrong")]
    StaleClaim { job_id: String },
    #[error(transparent)]
    InvalidTransition(#[from] InvalidTransition),
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
    #[error("storage error: {0}")]
    Storage(crate::store::StoreError),
}

impl From<crate::store::StoreError> for MailboxError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Storage(e)
    }
}

impl From<crate::store::TxError<MailboxError>> for MailboxError {
    fn from(e: crate::store::TxError<MailboxError>) -> Self {
        match e {
            crate::store::TxError::Abort(e) => e,
            crate::store::TxError::Storage(e) => e.into(),
        }
    }
}

/// Filter for listing jobs.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub mailbox_id: String,
    pub run_id: String,
    pub statuses: Vec<JobStatus>,
}

/// Tunables.
#[derive(Debug, Clone)]
pub struct MailboxConfig {
    pub lease: Duration,
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    pub default_max_attempts: u32,
}

impl Default for MailboxConfig {
    fn default() -> Self {
        Self {
            lease: crate::defaults::LEASE,
            base_backoff: crate::defaults::BASE_BACKOFF,
            max_backoff: crate::defaults::MAX_BACKOFF,
            default_max_attempts: crate::defaults::MAX_ATTEMPTS,
        }
    }
}

impl MailboxConfig {
    /// Exponential backoff before retry number `attempt` (1-based).
    pub fn backoff(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(20);
        self.base_backoff
            .saturating_mul(1u32 << shift)
            .min(self.max_backoff)
    }
}

/// The mailbox operations of DESIGN §5. Every method is one atomic step; the caller makes it
/// durable (group commit) before answering anyone.
pub trait MailboxStore: Send + Sync {
    fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, MailboxError>;
    /// Claims the best available job (highest priority, then oldest; `available_at` reached;
    /// its thread has no other claimed job). Exactly one concurrent claimer wins a job.
    fn claim(&self, worker_id: &str) -> Result<Option<Claim>, MailboxError>;
    fn ack(&self, job_id: &str, token: &str) -> Result<Job, MailboxError>;
    /// Retry with backoff, or DeadLetter when `permanent` or attempts are exhausted.
    fn nack(
        &self,
        job_id: &str,
        token: &str,
        error: &str,
        permanent: bool,
    ) -> Result<Job, MailboxError>;
    fn extend_lease(&self, job_id: &str, token: &str) -> Result<Job, MailboxError>;
    fn cancel(&self, job_id: &str) -> Result<Job, MailboxError>;
    fn interrupt(&self, mailbox_id: &str) -> Result<MailboxInterrupt, MailboxError>;
    /// Operator: DeadLetter → Queued with a fresh attempt budget.
    fn requeue(&self, job_id: &str) -> Result<Job, MailboxError>;
    /// Returns expired leases to Queued (or DeadLetter when attempts are exhausted).
    fn reap_expired(&self) -> Result<Vec<Reaped>, MailboxError>;
    fn get(&self, job_id: &str) -> Result<Option<Job>, MailboxError>;
    fn list(&self, filter: &JobFilter, after: &str, limit: usize)
    -> Result<Vec<Job>, MailboxError>;
    /// Earliest `available_at` among queued jobs that are not available yet.
    fn next_available_at(&self) -> Result<Option<u64>, MailboxError>;
}
