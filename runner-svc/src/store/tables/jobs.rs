//! `jobs` (job_id → [`Job`]), `queue` (`{!priority BE}{order BE}{job_id}` → what the claim scan
//! needs of a queued job, in claim order), `active` (mailbox_id → job_id of its claimed job),
//! `dedupe` (dedupe_key → job_id of the live job), `mailboxes` (mailbox_id → generation BE) and
//! `mailbox_jobs` (`{mailbox_id}\0{order BE}` → job_id, the jobs of a thread).

use arbor_shared::domain::{JobKind, JobOrigin, JobStatus};
use serde::{Deserialize, Serialize};

use crate::store::codec;

/// A mailbox entry. Field names follow the seed design.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub job_id: String,
    /// The thread the run belongs to.
    pub mailbox_id: String,
    pub run_id: String,
    pub origin: JobOrigin,
    pub kind: JobKind,
    pub priority: i32,
    pub dedupe_key: String,
    pub generation: u64,
    pub status: JobStatus,
    pub available_at_ms: u64,
    pub attempt_count: u32,
    pub max_attempts: u32,
    pub last_error: String,
    pub claim_token: String,
    pub claimed_by: String,
    /// Wall-clock view of the lease for operators; expiry itself uses the monotonic clock.
    pub lease_until_ms: u64,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Enqueue order: FIFO among equal priorities.
    pub order: u64,
    /// Whether the dedupe key stays taken while the job is claimed (user submissions) or only
    /// while it is queued (internal wake-ups, so a decision arriving mid-tick still wakes the run).
    pub dedupe_while_claimed: bool,
    /// How the job's last attempt ended without an ack, while it waits for the next one.
    pub retry_cause: Option<RetryCause>,
}

/// Why a job is being tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RetryCause {
    /// Its worker nacked it (the step failed, or storage did).
    Nacked,
    /// Its lease expired (its worker stopped heartbeating or its process died): another worker
    /// takes it over.
    LeaseExpired,
}

/// Bytes before the job id in a queue key.
const QUEUE_HEAD: usize = 12;

/// The `queue` key of a queued job: claim order is priority (highest first), then enqueue order.
pub fn queue_key(priority: i32, order: u64, job_id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(QUEUE_HEAD + job_id.len());
    k.extend_from_slice(&codec::priority_key(priority));
    k.extend_from_slice(&codec::u64_key(order));
    k.extend_from_slice(job_id.as_bytes());
    k
}

/// The job id inside a queue key.
pub fn job_id_of_queue_key(key: &[u8]) -> Option<&str> {
    key.get(QUEUE_HEAD..)
        .and_then(|b| std::str::from_utf8(b).ok())
}

/// A queue entry's value: what the claim scan needs of a queued job (when it becomes
/// available, its generation and its thread), so choosing candidates reads no job record.
pub fn queue_value(job: &Job) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + job.mailbox_id.len());
    v.extend_from_slice(&codec::u64_key(job.available_at_ms));
    v.extend_from_slice(&codec::u64_key(job.generation));
    v.extend_from_slice(job.mailbox_id.as_bytes());
    v
}

/// What a queue entry says of its job (see `queue_value`): when it becomes available, its
/// generation and its thread; `None` for an empty value.
pub fn queued_head(value: &[u8]) -> Option<(u64, u64, &[u8])> {
    let (available, rest) = value.split_first_chunk::<8>()?;
    let (generation, mailbox) = rest.split_first_chunk::<8>()?;
    Some((
        u64::from_be_bytes(*available),
        u64::from_be_bytes(*generation),
        mailbox,
    ))
}

/// The `mailbox_jobs` key of a job.
pub fn mailbox_job_key(mailbox_id: &str, order: u64) -> Vec<u8> {
    let mut k = codec::prefix(mailbox_id);
    k.extend_from_slice(&codec::u64_key(order));
    k
}

/// The prefix of every `mailbox_jobs` key of a thread.
pub fn mailbox_jobs(mailbox_id: &str) -> Vec<u8> {
    codec::prefix(mailbox_id)
}

/// A thread's generation as `mailboxes` stores it.
pub fn generation_value(generation: u64) -> [u8; 8] {
    codec::u64_key(generation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_keys_keep_their_layout_and_round_trip() {
        // Priority 0 flips to 0x7fffffff so that higher priorities sort first.
        let q = queue_key(0, 3, "job-1");
        assert_eq!(q, b"\x7f\xff\xff\xff\0\0\0\0\0\0\0\x03job-1");
        assert_eq!(job_id_of_queue_key(&q), Some("job-1"));
        assert!(
            queue_key(5, 9, "a") < queue_key(0, 1, "b"),
            "higher priority first"
        );
        assert!(
            queue_key(0, 1, "b") < queue_key(0, 2, "a"),
            "then enqueue order"
        );
        let m = mailbox_job_key("thread", 0x0102);
        assert_eq!(m, b"thread\0\0\0\0\0\0\0\x01\x02");
        assert!(m.starts_with(&mailbox_jobs("thread")));
        assert_eq!(generation_value(7), [0, 0, 0, 0, 0, 0, 0, 7]);
        let job = Job {
            job_id: "job-1".into(),
            mailbox_id: "thread".into(),
            run_id: "run-1".into(),
            origin: Default::default(),
            kind: JobKind::Start,
            priority: 0,
            dedupe_key: String::new(),
            generation: 4,
            status: JobStatus::Queued,
            available_at_ms: 9,
            attempt_count: 0,
            max_attempts: 5,
            last_error: String::new(),
            claim_token: String::new(),
            claimed_by: String::new(),
            lease_until_ms: 0,
            created_at_ms: 0,
            updated_at_ms: 0,
            order: 3,
            dedupe_while_claimed: false,
            retry_cause: None,
        };
        let v = queue_value(&job);
        assert_eq!(v, b"\0\0\0\0\0\0\0\x09\0\0\0\0\0\0\0\x04thread");
        assert_eq!(queued_head(&v), Some((9, 4, b"thread".as_slice())));
        assert_eq!(queued_head(b""), None);
    }
}
