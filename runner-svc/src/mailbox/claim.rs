//! The claim scan: a look at the queue for due jobs no claim of this process holds, the claim
//! that takes the first it can win, and the sweep of claims whose lease ran out on a shared store.

use arbor_shared::domain::JobStatus;

use super::{
    Claim, Job, Mailbox, MailboxError, MailboxStore, Reaped,
    backlog::{Look, PassedOver},
    tx,
};
use crate::store::{T, codec};

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

impl Mailbox {
    /// On a store shared by replicas: returns to the queue the claims whose lease ran out on
    /// the store's clock, whoever held them (a replica that died, or froze, stops extending its
    /// leases and loses them to the others). The expiry is fenced by the claim token read, so
    /// a claim renewed meanwhile is left alone.
    pub(super) fn reap_abandoned(&self) -> Result<Vec<Reaped>, MailboxError> {
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
                match crate::store::tables::jobs::queued_head(&value) {
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
            .scan_prefix(crate::store::tables::jobs::mailbox_jobs(mailbox_id))
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
