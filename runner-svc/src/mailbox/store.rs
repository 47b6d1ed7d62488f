//! The mailbox over the runner's store (`MailboxStore`). The `tx` functions work inside any runner
//! transaction, so the runner can commit a checkpoint, its events and the job's ack (with the
//! fencing check) as one atomic step; `Mailbox` wraps each in a transaction of its own.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use arbor_shared::domain::{JobKind, JobStatus};

use super::{
    Claim, Clock, EnqueueRequest, Enqueued, Job, JobFilter, MailboxConfig, MailboxError,
    MailboxInterrupt, MailboxStore, Reaped, RetryCause,
    backlog::{Backlog, Look, PassedOver},
    state::{JobEvent, transition},
};
use crate::{
    counts::{self, Counted},
    store::{Commit, Store, T, Tx, TxResult, abort, codec},
};

/// Mailbox operations usable inside a larger runner transaction.
pub mod tx {
    use super::*;
    use crate::store::Tx;

    fn queue_key(job: &Job) -> Vec<u8> {
        let mut k = Vec::with_capacity(12 + job.job_id.len());
        k.extend_from_slice(&codec::priority_key(job.priority));
        k.extend_from_slice(&codec::u64_key(job.order));
        k.extend_from_slice(job.job_id.as_bytes());
        k
    }

    fn mailbox_job_key(job: &Job) -> Vec<u8> {
        let mut k = codec::prefix(&job.mailbox_id);
        k.extend_from_slice(&codec::u64_key(job.order));
        k
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

    /// The job id inside a queue key.
    pub fn job_id_of_queue_key(key: &[u8]) -> Option<&str> {
        key.get(12..).and_then(|b| std::str::from_utf8(b).ok())
    }

    /// A stored job's leading fields, read in place: what a claim needs to see that another
    /// claim took the job first, without decoding the whole record. The fields are [`Job`]'s
    /// first ten, in order (postcard is positional); a test checks it.
    #[derive(serde::Deserialize)]
    struct JobHead<'a> {
        _job_id: &'a str,
        _mailbox_id: &'a str,
        _run_id: &'a str,
        _origin: arbor_shared::domain::JobOrigin,
        _kind: JobKind,
        _priority: i32,
        _dedupe_key: &'a str,
        _generation: u64,
        status: JobStatus,
        available_at_ms: u64,
    }

    /// Whether the stored job may be claimable now; `true` when its head does not decode, so
    /// the full decode reports the damage.
    pub(super) fn may_claim(bytes: &[u8], now_ms: u64) -> bool {
        postcard::take_from_bytes::<JobHead<'_>>(bytes).map_or(true, |(head, _)| {
            head.status == JobStatus::Queued && head.available_at_ms <= now_ms
        })
    }

    pub fn get_job(tx: &Tx<'_>, job_id: &str) -> TxResult<Option<Job>, MailboxError> {
        match tx.tree(T::Jobs).get(job_id.as_bytes())? {
            None => Ok(None),
            Some(bytes) => decode_job(&bytes).map(Some),
        }
    }

    fn decode_job(bytes: &[u8]) -> TxResult<Job, MailboxError> {
        codec::decode("job", bytes).or_else(abort)
    }

    pub fn must_get_job(tx: &Tx<'_>, job_id: &str) -> TxResult<Job, MailboxError> {
        get_job(tx, job_id)?.map_or_else(|| abort(MailboxError::NotFound(job_id.into())), Ok)
    }

    fn put_job(tx: &Tx<'_>, job: &Job) -> TxResult<(), MailboxError> {
        tx.tree(T::Jobs)
            .insert(job.job_id.as_bytes(), codec::encode(job))?;
        if super::super::state::is_final(job.status) {
            tx.tree(T::Finished).insert(
                crate::store::finished_key(b'j', job.updated_at_ms, &job.job_id),
                [],
            )?;
        }
        Ok(())
    }

    pub fn generation(tx: &Tx<'_>, mailbox_id: &str) -> TxResult<u64, MailboxError> {
        Ok(tx
            .get(T::Mailboxes, mailbox_id.as_bytes())?
            .map(|b| codec::read_u64(&b))
            .unwrap_or(0))
    }

    /// Moves a job through the state machine, and the job counts with it.
    fn move_to(
        tx: &Tx<'_>,
        job: &mut Job,
        event: JobEvent,
        now_ms: u64,
    ) -> TxResult<(), MailboxError> {
        match transition(job.status, event) {
            Ok(to) => {
                counts::moved(tx, Some(Counted::Job(job.status)), Some(Counted::Job(to)))?;
                job.status = to;
                job.updated_at_ms = now_ms;
                Ok(())
            }
            Err(e) => abort(e),
        }
    }

    /// Removes the job from every index that only holds live jobs.
    fn unindex(tx: &Tx<'_>, job: &Job, was: JobStatus) -> TxResult<(), MailboxError> {
        if was == JobStatus::Queued {
            tx.tree(T::Queue).remove(queue_key(job))?;
        }
        if was == JobStatus::Claimed {
            let active = tx.get(T::Active, job.mailbox_id.as_bytes())?;
            if active.as_deref() == Some(job.job_id.as_bytes()) {
                tx.tree(T::Active).remove(job.mailbox_id.as_bytes())?;
            }
        }
        release_dedupe(tx, job)
    }

    fn release_dedupe(tx: &Tx<'_>, job: &Job) -> TxResult<(), MailboxError> {
        if job.dedupe_key.is_empty() {
            return Ok(());
        }
        let holder = tx.tree(T::Dedupe).get(job.dedupe_key.as_bytes())?;
        if holder.as_deref() == Some(job.job_id.as_bytes()) {
            tx.tree(T::Dedupe).remove(job.dedupe_key.as_bytes())?;
        }
        Ok(())
    }

    /// Enqueues a job, or returns the live job holding the same dedupe key.
    pub fn enqueue(
        tx: &Tx<'_>,
        req: &EnqueueRequest,
        order: u64,
        now_ms: u64,
        default_max_attempts: u32,
    ) -> TxResult<Enqueued, MailboxError> {
        if !req.dedupe_key.is_empty()
            && let Some(holder) = tx.tree(T::Dedupe).get(req.dedupe_key.as_bytes())?
        {
            let holder = String::from_utf8_lossy(&holder).into_owned();
            if let Some(job) = get_job(tx, &holder)? {
                // Written back unchanged, so that this transaction and a claim of the same job
                // write one row and cannot both commit. Otherwise, under snapshot isolation, a
                // wake-up could fold into a job a concurrent claim already took, whose worker
                // read the run's inbox before this transaction's decision landed in it: the
                // decision would wait with no job left to deliver it.
                put_job(tx, &job)?;
                return Ok(Enqueued {
                    job,
                    deduplicated: true,
                });
            }
        }
        let job = Job {
            job_id: req.job_id.clone(),
            mailbox_id: req.mailbox_id.clone(),
            run_id: req.run_id.clone(),
            origin: req.origin,
            kind: req.kind.unwrap_or(JobKind::Start),
            priority: req.priority,
            dedupe_key: req.dedupe_key.clone(),
            generation: generation(tx, &req.mailbox_id)?,
            status: JobStatus::Queued,
            available_at_ms: req.available_at_ms.max(now_ms),
            attempt_count: 0,
            max_attempts: if req.max_attempts == 0 {
                default_max_attempts
            } else {
                req.max_attempts
            },
            last_error: String::new(),
            claim_token: String::new(),
            claimed_by: String::new(),
            lease_until_ms: 0,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            order,
            dedupe_while_claimed: req.dedupe_while_claimed,
            retry_cause: None,
        };
        put_job(tx, &job)?;
        counts::moved(tx, None, Some(Counted::Job(job.status)))?;
        tx.tree(T::Queue)
            .insert(queue_key(&job), queue_value(&job))?;
        tx.wake(crate::store::Wake::Work);
        tx.tree(T::MailboxJobs)
            .insert(mailbox_job_key(&job), job.job_id.as_bytes())?;
        if !job.dedupe_key.is_empty() {
            tx.tree(T::Dedupe)
                .insert(job.dedupe_key.as_bytes(), job.job_id.as_bytes())?;
        }
        Ok(Enqueued {
            job,
            deduplicated: false,
        })
    }

    /// Why a claim attempt on one candidate did not succeed.
    #[derive(Debug)]
    pub enum ClaimMiss {
        /// Someone else claimed or changed it first.
        Lost,
        /// Its thread already has a claimed job (this one).
        ThreadBusy(Vec<u8>),
        /// Its generation is older than the thread's: superseded instead.
        Superseded(Box<Job>),
    }

    /// Tries to claim one specific queued job.
    pub fn claim(
        tx: &Tx<'_>,
        job_id: &str,
        worker_id: &str,
        token: &str,
        now_ms: u64,
        lease: Duration,
    ) -> TxResult<Result<Job, ClaimMiss>, MailboxError> {
        // Concurrent claimers try the same head of the queue, so most candidates a claim sees
        // in a shared transaction were just taken by the claim before it.
        let mut job = match tx.tree(T::Jobs).get(job_id.as_bytes())? {
            Some(bytes) if may_claim(&bytes, now_ms) => decode_job(&bytes)?,
            _ => return Ok(Err(ClaimMiss::Lost)),
        };
        if job.status != JobStatus::Queued || job.available_at_ms > now_ms {
            return Ok(Err(ClaimMiss::Lost));
        }
        if job.generation < generation(tx, &job.mailbox_id)? {
            unindex(tx, &job, JobStatus::Queued)?;
            move_to(tx, &mut job, JobEvent::Supersede, now_ms)?;
            put_job(tx, &job)?;
            return Ok(Err(ClaimMiss::Superseded(Box::new(job))));
        }
        if let Some(holder) = tx.get(T::Active, job.mailbox_id.as_bytes())? {
            return Ok(Err(ClaimMiss::ThreadBusy(holder)));
        }
        tx.tree(T::Queue).remove(queue_key(&job))?;
        move_to(tx, &mut job, JobEvent::Claim, now_ms)?;
        job.attempt_count += 1;
        job.claim_token = token.to_string();
        job.claimed_by = worker_id.to_string();
        job.lease_until_ms = now_ms + lease.as_millis() as u64;
        tx.tree(T::Active)
            .insert(job.mailbox_id.as_bytes(), job.job_id.as_bytes())?;
        if !job.dedupe_while_claimed {
            release_dedupe(tx, &job)?;
        }
        put_job(tx, &job)?;
        Ok(Ok(job))
    }

    /// What a claim transaction found.
    #[derive(Debug)]
    pub struct Claimed {
        pub job: Option<Job>,
        /// Claimed, and another job looked claimable too (another worker should look).
        pub more: bool,
        /// Jobs passed over because their thread was busy.
        pub busy: PassedOver,
    }

    /// Queue entries a claim takes hold of at once.
    const CLAIM_PAGE: usize = 2;

    /// Claims the first of `candidates` (queue keys in claim order, from a scan outside the
    /// transaction) that can run now. The queue entries are taken with
    /// [`lock_first`](crate::store::Txn::lock_first): concurrent claimers pass over each
    /// other's (on PostgreSQL, `FOR UPDATE SKIP LOCKED`) and take different jobs instead of
    /// failing each other's transactions. A job of an older generation is superseded on the
    /// way; one whose thread is busy is passed over.
    pub fn claim_any(
        tx: &Tx<'_>,
        candidates: &[Vec<u8>],
        worker_id: &str,
        token: &str,
        now_ms: u64,
        lease: Duration,
    ) -> TxResult<Claimed, MailboxError> {
        let due = |value: &[u8]| queued_head(value).is_some_and(|(at, _, _)| at <= now_ms);
        let mut rest = candidates;
        let mut busy = Vec::new();
        loop {
            let held = tx.tree(T::Queue).lock_first(rest, CLAIM_PAGE)?;
            let Some((last, _)) = held.last() else {
                return Ok(Claimed {
                    job: None,
                    more: false,
                    busy,
                });
            };
            let after = rest
                .iter()
                .position(|k| k == last)
                .map_or(rest.len(), |i| i + 1);
            rest = &rest[after..];
            for (i, (key, value)) in held.iter().enumerate() {
                let (Some(job_id), Some((_, _, mailbox))) =
                    (job_id_of_queue_key(key), queued_head(value))
                else {
                    continue;
                };
                if !due(value) {
                    continue;
                }
                tx.prefetch(&[
                    (T::Jobs, job_id.as_bytes()),
                    (T::Mailboxes, mailbox),
                    (T::Active, mailbox),
                ])?;
                match claim(tx, job_id, worker_id, token, now_ms, lease)? {
                    Ok(job) => {
                        let more = held[i + 1..].iter().any(|(_, v)| due(v)) || !rest.is_empty();
                        return Ok(Claimed {
                            job: Some(job),
                            more,
                            busy,
                        });
                    }
                    Err(ClaimMiss::ThreadBusy(holder)) => busy.push((mailbox.to_vec(), holder)),
                    Err(_) => {}
                }
            }
        }
    }

    /// The fencing check: the job is claimed under exactly this token.
    pub fn check_fence(tx: &Tx<'_>, job_id: &str, token: &str) -> TxResult<Job, MailboxError> {
        let job = must_get_job(tx, job_id)?;
        if job.status != JobStatus::Claimed || job.claim_token != token || token.is_empty() {
            return abort(MailboxError::StaleClaim {
                job_id: job_id.into(),
            });
        }
        Ok(job)
    }

    pub fn ack(tx: &Tx<'_>, job_id: &str, token: &str, now_ms: u64) -> TxResult<Job, MailboxError> {
        let mut job = check_fence(tx, job_id, token)?;
        unindex(tx, &job, JobStatus::Claimed)?;
        move_to(tx, &mut job, JobEvent::Ack, now_ms)?;
        job.claim_token.clear();
        put_job(tx, &job)?;
        Ok(job)
    }

    /// Retries (Queued after backoff) or dead-letters a claimed job. Shared by nack and lease
    /// expiry: both count as a failed attempt.
    fn fail_attempt(
        tx: &Tx<'_>,
        mut job: Job,
        event: JobEvent,
        error: &str,
        now_ms: u64,
        backoff: Duration,
    ) -> TxResult<Job, MailboxError> {
        unindex(tx, &job, JobStatus::Claimed)?;
        let event = if event != JobEvent::NackPermanent && job.attempt_count >= job.max_attempts {
            JobEvent::AttemptsExhausted
        } else {
            event
        };
        job.retry_cause = Some(match event {
            JobEvent::LeaseExpired => RetryCause::LeaseExpired,
            _ => RetryCause::Nacked,
        });
        move_to(tx, &mut job, event, now_ms)?;
        job.last_error = error.to_string();
        job.claim_token.clear();
        job.claimed_by.clear();
        job.lease_until_ms = 0;
        if job.status == JobStatus::Queued {
            job.available_at_ms = now_ms + backoff.as_millis() as u64;
            tx.tree(T::Queue)
                .insert(queue_key(&job), queue_value(&job))?;
            tx.wake(crate::store::Wake::Work);
            if !job.dedupe_key.is_empty()
                && tx.tree(T::Dedupe).get(job.dedupe_key.as_bytes())?.is_none()
            {
                tx.tree(T::Dedupe)
                    .insert(job.dedupe_key.as_bytes(), job.job_id.as_bytes())?;
            }
        }
        put_job(tx, &job)?;
        Ok(job)
    }

    pub fn nack(
        tx: &Tx<'_>,
        job_id: &str,
        token: &str,
        error: &str,
        permanent: bool,
        now_ms: u64,
        cfg: &MailboxConfig,
    ) -> TxResult<Job, MailboxError> {
        let job = check_fence(tx, job_id, token)?;
        let backoff = cfg.backoff(job.attempt_count);
        let event = if permanent {
            JobEvent::NackPermanent
        } else {
            JobEvent::NackRetry
        };
        fail_attempt(tx, job, event, error, now_ms, backoff)
    }

    /// Lease expiry of the claim `token` (no-op `None` when the job moved on meanwhile).
    pub fn expire(
        tx: &Tx<'_>,
        job_id: &str,
        token: &str,
        now_ms: u64,
    ) -> TxResult<Option<Job>, MailboxError> {
        let Some(job) = get_job(tx, job_id)? else {
            return Ok(None);
        };
        if job.status != JobStatus::Claimed || job.claim_token != token {
            return Ok(None);
        }
        fail_attempt(
            tx,
            job,
            JobEvent::LeaseExpired,
            "lease expired",
            now_ms,
            Duration::ZERO,
        )
        .map(Some)
    }

    pub fn cancel(tx: &Tx<'_>, job_id: &str, now_ms: u64) -> TxResult<Job, MailboxError> {
        let mut job = must_get_job(tx, job_id)?;
        let was = job.status;
        move_to(tx, &mut job, JobEvent::Cancel, now_ms)?;
        unindex(tx, &job, was)?;
        job.claim_token.clear();
        put_job(tx, &job)?;
        Ok(job)
    }

    pub fn supersede(tx: &Tx<'_>, job_id: &str, now_ms: u64) -> TxResult<Job, MailboxError> {
        let mut job = must_get_job(tx, job_id)?;
        move_to(tx, &mut job, JobEvent::Supersede, now_ms)?;
        unindex(tx, &job, JobStatus::Queued)?;
        put_job(tx, &job)?;
        Ok(job)
    }

    /// How a transaction that runs [`interrupt`] in the batched commit must commit. The
    /// interrupt reads the thread's claimed job and writes its generation; a claim of a job of
    /// the thread reads the generation and writes the claimed job. Unless the job was among
    /// `candidates` (then both write it), no row is written by both, and under snapshot
    /// isolation the two would commit blind to each other: the job, queued before the
    /// interrupt, would run at the old generation, and the interrupt would not name it as the
    /// thread's running job.
    pub const INTERRUPT_COMMIT: Commit = Commit::Serializable;

    /// Bumps the thread's generation; queued jobs of older generations among `candidates` are
    /// superseded. Returns the new generation, the superseded jobs and the claimed job.
    pub fn interrupt(
        tx: &Tx<'_>,
        mailbox_id: &str,
        candidates: &[String],
        now_ms: u64,
    ) -> TxResult<MailboxInterrupt, MailboxError> {
        let new_generation = generation(tx, mailbox_id)? + 1;
        tx.tree(T::Mailboxes)
            .insert(mailbox_id.as_bytes(), codec::u64_key(new_generation))?;
        let superseded = supersede_older(tx, candidates, new_generation, now_ms)?;
        let active_job = match tx.get(T::Active, mailbox_id.as_bytes())? {
            Some(id) => get_job(tx, &String::from_utf8_lossy(&id))?,
            None => None,
        };
        Ok(MailboxInterrupt {
            new_generation,
            active_job,
            superseded_count: superseded.len() as u32,
            superseded,
        })
    }

    /// Supersedes those of `candidates` that are queued at a generation older than
    /// `generation`; returns them.
    pub fn supersede_older(
        tx: &Tx<'_>,
        candidates: &[String],
        generation: u64,
        now_ms: u64,
    ) -> TxResult<Vec<Job>, MailboxError> {
        let mut superseded = Vec::new();
        for id in candidates {
            if let Some(job) = get_job(tx, id)?
                && job.status == JobStatus::Queued
                && job.generation < generation
            {
                superseded.push(supersede(tx, id, now_ms)?);
            }
        }
        Ok(superseded)
    }

    /// Returns a dead-lettered job to the queue, at its thread's current generation: the
    /// operator asks for it to run now, and a job of an older generation would only be
    /// superseded when claimed (an interrupt since it failed did not touch it, its run having
    /// ended), leaving the run it revives queued with no job.
    pub fn requeue(tx: &Tx<'_>, job_id: &str, now_ms: u64) -> TxResult<Job, MailboxError> {
        let mut job = must_get_job(tx, job_id)?;
        move_to(tx, &mut job, JobEvent::Requeue, now_ms)?;
        job.generation = generation(tx, &job.mailbox_id)?;
        job.attempt_count = 0;
        job.available_at_ms = now_ms;
        job.last_error.clear();
        job.retry_cause = None;
        tx.tree(T::Queue)
            .insert(queue_key(&job), queue_value(&job))?;
        tx.wake(crate::store::Wake::Work);
        put_job(tx, &job)?;
        Ok(job)
    }
}

#[derive(Debug, Clone)]
struct Lease {
    token: String,
    deadline: Duration,
}

/// The leases this process holds, on the monotonic clock; the reaper returns to the queue
/// those that run out. Shared with the claims a runner transaction makes for a waiting worker
/// (`runs::handoff`): such a claim is tracked as it is made, so its lease runs out like any
/// other when the claim never reaches its worker (the caller went away before the hand-off,
/// the worker stopped).
#[derive(Clone)]
pub struct Leases {
    held: Arc<Mutex<HashMap<String, Lease>>>,
    clock: Arc<dyn Clock>,
    lease: Duration,
}

impl Leases {
    /// How long a claim holds its job without an extension.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Tracks `token`'s lease on `job_id`, running out one lease from now. A claim that does
    /// not commit leaves an entry that runs out and changes nothing: the reaper's expiry is
    /// fenced by the token.
    pub fn track(&self, job_id: &str, token: &str) {
        let deadline = self.clock.mono() + self.lease;
        if let Ok(mut held) = self.held.lock() {
            held.insert(
                job_id.to_string(),
                Lease {
                    token: token.to_string(),
                    deadline,
                },
            );
        }
    }

    /// Stops tracking `job_id`'s lease, whoever holds it.
    fn forget(&self, job_id: &str) {
        if let Ok(mut held) = self.held.lock() {
            held.remove(job_id);
        }
    }

    /// Stops tracking `job_id`'s lease if `token` still holds it (a newer claim's stays).
    fn forget_if(&self, job_id: &str, token: &str) {
        if let Ok(mut held) = self.held.lock()
            && held.get(job_id).is_some_and(|l| l.token == token)
        {
            held.remove(job_id);
        }
    }

    /// Whether this process tracks a lease on `job_id` (a claim of one of its workers).
    fn holds(&self, job_id: &[u8]) -> bool {
        let Ok(job_id) = std::str::from_utf8(job_id) else {
            return false;
        };
        self.held.lock().is_ok_and(|held| held.contains_key(job_id))
    }

    /// Whether `token` holds an unexpired lease on `job_id`.
    fn valid(&self, job_id: &str, token: &str) -> bool {
        let now = self.clock.mono();
        self.held
            .lock()
            .ok()
            .and_then(|held| held.get(job_id).cloned())
            .is_some_and(|l| l.token == token && l.deadline > now)
    }

    /// The leases that have run out, by job id in order (a fixed order keeps retries
    /// deterministic, e.g. which of two jobs sharing a dedupe key takes it back first).
    fn run_out(&self) -> Vec<(String, Lease)> {
        let now = self.clock.mono();
        let mut expired: Vec<(String, Lease)> = match self.held.lock() {
            Ok(held) => held
                .iter()
                .filter(|(_, l)| l.deadline <= now)
                .map(|(id, l)| (id.clone(), l.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        expired.sort_by(|a, b| a.0.cmp(&b.0));
        expired
    }
}

/// What a look at the queue found (see `Mailbox::claim_candidates`).
struct Candidates {
    /// Queue keys of jobs a claim may win now, in claim order.
    keys: Vec<Vec<u8>>,
    /// When the next delayed job becomes available ("now": look again).
    next: Option<u64>,
    passed_over: PassedOver,
}

/// A due job a look found: its queue key, and its generation and thread (`None`: a value that
/// does not parse, left to the claim to judge).
type Due = (Vec<u8>, Option<(u64, Vec<u8>)>);

/// A claim under way: its look at the queue, what that found, and its token.
struct Begun<'b> {
    look: Look<'b>,
    token: String,
    found: Candidates,
}

/// The durable mailbox. Leases are tracked here on the monotonic clock; the token in the store is the
/// fencing authority.
pub struct Mailbox {
    store: Store,
    clock: Arc<dyn Clock>,
    cfg: MailboxConfig,
    leases: Leases,
    backlog: Backlog,
}

impl Mailbox {
    /// Opens the mailbox. Jobs left Claimed by a previous process lost their worker with it: they
    /// go back to Queued now (the crash counts as an attempt). On a store shared with other
    /// replicas a claim may be another live replica's, so only claims whose lease has run out
    /// go back (the others follow when theirs do: see `reap_expired`).
    pub fn open(
        store: Store,
        clock: Arc<dyn Clock>,
        cfg: MailboxConfig,
    ) -> Result<(Self, Vec<Reaped>), MailboxError> {
        let leases = Leases {
            held: Arc::default(),
            clock: clock.clone(),
            lease: cfg.lease,
        };
        let mailbox = Self {
            store,
            clock,
            cfg,
            leases,
            backlog: Backlog::default(),
        };
        let mut recovered = Vec::new();
        for entry in mailbox.store.tree(T::Active).iter() {
            let (_, job_id) = entry?;
            let job_id = String::from_utf8_lossy(&job_id).into_owned();
            let Some(job) = mailbox.get(&job_id)? else {
                continue;
            };
            let now = mailbox.clock.wall_ms();
            if mailbox.store.shared() && job.lease_until_ms > now {
                continue;
            }
            let token = job.claim_token.clone();
            let expired = mailbox
                .store
                .transact(|t| tx::expire(t, &job_id, &token, now))?;
            if let Some(job) = expired {
                recovered.push(Reaped { job });
            }
        }
        Ok((mailbox, recovered))
    }

    pub fn config(&self) -> &MailboxConfig {
        &self.cfg
    }

    /// [`MailboxStore::enqueue`] through the store's batched commit, the way the runner's RPCs
    /// commit: resolves once the job is durable, sharing one transaction and one flush with
    /// every other commit queued meanwhile.
    pub async fn enqueue_durable(&self, req: EnqueueRequest) -> Result<Enqueued, MailboxError> {
        Ok(self.store.commit(self.enqueue_body(req)?).await?)
    }

    /// [`MailboxStore::ack`] through the batched commit: resolves once the ack is durable.
    pub async fn ack_durable(&self, job_id: &str, token: &str) -> Result<Job, MailboxError> {
        let job = self.store.commit(self.ack_body(job_id, token)).await?;
        self.forget_lease(job_id);
        Ok(job)
    }

    /// The transaction body of an enqueue, for either way of committing it.
    fn enqueue_body(
        &self,
        req: EnqueueRequest,
    ) -> Result<impl Fn(&Tx<'_>) -> TxResult<Enqueued, MailboxError> + Send + 'static, MailboxError>
    {
        let order = self.store.next_id()?;
        let now = self.now();
        let default_max = self.cfg.default_max_attempts;
        Ok(move |t: &Tx<'_>| tx::enqueue(t, &req, order, now, default_max))
    }

    /// The transaction body of an ack, for either way of committing it.
    fn ack_body(
        &self,
        job_id: &str,
        token: &str,
    ) -> impl Fn(&Tx<'_>) -> TxResult<Job, MailboxError> + Send + 'static {
        let now = self.now();
        let (id, token) = (job_id.to_string(), token.to_string());
        move |t: &Tx<'_>| tx::ack(t, &id, &token, now)
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The leases this process tracks, for a claim made inside a runner transaction.
    pub fn leases(&self) -> Leases {
        self.leases.clone()
    }

    /// Stops tracking a lease (the job was acked, nacked or cancelled).
    pub fn forget_lease(&self, job_id: &str) {
        self.leases.forget(job_id);
    }

    /// Whether `token` still holds an unexpired lease on the job (monotonic clock).
    pub fn lease_valid(&self, job_id: &str, token: &str) -> bool {
        self.leases.valid(job_id, token)
    }

    fn now(&self) -> u64 {
        self.clock.wall_ms()
    }

    /// Notes that a worker of this process finished its claim of `job` (the commit that acked
    /// it is done); whether the worker should look at the queue before it waits (see
    /// [`Backlog`]).
    pub fn finished(&self, job: &Job) -> bool {
        self.backlog.finished(job.mailbox_id.as_bytes(), self.now())
    }

    /// When the earliest delayed job the last look saw becomes due.
    pub fn next_due(&self) -> Option<u64> {
        self.backlog.next_due()
    }
}

impl MailboxStore for Mailbox {
    fn enqueue(&self, req: EnqueueRequest) -> Result<Enqueued, MailboxError> {
        Ok(self.store.transact(self.enqueue_body(req)?)?)
    }

    fn claim(&self, worker_id: &str) -> Result<Option<Claim>, MailboxError> {
        self.claim_or_next(worker_id).map(|(claim, _)| claim)
    }

    fn ack(&self, job_id: &str, token: &str) -> Result<Job, MailboxError> {
        let job = self.store.transact(self.ack_body(job_id, token))?;
        self.forget_lease(job_id);
        Ok(job)
    }

    fn nack(
        &self,
        job_id: &str,
        token: &str,
        error: &str,
        permanent: bool,
    ) -> Result<Job, MailboxError> {
        let now = self.now();
        let cfg = &self.cfg;
        let job = self
            .store
            .transact(|t| tx::nack(t, job_id, token, error, permanent, now, cfg))?;
        self.forget_lease(job_id);
        Ok(job)
    }

    fn extend_lease(&self, job_id: &str, token: &str) -> Result<Job, MailboxError> {
        if !self.lease_valid(job_id, token) {
            return Err(MailboxError::StaleClaim {
                job_id: job_id.into(),
            });
        }
        let now = self.now();
        let lease_ms = self.cfg.lease.as_millis() as u64;
        let job = self.store.transact(|t| {
            let mut job = tx::check_fence(t, job_id, token)?;
            job.lease_until_ms = now + lease_ms;
            job.updated_at_ms = now;
            t.tree(T::Jobs)
                .insert(job.job_id.as_bytes(), codec::encode(&job))?;
            Ok(job)
        })?;
        self.leases.track(job_id, token);
        Ok(job)
    }

    fn cancel(&self, job_id: &str) -> Result<Job, MailboxError> {
        let now = self.now();
        let job = self.store.transact(|t| tx::cancel(t, job_id, now))?;
        self.forget_lease(job_id);
        Ok(job)
    }

    fn interrupt(&self, mailbox_id: &str) -> Result<MailboxInterrupt, MailboxError> {
        let candidates = self.queued_of(mailbox_id)?;
        let now = self.now();
        Ok(self
            .store
            .transact(|t| tx::interrupt(t, mailbox_id, &candidates, now))?)
    }

    fn requeue(&self, job_id: &str) -> Result<Job, MailboxError> {
        let now = self.now();
        Ok(self.store.transact(|t| tx::requeue(t, job_id, now))?)
    }

    fn reap_expired(&self) -> Result<Vec<Reaped>, MailboxError> {
        let mut reaped = Vec::new();
        for (job_id, lease) in self.leases.run_out() {
            let now = self.now();
            let outcome = self
                .store
                .transact(|t| tx::expire(t, &job_id, &lease.token, now))?;
            self.leases.forget_if(&job_id, &lease.token);
            if let Some(job) = outcome {
                reaped.push(Reaped { job });
            }
        }
        if self.store.shared() {
            reaped.extend(self.reap_abandoned()?);
        }
        Ok(reaped)
    }

    fn get(&self, job_id: &str) -> Result<Option<Job>, MailboxError> {
        match self.store.tree(T::Jobs).get(job_id.as_bytes())? {
            None => Ok(None),
            Some(bytes) => Ok(Some(codec::decode("job", &bytes)?)),
        }
    }

    fn list(
        &self,
        filter: &JobFilter,
        after: &str,
        limit: usize,
    ) -> Result<Vec<Job>, MailboxError> {
        let mut out = Vec::new();
        let matches = |job: &Job| {
            (filter.run_id.is_empty() || job.run_id == filter.run_id)
                && (filter.mailbox_id.is_empty() || job.mailbox_id == filter.mailbox_id)
                && (filter.statuses.is_empty() || filter.statuses.contains(&job.status))
        };
        if filter.mailbox_id.is_empty() {
            for entry in self.store.tree(T::Jobs).after(after) {
                let (_, bytes) = entry?;
                let job: Job = codec::decode("job", &bytes)?;
                if matches(&job) {
                    out.push(job);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
        } else {
            let mut past_cursor = after.is_empty();
            for entry in self
                .store
                .tree(T::MailboxJobs)
                .scan_prefix(codec::prefix(&filter.mailbox_id))
            {
                let (_, id) = entry?;
                let id = String::from_utf8_lossy(&id).into_owned();
                if !past_cursor {
                    past_cursor = id == after;
                    continue;
                }
                if let Some(job) = self.get(&id)?
                    && matches(&job)
                {
                    out.push(job);
                    if out.len() >= limit {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    fn next_available_at(&self) -> Result<Option<u64>, MailboxError> {
        let now = self.now();
        let mut next: Option<u64> = None;
        for entry in self.store.tree(T::Queue).iter().values() {
            if let Some((available_at, _, _)) = tx::queued_head(&entry?)
                && available_at > now
            {
                next = Some(next.map_or(available_at, |n| n.min(available_at)));
            }
        }
        Ok(next)
    }
}

impl Mailbox {
    /// On a store shared by replicas: returns to the queue the claims whose lease ran out on
    /// the store's clock, whoever held them (a replica that died, or froze, stops extending its
    /// leases and loses them to the others). The expiry is fenced by the claim token read, so
    /// a claim renewed meanwhile is left alone.
    fn reap_abandoned(&self) -> Result<Vec<Reaped>, MailboxError> {
        let now = self.now();
        let mut reaped = Vec::new();
        for entry in self.store.tree(T::Active).all() {
            let (_, job_id) = entry?;
            let job_id = String::from_utf8_lossy(&job_id).into_owned();
            let Some(job) = self.get(&job_id)? else {
                continue;
            };
            if job.status != JobStatus::Claimed || job.lease_until_ms > now {
                continue;
            }
            let token = job.claim_token.clone();
            let outcome = self.store.transact(|t| {
                if tx::get_job(t, &job_id)?.is_some_and(|j| j.lease_until_ms > now) {
                    return Ok(None);
                }
                tx::expire(t, &job_id, &token, now)
            })?;
            self.forget_lease(&job_id);
            if let Some(job) = outcome {
                reaped.push(Reaped { job });
            }
        }
        Ok(reaped)
    }

    /// Claims like `MailboxStore::claim`; when nothing can be claimed, also says when the next
    /// delayed job becomes available (found on the same scan), so an idle worker knows how long
    /// it may sleep; after a claim, "now" when more work seemed to be waiting.
    pub fn claim_or_next(
        &self,
        worker_id: &str,
    ) -> Result<(Option<Claim>, Option<u64>), MailboxError> {
        let now = self.now();
        let begun = match self.begin_claim(worker_id, now)? {
            Ok(begun) => begun,
            Err(next) => return Ok((None, next)),
        };
        let (candidates, token, lease) = (&begun.found.keys, &begun.token, self.cfg.lease);
        let claimed = self
            .store
            .transact(|t| tx::claim_any(t, candidates, worker_id, token, now, lease))?;
        Ok(self.claimed(begun, claimed, now))
    }

    /// [`claim_or_next`](Self::claim_or_next) for the worker pool: the same claim transaction,
    /// committed without waiting for durability (a claim lost in a crash leaves its job queued,
    /// or is undone at start-up). The embedded store runs it in the batched commit, with
    /// whatever else is being committed; PostgreSQL in a transaction of its own, concurrently
    /// with other claimers.
    pub async fn claim_next(
        &self,
        worker_id: &str,
    ) -> Result<(Option<Claim>, Option<u64>), MailboxError> {
        let now = self.now();
        let mut begun = match self.begin_claim(worker_id, now)? {
            Ok(begun) => begun,
            Err(next) => return Ok((None, next)),
        };
        let candidates = std::mem::take(&mut begun.found.keys);
        let (worker, token, lease) = (worker_id.to_string(), begun.token.clone(), self.cfg.lease);
        let claimed = self
            .store
            .apply(move |t| tx::claim_any(t, &candidates, &worker, &token, now, lease))
            .await?;
        Ok(self.claimed(begun, claimed, now))
    }

    /// What a claim transaction's outcome means to the worker: the claim, with its lease
    /// tracked (and "now" when more work seemed to be waiting, so that another worker looks),
    /// or, when every candidate went to another worker, what the scan said of the rest: "now"
    /// if it stopped at its limit, otherwise when the next delayed job is due. (The workers
    /// that took the candidates pass the wake-up on if they saw more.)
    fn claimed(
        &self,
        begun: Begun<'_>,
        claimed: tx::Claimed,
        now: u64,
    ) -> (Option<Claim>, Option<u64>) {
        let Begun { look, token, found } = begun;
        let (next, mut busy) = (found.next, found.passed_over);
        busy.extend(claimed.busy);
        match claimed.job {
            Some(job) => {
                self.leases.track(&job.job_id, &token);
                let next = self.noted(look, busy, next, now);
                (
                    Some(Claim { job, token }),
                    claimed.more.then_some(now).or(next.filter(|&at| at <= now)),
                )
            }
            None => (None, self.noted(look, busy, next, now)),
        }
    }

    /// The start of a claim: a look at the queue, and the claim's token; `Err` with when to
    /// look again when the look found nothing to claim.
    fn begin_claim(
        &self,
        worker_id: &str,
        now: u64,
    ) -> Result<Result<Begun<'_>, Option<u64>>, MailboxError> {
        let look = self.backlog.look();
        let found = self.claim_candidates(now)?;
        if found.keys.is_empty() {
            return Ok(Err(self.noted(look, found.passed_over, found.next, now)));
        }
        let token = self.claim_token(worker_id)?;
        Ok(Ok(Begun { look, token, found }))
    }

    /// Notes what a look could not claim (see [`Backlog`]): due jobs behind a busy thread and
    /// when the next delayed job is due. A thread busy with a job of this process is looked at
    /// again when that job is done; one busy with another replica's is that replica's to look
    /// at, which a notification tells. Answers when the looking worker should look again.
    fn noted(&self, look: Look<'_>, busy: PassedOver, next: Option<u64>, now: u64) -> Option<u64> {
        let (ours, theirs): (Vec<_>, Vec<_>) = busy
            .into_iter()
            .partition(|(_, holder)| self.leases.holds(holder));
        if !theirs.is_empty() {
            self.store.announce_work();
        }
        let ours = ours.into_iter().map(|(thread, _)| thread).collect();
        match look.found(ours, next) {
            true => Some(now),
            false => next,
        }
    }

    /// The first few queued jobs a claim may win now (their queue keys, in claim order), and
    /// when the next delayed job becomes available. A cheap look outside any transaction: what
    /// cannot be claimed now is skipped, so the transaction per claim is spent on a job that
    /// will be won. When the scan stops early at the limit, "next" is now, so a worker that
    /// loses every race looks again. Also the due jobs it passed over because their thread's
    /// job is claimed.
    fn claim_candidates(&self, now: u64) -> Result<Candidates, MailboxError> {
        const MAX_CANDIDATES: usize = 16;
        let mut found = Candidates {
            keys: Vec::new(),
            next: None,
            passed_over: PassedOver::new(),
        };
        let mut queue = self.store.tree(T::Queue).iter();
        loop {
            // The next due jobs, as many as candidates are still wanted, each with its thread
            // and generation (a key whose value does not parse is left to the claim to judge).
            let wanted = MAX_CANDIDATES - found.keys.len();
            let mut due: Vec<Due> = Vec::with_capacity(wanted);
            for entry in queue.by_ref() {
                let (key, value) = entry?;
                match tx::queued_head(&value) {
                    Some((available_at, _, _)) if available_at > now => {
                        found.next = Some(found.next.map_or(available_at, |n| n.min(available_at)));
                        continue;
                    }
                    Some((_, generation, mailbox_id)) => {
                        due.push((key, Some((generation, mailbox_id.to_vec()))));
                    }
                    None => due.push((key, None)),
                }
                if due.len() == wanted {
                    break;
                }
            }
            let more = due.len() == wanted;
            // Which of their threads have a claimed job, and at which generation each thread
            // is: one read of just those threads' rows, so a look costs the same however many
            // jobs are running.
            let keys: Vec<(T, &[u8])> = due
                .iter()
                .filter_map(|(_, head)| head.as_ref())
                .flat_map(|(_, m)| [(T::Active, m.as_slice()), (T::Mailboxes, m.as_slice())])
                .collect();
            let rows = match keys.is_empty() {
                true => Vec::new(),
                false => self.store.get_many(&keys)?,
            };
            let mut rows = rows.into_iter();
            for (key, head) in due {
                if let Some((generation, mailbox_id)) = head {
                    let (holder, current) = (rows.next().flatten(), rows.next().flatten());
                    let current = current.map_or(0, |v| codec::read_u64(&v));
                    // A job of an older generation is a candidate even on a busy thread: the
                    // claim transaction supersedes it.
                    if let Some(holder) = holder
                        && generation >= current
                    {
                        found.passed_over.push((mailbox_id, holder));
                        continue;
                    }
                }
                found.keys.push(key);
            }
            if found.keys.len() == MAX_CANDIDATES {
                // Stopped early: a worker that loses every race looks again.
                found.next = Some(now);
                return Ok(found);
            }
            if !more {
                return Ok(found);
            }
        }
    }

    /// Unique per claim without a syscall (a random token would cost one each time).
    pub(crate) fn claim_token(&self, worker_id: &str) -> Result<String, MailboxError> {
        Ok(format!("{worker_id}-{}", self.store.next_id()?))
    }

    /// Ids of the thread's queued jobs (candidates for an interrupt).
    pub fn queued_of(&self, mailbox_id: &str) -> Result<Vec<String>, MailboxError> {
        let ids = self
            .store
            .tree(T::MailboxJobs)
            .scan_prefix(codec::prefix(mailbox_id))
            .values()
            .collect::<Result<Vec<_>, _>>()?;
        // The jobs read together: one round trip on a store whose reads are round trips.
        let keys: Vec<(T, &[u8])> = ids.iter().map(|id| (T::Jobs, id.as_slice())).collect();
        let mut queued = Vec::new();
        for (id, job) in ids.iter().zip(self.store.get_many(&keys)?) {
            if let Some(bytes) = job
                && codec::decode::<Job>("job", &bytes)?.status == JobStatus::Queued
            {
                queued.push(String::from_utf8_lossy(id).into_owned());
            }
        }
        Ok(queued)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `JobHead` must read a stored job's status and available-at time exactly as `Job` does:
    /// postcard is positional, so a field added to `Job` before them breaks it.
    #[test]
    fn a_jobs_head_reads_its_status_and_available_time() {
        for (status, available_at_ms, now, claimable) in [
            (JobStatus::Queued, 1_000, 1_000, true),
            (JobStatus::Queued, 1_001, 1_000, false),
            (JobStatus::Claimed, 0, 1_000, false),
            (JobStatus::Accepted, 0, 1_000, false),
        ] {
            let job = Job {
                job_id: "job-1".into(),
                mailbox_id: "thread-1".into(),
                run_id: "run-1".into(),
                origin: Default::default(),
                kind: JobKind::Start,
                priority: -3,
                dedupe_key: "key".into(),
                generation: 7,
                status,
                available_at_ms,
                attempt_count: 2,
                max_attempts: 5,
                last_error: String::new(),
                claim_token: "token".into(),
                claimed_by: "worker".into(),
                lease_until_ms: 9,
                created_at_ms: 1,
                updated_at_ms: 2,
                order: 3,
                dedupe_while_claimed: true,
                retry_cause: None,
            };
            assert_eq!(
                tx::may_claim(&codec::encode(&job), now),
                claimable,
                "{status:?} available at {available_at_ms}, now {now}"
            );
        }
        // A record that does not decode is left to the full decode, which reports it.
        assert!(tx::may_claim(&[0xff, 0xff], 0));
    }
}
