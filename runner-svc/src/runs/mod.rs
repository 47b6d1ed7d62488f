//! The runner's application layer: every RPC's behaviour, expressed over the store, the mailbox
//! and the event log. gRPC handlers are thin adapters over `Runner`; workers call
//! `Runner::process` for each claimed job.

mod handoff;
mod nodes;
mod query;
pub mod records;
mod resolve;
pub mod state;
mod submit;
pub mod tasks;
mod work;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use arbor_shared::domain::{Event, RunStatus};
use tokio::sync::{Notify, watch};
use tracing::Instrument;

pub use nodes::{NodeState, RunNode};
pub use query::{JobPage, RunFilter, RunPage, RunView, Visible};
pub use records::{RunRecord, TreeRecord};
pub use resolve::ResolveInput;
pub use submit::{SubmitInput, Submitted};
pub use work::Processed;

use crate::{
    engine::{ToolRegistry, TreeFormat, TreeSpec, parse_tree},
    error::RunnerError,
    events::EventLog,
    mailbox::{Claim, Clock, Job, Mailbox, MailboxConfig, MailboxStore, Reaped},
    store::{Abort, Change, Commit, Reads, Store, T, Tx, TxResult, codec, tables},
};

/// How long `caught_up` waits for a commit in flight to publish its events before it syncs.
const CATCH_UP_WAIT: std::time::Duration = std::time::Duration::from_millis(200);

/// Tunables of the runner core.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    pub mailbox: MailboxConfig,
    /// How long `CancelRun` waits for the run to reach a terminal status.
    pub cancel_wait: std::time::Duration,
}

impl Default for RunnerOptions {
    fn default() -> Self {
        Self {
            mailbox: MailboxConfig::default(),
            cancel_wait: std::time::Duration::from_secs(10),
        }
    }
}

/// The runner core. One per process; shared by handlers and workers behind an `Arc`.
pub struct Runner {
    store: Store,
    mailbox: Mailbox,
    events: EventLog,
    tools: Arc<ToolRegistry>,
    opts: RunnerOptions,
    trees: Mutex<HashMap<(String, u32), Arc<TreeSpec>>>,
    /// Woken when a job may have become claimable.
    work: Arc<Notify>,
    /// Workers waiting for work right now, which a job being queued may be handed to.
    idle: handoff::IdleWorkers,
    /// Bumped after every committed run change, for callers waiting on a run.
    changes: Arc<watch::Sender<u64>>,
    /// Jobs whose lease expired (or whose process died) and went back to the queue for another
    /// worker to take over, since this process started.
    lease_takeovers: AtomicU64,
    /// Idle workers taken for a job being queued, since this process started; more than the
    /// jobs handed off when the transaction did not claim the job (or failed).
    taken: AtomicU64,
    /// Woken when a task may have become due or a leased task ended.
    task_changes: Notify,
    /// Ids of tasks whose lease ended in this process (completed, failed, thrown, expired), so
    /// a stream frees their flow-control slots without reading the store.
    task_ends: tokio::sync::broadcast::Sender<String>,
    pub(crate) task_metrics: crate::tasks::TaskMetrics,
}

impl Runner {
    /// Opens the runner over an open store. Jobs a previous process left claimed are returned to
    /// the queue (or dead-lettered when out of attempts).
    pub async fn open(
        store: Store,
        clock: Arc<dyn Clock>,
        tools: Arc<ToolRegistry>,
        opts: RunnerOptions,
    ) -> Result<Arc<Self>, RunnerError> {
        // Every step appends events: the log's counter is read by nearly every batch.
        store.hot_keys(vec![(T::Meta, crate::store::NEXT_SEQ.to_vec())]);
        let idle = handoff::IdleWorkers::default();
        store.idle_workers(idle.count());
        let (mailbox, recovered) = Mailbox::open(store.clone(), clock, opts.mailbox.clone())?;
        let events = EventLog::open(store.clone())?;
        let (changes, _) = watch::channel(0);
        let runner = Arc::new(Self {
            store,
            mailbox,
            events,
            tools,
            opts,
            trees: Mutex::new(HashMap::new()),
            work: Arc::new(Notify::new()),
            idle,
            changes: Arc::new(changes),
            lease_takeovers: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            task_changes: Notify::new(),
            task_ends: tokio::sync::broadcast::channel(4096).0,
            task_metrics: Default::default(),
        });
        if !recovered.is_empty() {
            tracing::info!(
                jobs = recovered.len(),
                "returned jobs claimed by the previous process to the queue"
            );
        }
        runner.after_reap(recovered).await?;
        if runner.store.shared() {
            runner.follow_other_replicas();
        }
        Ok(runner)
    }

    /// On a store shared with other replicas: wakes this process's streams, run waiters and
    /// idle workers when another replica appended events or queued jobs. Notifications are
    /// hints (the backend may miss some while its connection is down), so it also looks once
    /// a second.
    fn follow_other_replicas(self: &Arc<Self>) {
        let hint = Arc::new(Notify::new());
        let (wake, woken) = (hint.clone(), hint);
        // The highest seq the notifications said is durable, and whether one said nothing.
        let said = Arc::new((AtomicU64::new(0), AtomicBool::new(false)));
        let heard = said.clone();
        let work_for = Arc::downgrade(self);
        self.store.subscribe(move |change| {
            if matches!(change, Change::Work | Change::All)
                && let Some(runner) = work_for.upgrade()
            {
                // One worker looks; it wakes the next when it saw more work than it took.
                runner.wake_pool();
                runner.task_changes.notify_waiters();
            }
            match change {
                Change::Appended(seq) => {
                    heard.0.fetch_max(seq, Ordering::SeqCst);
                    wake.notify_one();
                }
                Change::Events | Change::All => {
                    heard.1.store(true, Ordering::SeqCst);
                    wake.notify_one();
                }
                Change::Work => {}
            }
        });
        let runner = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let poll = tokio::time::sleep(std::time::Duration::from_secs(1));
                let polled = tokio::select! {
                    _ = woken.notified() => false,
                    _ = poll => true,
                };
                let Some(runner) = runner.upgrade() else {
                    return;
                };
                if polled {
                    runner.wake_pool();
                    runner.task_changes.notify_waiters();
                }
                // A notification that named its seq spares the read of the log's head.
                let head = match polled || said.1.swap(false, Ordering::SeqCst) {
                    true => match runner.events.last_seq() {
                        // Seqs up to the head may be this process's own, committed and not
                        // remembered yet: a commit queued now is answered once every one
                        // before it has remembered its events, which streams then read from
                        // memory.
                        Ok(last) if last > runner.events.durable_seq() => {
                            let settled = runner.store.commit(|_| Ok::<_, Abort<String>>(())).await;
                            if let Err(e) = settled {
                                tracing::debug!("cannot wait for this process's commits: {e}");
                            }
                            Ok(last)
                        }
                        other => other,
                    },
                    false => Ok(said.0.load(Ordering::SeqCst)),
                };
                match head {
                    Ok(last) if last > runner.events.durable_seq() => {
                        runner.events.publish(last);
                        runner.changes.send_modify(|n| *n += 1);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!("cannot read the event log's head: {e}"),
                }
            }
        });
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn events(&self) -> &EventLog {
        &self.events
    }

    pub fn mailbox(&self) -> &Mailbox {
        &self.mailbox
    }

    /// Now, on the clock of every time the runner writes (a step's, a timer's deadline, a
    /// job's or a task's availability and lease, an event's time): the mailbox's, by which
    /// claims and leases are judged. In service that is the store's clock, so on PostgreSQL
    /// every replica reads the database server's time, whatever its own clock says.
    pub fn now_ms(&self) -> u64 {
        self.mailbox.clock().wall_ms()
    }

    pub fn tools(&self) -> &Arc<ToolRegistry> {
        &self.tools
    }

    /// Jobs returned to the queue after a lease expired, since this process started.
    pub fn lease_takeovers(&self) -> u64 {
        self.lease_takeovers.load(Ordering::Relaxed)
    }

    /// Jobs handed to an idle worker by the transaction that queued them (see
    /// `runs::handoff`), since this process started.
    pub fn jobs_handed_off(&self) -> u64 {
        self.idle.handed()
    }

    /// Idle workers taken for a job being queued (see `runs::handoff`), since this process
    /// started: each one either got its job ([`jobs_handed_off`](Self::jobs_handed_off)) or
    /// went back to waiting because its transaction claimed none.
    pub fn hand_offs_taken(&self) -> u64 {
        self.taken.load(Ordering::Relaxed)
    }

    /// Workers of this process waiting for work now.
    pub fn idle_workers(&self) -> usize {
        self.idle.count().load(Ordering::Relaxed)
    }

    /// Resolves when a job may have become claimable.
    pub fn work_available(&self) -> tokio::sync::futures::Notified<'_> {
        self.work.notified()
    }

    /// Counts a worker as waiting for work; a job being queued may be handed to it through
    /// the receiver, until [`stop_waiting`](Self::stop_waiting) says it no longer waits.
    pub(crate) fn wait_for_work(&self, worker: &str) -> tokio::sync::oneshot::Receiver<Claim> {
        self.idle.wait(worker)
    }

    /// Whether `worker` was still waiting. `false`: a job is being handed to it, and its
    /// receiver answers once the transaction queuing that job ends.
    pub(crate) fn stop_waiting(&self, worker: &str) -> bool {
        self.idle.stop(worker)
    }

    /// An idle worker of this process for a job about to be queued, if one waits.
    fn hand_off(&self) -> Option<handoff::HandOff> {
        let taken = self.idle.take(&self.mailbox);
        if taken.is_some() {
            self.taken.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Commits a transaction that queues a job, for which `hand_off` took an idle worker (if
    /// one waited). Once it is durable, a job the body claimed for that worker goes to it;
    /// otherwise a worker is woken to claim the job from the queue. Dropped half-way, the
    /// claim still reaches its worker (see [`commit_then`](Self::commit_then)); it would
    /// otherwise be durable and wait for its lease to run out.
    /// `reads` are the rows the body reads first (see [`Store::commit_reading`]).
    pub(crate) async fn commit_queuing<R: Send + 'static>(
        &self,
        hand_off: Option<handoff::HandOff>,
        reads: Reads,
        body: impl Fn(&Tx<'_>) -> TxResult<((R, Option<Job>), Vec<Event>), RunnerError> + Send + 'static,
    ) -> Result<R, RunnerError> {
        let then = move |(r, claimed)| match (claimed, hand_off) {
            (Some(job), Some(hand_off)) => {
                hand_off.give(job);
                (r, false)
            }
            _ => (r, true),
        };
        self.commit_then(reads, Commit::Durable, body, then).await
    }

    /// Commits one transaction that also appends events, waits until it is durable, then
    /// publishes the events to streams.
    pub(crate) async fn commit<R: Send + 'static>(
        &self,
        body: impl Fn(&Tx<'_>) -> TxResult<(R, Vec<Event>), RunnerError> + Send + 'static,
    ) -> Result<R, RunnerError> {
        self.commit_reading(Vec::new(), body).await
    }

    /// [`commit`](Self::commit) of a body that reads `reads` first (see
    /// [`Store::commit_reading`]).
    pub(crate) async fn commit_reading<R: Send + 'static>(
        &self,
        reads: Reads,
        body: impl Fn(&Tx<'_>) -> TxResult<(R, Vec<Event>), RunnerError> + Send + 'static,
    ) -> Result<R, RunnerError> {
        self.commit_as(reads, Commit::Durable, body).await
    }

    /// [`commit_reading`](Self::commit_reading) run as `how` says (see [`Commit`]).
    pub(crate) async fn commit_as<R: Send + 'static>(
        &self,
        reads: Reads,
        how: Commit,
        body: impl Fn(&Tx<'_>) -> TxResult<(R, Vec<Event>), RunnerError> + Send + 'static,
    ) -> Result<R, RunnerError> {
        self.commit_then(reads, how, body, |r| (r, false)).await
    }

    /// Commits `body`; once it is durable, publishes its events to streams, runs `then` on its
    /// outcome (which answers whether to wake a worker for a job it queued) and tells run
    /// waiters.
    ///
    /// All of it runs as a task of its own, so it finishes even when the caller goes away
    /// meanwhile (a client whose RPC is cut or runs out of time drops it): a step committed
    /// without its caller is still streamed at once, not at the next commit of anything.
    async fn commit_then<X: Send + 'static, R: Send + 'static>(
        &self,
        reads: Reads,
        how: Commit,
        body: impl Fn(&Tx<'_>) -> TxResult<(X, Vec<Event>), RunnerError> + Send + 'static,
        then: impl FnOnce(X) -> (R, bool) + Send + 'static,
    ) -> Result<R, RunnerError> {
        let (store, events, changes, work) = (
            self.store.clone(),
            self.events.clone(),
            self.changes.clone(),
            self.work.clone(),
        );
        // The events are remembered and published in commit order, before any caller of the
        // batch wakes: a stream woken by the last commit of a batch finds every event of the
        // batch in memory, whichever caller runs first.
        let in_order = move |(_, appended): &mut (X, Vec<Event>)| {
            if let Some(last) = appended.last().map(|e| e.seq) {
                events.remember(std::mem::take(appended));
                events.publish(last);
            }
        };
        tokio::spawn(
            async move {
                let (x, _) = store.commit_in_order(reads, how, body, in_order).await?;
                let (r, wake) = then(x);
                changes.send_modify(|n| *n += 1);
                if wake {
                    work.notify_one();
                }
                Ok(r)
            }
            .in_current_span(),
        )
        .await
        .map_err(|e| match e.is_cancelled() {
            true => RunnerError::Unavailable("runner-svc is shutting down".into()),
            false => RunnerError::Storage(format!("the commit stopped: {e}")),
        })?
    }

    /// Returns once every event committed so far can be streamed. A run read before this call
    /// may show a step whose transaction committed and whose sync has not finished yet; after
    /// it, `StreamEvents` returns every event of that step. Normally the committing task
    /// publishes its events within a sync, and a notification brings another replica's soon
    /// after; a notification can be missed (it is a hint), so after a short wait this syncs
    /// and publishes itself.
    pub async fn caught_up(&self) -> Result<(), RunnerError> {
        let last = self.events.last_seq()?;
        if self.events.durable_seq() >= last {
            return Ok(());
        }
        let mut durable = self.events.watch();
        let caught = tokio::time::timeout(CATCH_UP_WAIT, async {
            durable.wait_for(|d| *d >= last).await.is_ok()
        })
        .await
        .unwrap_or(false);
        if !caught {
            self.store.durable().await?;
            self.events.publish(last);
        }
        Ok(())
    }

    /// Wakes one idle task of the job pool for one new job. Waking them all would make every
    /// idle one scan the queue after every commit only to find nothing.
    pub(crate) fn wake_pool(&self) {
        self.work.notify_one();
    }

    /// Parses a tree version, cached: trees are immutable once registered.
    pub(crate) fn tree_spec(&self, id: &str, version: u32) -> Result<Arc<TreeSpec>, RunnerError> {
        let key = (id.to_string(), version);
        if let Some(spec) = self.trees.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(spec);
        }
        let record = self.tree_record(id, version)?;
        let spec = parse_tree(&record.document, TreeFormat::Json).map_err(|v| {
            RunnerError::Corrupt(codec::Corrupt {
                what: "tree",
                message: format!("stored tree {id} v{version} no longer validates: {v:?}"),
            })
        })?;
        let spec = Arc::new(spec);
        if let Ok(mut cache) = self.trees.lock() {
            cache.insert(key, spec.clone());
        }
        Ok(spec)
    }

    /// A tree version's record; version 0 means the latest.
    pub fn tree_record(&self, id: &str, version: u32) -> Result<TreeRecord, RunnerError> {
        let tree = self.store.tree(T::Trees);
        let found = if version == 0 {
            tree.last_with_prefix(tables::trees::versions(id))?
        } else {
            tree.get(tables::trees::key(id, version))?
                .map(|v| (Vec::new(), v))
        };
        match found {
            Some((_, bytes)) => Ok(codec::decode("tree", &bytes)?),
            None => Err(RunnerError::TreeNotFound {
                id: id.into(),
                version,
            }),
        }
    }

    /// Waits until `run_id` is terminal or `wait` passes; returns its latest record.
    pub(crate) async fn wait_terminal(
        &self,
        run_id: &str,
        wait: std::time::Duration,
    ) -> Result<RunRecord, RunnerError> {
        let mut changes = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let run = self.run_record(run_id)?;
            if run.status.is_terminal() {
                return Ok(run);
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Ok(run);
            }
        }
    }

    pub fn run_record(&self, run_id: &str) -> Result<RunRecord, RunnerError> {
        match self.store.tree(T::Runs).get(run_id.as_bytes())? {
            Some(b) => Ok(codec::decode("run", &b)?),
            None => Err(RunnerError::RunNotFound(run_id.into())),
        }
    }

    /// Returns expired leases to the queue and records dead letters.
    pub async fn reap(&self) -> Result<usize, RunnerError> {
        let reaped = self.mailbox.reap_expired()?;
        let n = reaped.len();
        self.after_reap(reaped).await?;
        Ok(n)
    }

    async fn after_reap(&self, reaped: Vec<Reaped>) -> Result<(), RunnerError> {
        if reaped.is_empty() {
            return Ok(());
        }
        for r in &reaped {
            if r.job.status == arbor_shared::domain::JobStatus::DeadLetter {
                self.record_dead_letter(&r.job).await?;
            } else {
                self.lease_takeovers.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(job = %r.job.job_id, run = %r.job.run_id, "lease expired; job returned to the queue");
            }
        }
        self.wake_pool();
        Ok(())
    }

    /// Runs that are not terminal cannot be left hanging when their job dead-letters: the run
    /// fails visibly, and its open suspensions are withdrawn in the same step, so no approval
    /// outlives it (an operator may requeue the job, which revives the run; the nodes that were
    /// waiting then ask anew).
    pub(crate) async fn record_dead_letter(
        &self,
        job: &crate::mailbox::Job,
    ) -> Result<(), RunnerError> {
        use arbor_shared::domain::EventDetail;
        let now = self.now_ms();
        let job = job.clone();
        // The spec is needed to halt the waiting nodes; without it the records are still
        // withdrawn.
        let spec = self
            .run_record(&job.run_id)
            .and_then(|run| self.tree_spec(&run.tree_id, run.tree_version))
            .ok();
        self.commit(move |tx| {
            let event = |run: &RunRecord, detail| crate::events::NewEvent {
                run_id: run.run_id.clone(),
                thread_id: run.thread_id.clone(),
                detail,
            };
            let mut events = vec![crate::events::NewEvent {
                run_id: job.run_id.clone(),
                thread_id: job.mailbox_id.clone(),
                detail: EventDetail::JobDeadLettered {
                    job_id: job.job_id.clone(),
                    attempt_count: job.attempt_count,
                    last_error: job.last_error.clone(),
                },
            }];
            if let Some(mut run) = records::get_run(tx, &job.run_id)?
                && !run.status.is_terminal()
            {
                run.error = format!("job {} dead-lettered: {}", job.job_id, job.last_error);
                // A checkpoint that does not decode (often why the job failed) has nothing
                // this step could withdraw; approval-svc still cancels the run's approvals
                // when it sees RUN_FAILED.
                let stored = tx
                    .tree(T::Checkpoints)
                    .get(run.run_id.as_bytes())?
                    .and_then(|b| crate::engine::Checkpoint::decode(&b).ok());
                if let Some(mut ck) = stored {
                    let replaced = crate::counts::active(&ck);
                    let effects = crate::engine::withdraw_open(
                        spec.as_deref(),
                        &mut ck,
                        "run failed: job dead-lettered",
                    );
                    if !effects.is_empty() {
                        records::put_checkpoint(tx, &run, &ck, replaced)?;
                        for effect in effects {
                            if let crate::engine::Effect::Withdrawn { request_id, reason } = effect
                            {
                                if let Some(task) =
                                    crate::tasks::tx::cancel(tx, &request_id, &reason, now)?
                                    && task.state == crate::tasks::TaskState::Cancelled
                                {
                                    events.push(tasks::cancelled_event(&task));
                                }
                                events.push(event(
                                    &run,
                                    EventDetail::SuspensionWithdrawn { request_id, reason },
                                ));
                            }
                        }
                    }
                }
                run.status = state::apply(run.status, state::RunEvent::DeadLetter)?;
                run.updated_at_ms = now;
                records::put_run(tx, &run)?;
                events.push(event(
                    &run,
                    EventDetail::RunFinished {
                        status: RunStatus::Failed,
                        error: run.error.clone(),
                        blackboard: Default::default(),
                    },
                ));
            }
            let appended = crate::events::append(tx, &events, now, "")?;
            Ok(((), appended))
        })
        .await
    }

    /// Makes everything committed so far durable (used at shutdown).
    pub async fn flush(&self) -> Result<(), RunnerError> {
        Ok(self.store.durable().await?)
    }

    /// Records the progress the store reached (the last event seq assigned) once it is durable,
    /// so that losing it later is detected when the store opens.
    pub async fn record_progress(&self) -> Result<(), RunnerError> {
        let progress = self.events.last_seq()?;
        Ok(self.store.record_progress(progress).await?)
    }
}
