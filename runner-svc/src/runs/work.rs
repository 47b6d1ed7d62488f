//! What a worker does with a claimed job: load the run's checkpoint and inbox, tick (or halt) the
//! tree, and commit checkpoint + events + inbox removals + timer + the job's ack in ONE
//! transaction that first checks the claim token (fencing).

use std::{panic::AssertUnwindSafe, sync::Arc};

use tracing::Instrument;

use arbor_shared::domain::{EventDetail, JobKind, JobOrigin, RunStatus, SuspensionState};

use super::{
    Runner, records,
    state::{self, RunEvent},
};
use crate::{
    counts,
    engine::{self, Checkpoint, Decision, Effect, TaskOrder, TickEnv, TickStatus},
    error::RunnerError,
    events::{self, NewEvent},
    mailbox::{Claim, EnqueueRequest, MailboxStore, RetryCause, tx as mtx},
    store::{T, abort, codec, lift, tables},
    tasks::tx as ttx,
};

/// Ticks one wake may take back to back before yielding the worker.
const IMMEDIATE_RETICKS: usize = 64;

/// How processing a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Processed {
    /// Committed and acked.
    Done(RunStatus),
    /// The claim was no longer ours: nothing was written.
    LostClaim,
    /// Failed; the job was nacked (retry or dead letter).
    Failed(String),
}

/// What a claimed job asks for, before anything is committed.
enum Prepared {
    /// The run is gone or finished: the job is only acked.
    Nothing(RunStatus),
    /// A step to commit; `replaced` counts the active suspensions of the checkpoint it replaces.
    Step {
        step: Box<Step>,
        replaced: [i64; 3],
        now: u64,
    },
}

/// The outcome of the engine step, before it is committed.
struct Step {
    ck: Checkpoint,
    status: RunStatus,
    error: String,
    events: Vec<NewEvent>,
    consumed_inbox: Vec<String>,
    next_wake_ms: Option<u64>,
    /// Tasks the step asks workers for.
    tasks: Vec<TaskOrder>,
    /// Suspensions the step withdrew (request id, reason): their tasks are cancelled.
    withdrawn: Vec<(String, String)>,
}

impl Runner {
    /// Processes one claimed job end to end.
    pub async fn process(self: &Arc<Self>, claim: &Claim) -> Processed {
        let span = self.step_span(&claim.job).await;
        let result = self.try_process(claim).instrument(span).await;
        let job = &claim.job;
        match result {
            Ok(status) => {
                self.mailbox.forget_lease(&job.job_id);
                Processed::Done(status)
            }
            Err(RunnerError::ClaimLost(m)) => {
                tracing::warn!(job = %job.job_id, run = %job.run_id, "claim lost, write refused: {m}");
                self.mailbox.forget_lease(&job.job_id);
                Processed::LostClaim
            }
            Err(e) => {
                let permanent = matches!(e, RunnerError::Corrupt(_));
                let message = e.to_string();
                tracing::error!(job = %job.job_id, run = %job.run_id, permanent, "job failed: {message}");
                match self
                    .mailbox
                    .nack(&job.job_id, &claim.token, &message, permanent)
                {
                    Ok(nacked) => {
                        if nacked.status == arbor_shared::domain::JobStatus::DeadLetter
                            && let Err(e) = self.record_dead_letter(&nacked).await
                        {
                            tracing::error!(job = %job.job_id, "could not record dead letter: {e}");
                        }
                        if let Err(e) = self.store.durable().await {
                            tracing::error!("flush after nack failed: {e}");
                        }
                        self.wake_pool();
                    }
                    Err(e) => tracing::warn!(job = %job.job_id, "nack refused: {e}"),
                }
                Processed::Failed(message)
            }
        }
    }

    /// The `run.step` span of a job while spans are exported, a child of the run's trace (the
    /// SubmitRun or Resolve that caused the step); none otherwise. The trace is read on a
    /// blocking thread, as every store read outside a transaction is (PostgreSQL waits).
    async fn step_span(self: &Arc<Self>, job: &crate::mailbox::Job) -> tracing::Span {
        if !arbor_shared::trace::exporting() {
            return tracing::Span::none();
        }
        let span = tracing::info_span!("run.step", run_id = %job.run_id, job_id = %job.job_id,
            job_kind = ?job.kind);
        let (this, run_id) = (self.clone(), job.run_id.clone());
        let parent = tokio::task::spawn_blocking(move || this.events().run_trace(&run_id))
            .await
            .ok()
            .flatten();
        arbor_shared::trace::adopt(&span, parent.as_ref());
        span
    }

    /// Loading the run and ticking its tree run on a blocking thread: a tick calls tools, and a
    /// slow tool must never stall the runtime threads that serve RPCs, streams and leases.
    async fn try_process(self: &Arc<Self>, claim: &Claim) -> Result<RunStatus, RunnerError> {
        let (this, owned) = (self.clone(), claim.clone());
        let prepared = tokio::task::spawn_blocking(move || this.prepare(&owned))
            .await
            .map_err(|e| {
                RunnerError::Corrupt(codec::Corrupt {
                    what: "engine state",
                    message: format!("the step could not be prepared: {e}"),
                })
            })??;
        match prepared {
            Prepared::Nothing(status) => {
                self.ack_only(claim).await?;
                Ok(status)
            }
            Prepared::Step {
                step,
                replaced,
                now,
            } => self.commit_step(claim, *step, replaced, now).await,
        }
    }

    /// Everything of a step before its commit: the run, its checkpoint and inbox, the tick.
    fn prepare(&self, claim: &Claim) -> Result<Prepared, RunnerError> {
        let job = &claim.job;
        let now = self.now_ms();
        // The run, its checkpoint and its inbox, read together (one statement on PostgreSQL).
        let key = job.run_id.as_bytes();
        let (read, inbox) = self.store.get_many_and_prefix(
            &[(T::Runs, key), (T::Checkpoints, key)],
            T::Inbox,
            &tables::runs::inbox(&job.run_id),
        )?;
        let mut read = read.into_iter();
        let (run, ck_bytes) = (read.next().flatten(), read.next().flatten());
        let Some(run) = run else {
            return Ok(Prepared::Nothing(RunStatus::Cancelled));
        };
        let run: records::RunRecord = codec::decode("run", &run)?;
        if run.status.is_terminal() {
            // A wake-up for a run that already finished (a late timer, a cancel that raced).
            return Ok(Prepared::Nothing(run.status));
        }
        let spec = self.tree_spec(&run.tree_id, run.tree_version)?;
        let ck_bytes = ck_bytes.ok_or_else(|| {
            RunnerError::Corrupt(codec::Corrupt {
                what: "checkpoint",
                message: format!("run {} has no checkpoint", run.run_id),
            })
        })?;
        let mut ck = Checkpoint::decode(&ck_bytes)
            .and_then(|ck| ck.check_matches(&spec).map(|_| ck))
            .map_err(|e| codec::Corrupt {
                what: "checkpoint",
                message: e.to_string(),
            })?;
        // Its active suspensions, for the state counts when the next checkpoint replaces it.
        let replaced = counts::active(&ck);
        // A run that has not started has no suspension to decide yet, and a cancel takes no
        // decision: neither takes what its inbox holds.
        let decisions = match run.started && job.kind != JobKind::Cancel {
            true => inbox
                .iter()
                .map(|(_, bytes)| codec::decode::<Decision>("decision", bytes))
                .collect::<Result<_, _>>()?,
            false => Vec::new(),
        };

        let mut new_events = Vec::new();
        let ev = |detail| NewEvent {
            run_id: run.run_id.clone(),
            thread_id: run.thread_id.clone(),
            detail,
        };
        if job.attempt_count > 1 {
            new_events.push(ev(EventDetail::CheckpointRestored {
                step: ck.step(),
                cause: match job.retry_cause {
                    Some(RetryCause::LeaseExpired) => "lease_takeover".into(),
                    _ => "retry".into(),
                },
            }));
        }
        let step = if job.kind == JobKind::Cancel {
            let reason = if run.cancel_reason.is_empty() {
                "cancelled".to_string()
            } else {
                run.cancel_reason.clone()
            };
            let effects = engine::halt(&spec, &mut ck, &reason);
            effects_to_events(&effects, &mut new_events, &ev);
            let (tasks, withdrawn) = task_changes(effects);
            Step {
                ck,
                status: RunStatus::Cancelled,
                error: reason,
                events: new_events,
                consumed_inbox: Vec::new(),
                next_wake_ms: None,
                tasks,
                withdrawn,
            }
        } else {
            if !run.started {
                new_events.push(ev(EventDetail::RunStarted {
                    tree_id: run.tree_id.clone(),
                    tree_version: run.tree_version,
                    attempt: job.attempt_count,
                }));
            } else {
                new_events.push(ev(EventDetail::ExecutionResumed {
                    request_ids: decisions.iter().map(|d| d.request_id.clone()).collect(),
                    job_kind: job.kind,
                }));
            }
            let consumed_inbox = decisions.iter().map(|d| d.request_id.clone()).collect();
            let env = TickEnv {
                run_id: &run.run_id,
                thread_id: &run.thread_id,
                tree_id: &run.tree_id,
                tree_version: run.tree_version,
                submitted_by: &run.submitted_by,
                now_ms: now,
                mode: run.mode,
                tools: &self.tools,
            };
            let ticked = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let mut out = engine::tick(&spec, &mut ck, decisions, &env);
                // `next_wake_ms <= now` asks for another tick at once (a Yield-mode tick that
                // stopped early, or a spent work budget): do it here rather than through a job.
                let mut rounds = 0;
                while out.status == TickStatus::Running
                    && out.next_wake_ms.is_some_and(|at| at <= now)
                    && rounds < IMMEDIATE_RETICKS
                {
                    let mut again = engine::tick(&spec, &mut ck, Vec::new(), &env);
                    out.effects.append(&mut again.effects);
                    again.effects = std::mem::take(&mut out.effects);
                    out = again;
                    rounds += 1;
                }
                (out, ck)
            }));
            let (out, ck) = ticked.map_err(|_| {
                RunnerError::Corrupt(codec::Corrupt {
                    what: "engine state",
                    message: "the engine panicked on this run".into(),
                })
            })?;
            effects_to_events(&out.effects, &mut new_events, &ev);
            let (tasks, withdrawn) = task_changes(out.effects);
            let status = match out.status {
                TickStatus::Success => RunStatus::Succeeded,
                TickStatus::Failure => RunStatus::Failed,
                TickStatus::Running => {
                    if ck.suspensions().any(|s| s.state == SuspensionState::Active) {
                        RunStatus::Suspended
                    } else {
                        RunStatus::Running
                    }
                }
            };
            Step {
                ck,
                status,
                error: out.error,
                events: new_events,
                consumed_inbox,
                next_wake_ms: if status.is_terminal() {
                    None
                } else {
                    out.next_wake_ms
                },
                tasks,
                withdrawn,
            }
        };
        Ok(Prepared::Step {
            step: Box::new(step),
            replaced,
            now,
        })
    }

    async fn commit_step(
        &self,
        claim: &Claim,
        step: Step,
        replaced: [i64; 3],
        now: u64,
    ) -> Result<RunStatus, RunnerError> {
        let job = &claim.job;
        if !self.mailbox.lease_valid(&job.job_id, &claim.token) {
            return Err(RunnerError::ClaimLost(format!(
                "lease on job {} expired before the step could commit",
                job.job_id
            )));
        }
        let order = match step.next_wake_ms {
            Some(_) => self.store.next_id()?,
            None => 0,
        };
        let default_max = self.mailbox.config().default_max_attempts;
        let task_order = match step.tasks.is_empty() {
            true => 0,
            false => self.store.next_id()?,
        };
        let touches_tasks = !step.tasks.is_empty() || !step.withdrawn.is_empty();
        let blackboard = step.ck.blackboard().clone();
        let status = step.status;
        let next_wake = step.next_wake_ms;
        let (job, token) = (job.clone(), claim.token.clone());
        // Everything the step reads that the job names, read with the batch's first read: the
        // fence, the run, its trace, and what the ack unindexes.
        let mut reads = vec![
            (T::Jobs, job.job_id.clone().into_bytes()),
            (T::Runs, job.run_id.clone().into_bytes()),
            (T::Meta, tables::meta::trace_key(&job.run_id)),
            (T::Active, job.mailbox_id.clone().into_bytes()),
        ];
        if !job.dedupe_key.is_empty() {
            reads.push((T::Dedupe, job.dedupe_key.clone().into_bytes()));
        }
        let (step_trace, suspensions) = step_traces(&step.events);
        self.commit_reading(reads, move |tx| {
            lift(mtx::check_fence(tx, &job.job_id, &token))?;
            let Some(mut run) = records::get_run(tx, &job.run_id)? else {
                return abort(RunnerError::RunNotFound(job.run_id.clone()));
            };
            let size = records::put_checkpoint(tx, &run, &step.ck, replaced)?;
            for request_id in &step.consumed_inbox {
                records::inbox_remove(tx, &run.run_id, request_id)?;
            }
            for order in &step.tasks {
                ttx::queue(tx, order, (&run.run_id, &run.thread_id), task_order, now)?;
            }
            let mut events_in = step.events.clone();
            for (request_id, reason) in &step.withdrawn {
                if let Some(task) = ttx::cancel(tx, request_id, reason, now)?
                    && task.state == crate::tasks::TaskState::Cancelled
                {
                    events_in.push(super::tasks::cancelled_event(&task));
                }
            }
            events_in.push(NewEvent {
                run_id: run.run_id.clone(),
                thread_id: run.thread_id.clone(),
                detail: EventDetail::CheckpointSaved {
                    step: step.ck.step(),
                    size_bytes: size,
                },
            });
            if status.is_terminal() {
                events_in.push(NewEvent {
                    run_id: run.run_id.clone(),
                    thread_id: run.thread_id.clone(),
                    detail: EventDetail::RunFinished {
                        status,
                        error: step.error.clone(),
                        blackboard: blackboard.clone(),
                    },
                });
            }
            if let Some(at) = step.next_wake_ms {
                lift(mtx::enqueue(
                    tx,
                    &EnqueueRequest {
                        job_id: uuid::Uuid::now_v7().to_string(),
                        mailbox_id: run.thread_id.clone(),
                        run_id: run.run_id.clone(),
                        origin: JobOrigin::Internal,
                        kind: Some(JobKind::Timer),
                        priority: run.priority,
                        dedupe_key: format!("timer:{}:{at}", run.run_id),
                        dedupe_while_claimed: false,
                        available_at_ms: at,
                        max_attempts: run.max_attempts,
                    },
                    order,
                    now,
                    default_max,
                ))?;
            }
            run.status = match status {
                RunStatus::Cancelled => state::apply(run.status, RunEvent::Cancel)?,
                outcome => state::apply(run.status, RunEvent::Step(outcome))?,
            };
            run.error = step.error.clone();
            run.step = step.ck.step();
            run.started = run.started || job.kind != JobKind::Cancel;
            run.updated_at_ms = now;
            records::put_run(tx, &run)?;
            let appended =
                events::append_traced(tx, &events_in, now, |i| match suspensions.get(i) {
                    Some((_, tp)) if !tp.is_empty() => tp,
                    _ => &step_trace,
                })?;
            lift(mtx::ack(tx, &job.job_id, &token, now))?;
            Ok(((), appended))
        })
        .await?;
        // A worker claims a timer that is due, or looks to learn when it will be: the worker
        // that finishes this job looks again only when the mailbox knows of something to find.
        if next_wake.is_some() {
            self.wake_pool();
        }
        if touches_tasks {
            self.notify_tasks();
        }
        Ok(status)
    }

    /// Acks a job that had nothing to do.
    async fn ack_only(&self, claim: &Claim) -> Result<(), RunnerError> {
        let now = self.now_ms();
        let (job_id, token) = (claim.job.job_id.clone(), claim.token.clone());
        self.commit(move |tx| {
            lift(mtx::ack(tx, &job_id, &token, now))?;
            Ok(((), Vec::new()))
        })
        .await?;
        self.wake_pool();
        Ok(())
    }
}

/// While spans are exported: the `traceparent` of the step's span, and for each of the step's
/// events (by index) a `run.suspend` span, open until the step commits, with its `traceparent`
/// when the event suspends the run (approval-svc's work on it is that span's child). Empty
/// strings otherwise: the events then carry the run's trace as before.
fn step_traces(events: &[NewEvent]) -> (String, Vec<(tracing::Span, String)>) {
    if !arbor_shared::trace::exporting() {
        return (String::new(), Vec::new());
    }
    let step = tracing::Span::current();
    let Some(step_ctx) = arbor_shared::trace::TraceContext::of_span(&step) else {
        return (String::new(), Vec::new());
    };
    let suspensions = events
        .iter()
        .map(|e| {
            let request_id = match &e.detail {
                EventDetail::ApprovalRequested(r) => &r.request_id,
                EventDetail::ExecutionSuspended { request_id, .. } => request_id,
                _ => return (tracing::Span::none(), String::new()),
            };
            let span = tracing::info_span!(parent: &step, "run.suspend", run_id = %e.run_id,
                request_id = %request_id);
            let tp = arbor_shared::trace::TraceContext::of_span(&span)
                .map(|c| c.to_string())
                .unwrap_or_default();
            (span, tp)
        })
        .collect();
    (step_ctx.to_string(), suspensions)
}

fn effects_to_events(
    effects: &[Effect],
    out: &mut Vec<NewEvent>,
    ev: &impl Fn(EventDetail) -> NewEvent,
) {
    for effect in effects {
        match effect {
            Effect::Suspended { record } => {
                if let Some(approval) = &record.approval {
                    out.push(ev(EventDetail::ApprovalRequested(Box::new(
                        approval.clone(),
                    ))));
                }
                out.push(ev(EventDetail::ExecutionSuspended {
                    request_id: record.request_id.clone(),
                    category: record.category,
                    message: record.message.clone(),
                    payload: record.payload.clone(),
                    node_locator: record.node_locator.clone(),
                }));
            }
            Effect::Withdrawn { request_id, reason } => {
                out.push(ev(EventDetail::SuspensionWithdrawn {
                    request_id: request_id.clone(),
                    reason: reason.clone(),
                }));
            }
            Effect::Consumed {
                request_id,
                decision_id,
            } => out.push(ev(EventDetail::ApprovalConsumed {
                request_id: request_id.clone(),
                decision_id: decision_id.clone(),
            })),
            Effect::Discarded {
                request_id,
                decision_id,
            } => {
                tracing::info!(%request_id, %decision_id, "decision for a withdrawn request dropped")
            }
            Effect::Log {
                node_locator,
                message,
            } => tracing::info!(node = %node_locator, "{message}"),
            // Recorded as the task itself (`task_changes`); its suspension's event says it.
            Effect::TaskQueued { .. } => {}
        }
    }
}

/// The tasks a step asks for and the suspensions whose tasks it cancels.
fn task_changes(effects: Vec<Effect>) -> (Vec<TaskOrder>, Vec<(String, String)>) {
    let (mut tasks, mut withdrawn) = (Vec::new(), Vec::new());
    for effect in effects {
        match effect {
            Effect::TaskQueued { order } => tasks.push(*order),
            Effect::Withdrawn { request_id, reason } => withdrawn.push((request_id, reason)),
            _ => {}
        }
    }
    (tasks, withdrawn)
}
