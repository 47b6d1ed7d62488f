//! Mailbox operations usable inside any runner transaction (so the runner can commit a checkpoint,
//! its events and the job's ack with the fencing check as one atomic step), and the queue entry's
//! value the claim scan reads.

use std::time::Duration;

use arbor_shared::domain::{JobKind, JobStatus};

use super::{
    EnqueueRequest, Enqueued, Job, MailboxConfig, MailboxError, MailboxInterrupt, RetryCause,
    backlog::PassedOver,
    state::{JobEvent, transition},
};
use crate::{
    counts::{self, Counted},
    store::{
        Commit, T, Tx, TxResult, abort, codec,
        tables::{finished, jobs},
    },
};

/// The queue key of `job`.
fn queue_key(job: &Job) -> Vec<u8> {
    jobs::queue_key(job.priority, job.order, &job.job_id)
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
    if super::state::is_final(job.status) {
        tx.tree(T::Finished).insert(
            finished::key(finished::JOB, job.updated_at_ms, &job.job_id),
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
fn move_to(tx: &Tx<'_>, job: &mut Job, event: JobEvent, now_ms: u64) -> TxResult<(), MailboxError> {
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
        .insert(queue_key(&job), jobs::queue_value(&job))?;
    tx.wake(crate::store::Wake::Work);
    tx.tree(T::MailboxJobs).insert(
        jobs::mailbox_job_key(&job.mailbox_id, job.order),
        job.job_id.as_bytes(),
    )?;
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
    let due = |value: &[u8]| jobs::queued_head(value).is_some_and(|(at, _, _)| at <= now_ms);
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
                (jobs::job_id_of_queue_key(key), jobs::queued_head(value))
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
            .insert(queue_key(&job), jobs::queue_value(&job))?;
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
    tx.tree(T::Mailboxes).insert(
        mailbox_id.as_bytes(),
        jobs::generation_value(new_generation),
    )?;
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
        .insert(queue_key(&job), jobs::queue_value(&job))?;
    tx.wake(crate::store::Wake::Work);
    put_job(tx, &job)?;
    Ok(job)
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
                may_claim(&codec::encode(&job), now),
                claimable,
                "{status:?} available at {available_at_ms}, now {now}"
            );
        }
        // A record that does not decode is left to the full decode, which reports it.
        assert!(may_claim(&[0xff, 0xff], 0));
    }
}
