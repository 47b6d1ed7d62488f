//! The mailbox over the runner's store (`MailboxStore`): `Mailbox` wraps each of the `tx`
//! operations in a transaction of its own; the claim scan is in `claim`, leases in `leases`.

use std::sync::Arc;

use super::{
    Claim, Clock, EnqueueRequest, Enqueued, Job, JobFilter, Leases, MailboxConfig, MailboxError,
    MailboxInterrupt, MailboxStore, Reaped, backlog::Backlog, tx,
};
use crate::store::{Store, T, Tx, TxResult, codec};

/// The durable mailbox. Leases are tracked here on the monotonic clock; the token in the store is the
/// fencing authority.
pub struct Mailbox {
    pub(super) store: Store,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) cfg: MailboxConfig,
    pub(super) leases: Leases,
    pub(super) backlog: Backlog,
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
        let leases = Leases::new(clock.clone(), cfg.lease);
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

    pub(super) fn now(&self) -> u64 {
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
                .scan_prefix(crate::store::tables::jobs::mailbox_jobs(&filter.mailbox_id))
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
            if let Some((available_at, _, _)) = crate::store::tables::jobs::queued_head(&entry?)
                && available_at > now
            {
                next = Some(next.map_or(available_at, |n| n.min(available_at)));
            }
        }
        Ok(next)
    }
}
