//! Task workers' calls on the runner: taking due tasks under a lease, heartbeats, and the three
//! ways an attempt ends (complete, fail, throw); giving a task back is in `release`, the reaper
//! of expired leases in `reaper`. Each is one
//! durable transaction; an outcome that ends a task puts it into the run's inbox in that same
//! transaction, so it is taken once.

use std::sync::atomic::Ordering;

use arbor_shared::{
    domain::{DecisionSource, EventDetail, TaskFailure, Verdict},
    page,
};
use globset::GlobSet;
use serde_json::{Value as Json, json};

mod reaper;
mod release;

pub use reaper::reap_task_leases;
pub use release::Released;

use super::{Runner, records, resolve::deliver};
use crate::{
    engine::Decision,
    error::RunnerError,
    events::{self, NewEvent},
    store::{T, Tx, TxResult, abort, codec, tables},
    tasks::{self, Task, TaskEvent, TaskState, tx as ttx},
};

/// How a FailTask call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailOutcome {
    pub will_retry: bool,
    pub attempt: u32,
    pub retry_at_ms: u64,
}

/// Whether a completion or business error was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub accepted: bool,
    pub reason: String,
}

/// Which tasks to list.
#[derive(Debug, Clone, Default)]
pub struct TaskFilter {
    pub states: Vec<TaskState>,
    /// `None`: every type.
    pub task_type: Option<globset::GlobMatcher>,
    pub worker_id: String,
    pub run_id: String,
}

pub struct TaskPage {
    pub tasks: Vec<Task>,
    pub next_page_token: String,
}

const TASKS: &str = "tasks";

fn event(task: &Task, detail: EventDetail) -> NewEvent {
    NewEvent {
        run_id: task.run_id.clone(),
        thread_id: task.thread_id.clone(),
        detail,
    }
}

/// TASK_FAILED for a task that ended because its run no longer wanted it.
pub(crate) fn cancelled_event(task: &Task) -> NewEvent {
    event(
        task,
        EventDetail::TaskFailed {
            task: task.event_ref(),
            error: format!("cancelled: {}", task.cancel_reason),
            cause: TaskFailure::Cancelled,
            code: String::new(),
            will_retry: false,
            retry_at_ms: 0,
        },
    )
}

fn outcome(task: &Task, result: Json) -> Decision {
    Decision {
        request_id: task.task_id.clone(),
        decision_id: format!("task:{}:{}", task.task_id, task.attempt),
        action: Verdict::Resume,
        result,
        reason: String::new(),
        decided_by: format!("worker:{}", task.worker_id),
        source: DecisionSource::Policy,
    }
}

impl Runner {
    /// Resolves when a task may have become due, or a leased one ended.
    pub fn task_changes(&self) -> tokio::sync::futures::Notified<'_> {
        self.task_changes.notified()
    }

    pub(crate) fn notify_tasks(&self) {
        self.task_changes.notify_waiters();
    }

    /// Ids of tasks whose lease ends in this process from now on (a lagging receiver must look
    /// at the store instead).
    pub fn task_ends(&self) -> tokio::sync::broadcast::Receiver<String> {
        self.task_ends.subscribe()
    }

    pub(crate) fn lease_ended(&self, task_id: &str) {
        let _ = self.task_ends.send(task_id.to_string());
    }

    /// Leases up to `max` due tasks whose type `types` matches to `worker_id`, in queue order,
    /// in one durable transaction that records TASK_DISPATCHED for each. Also returns when the
    /// next queued task of those types falls due (ms on the store's clock), if one waits.
    pub async fn take_tasks(
        &self,
        worker_id: &str,
        types: &GlobSet,
        lease_ms: u32,
        max: usize,
    ) -> Result<(Vec<Task>, Option<u64>), RunnerError> {
        let now = self.now_ms();
        let mut candidates = Vec::new();
        let mut next_due = None;
        if max == 0 {
            return Ok((Vec::new(), None));
        }
        // The queue is in due order: the scan ends at the first task not due yet, whatever its
        // type (waking for another type's task costs one look; scanning on would read every
        // future task).
        for entry in self.store.tree(T::TaskQueue).iter() {
            let (key, task_type) = entry?;
            let Some((at, id)) = tables::tasks::parse_queue_key(&key) else {
                continue;
            };
            if at > now {
                next_due = Some(at);
                break;
            }
            if !types.is_match(String::from_utf8_lossy(&task_type).as_ref()) {
                continue;
            }
            candidates.push((id.to_string(), uuid::Uuid::new_v4().simple().to_string()));
            // Room for a few taken by others meanwhile.
            if candidates.len() >= max + 4 {
                break;
            }
        }
        if candidates.is_empty() {
            return Ok((Vec::new(), next_due));
        }
        let worker = worker_id.to_string();
        let taken = self
            .commit(move |tx| {
                let mut taken = Vec::new();
                let mut events_in = Vec::new();
                for (id, token) in &candidates {
                    if taken.len() >= max {
                        break;
                    }
                    if let Some(task) = ttx::dispatch(tx, id, &worker, lease_ms, token, now)? {
                        events_in.push(event(
                            &task,
                            EventDetail::TaskDispatched {
                                task: task.event_ref(),
                                lease_until_ms: task.lease_until_ms,
                            },
                        ));
                        taken.push(task);
                    }
                }
                let appended = events::append(tx, &events_in, now, "")?;
                Ok((taken, appended))
            })
            .await?;
        for task in &taken {
            self.task_metrics.dispatched.fetch_add(1, Ordering::Relaxed);
            self.task_metrics
                .observe_dispatch(now.saturating_sub(task.available_at_ms));
        }
        Ok((taken, next_due))
    }

    /// Whether `token` still holds the task's lease (a stream counts it as in flight).
    pub fn holds_lease(&self, task_id: &str, token: &str) -> bool {
        match self.store.tree(T::Tasks).get(task_id.as_bytes()) {
            Ok(Some(bytes)) => codec::decode::<Task>("task", &bytes)
                .is_ok_and(|t| t.state == TaskState::Leased && t.lease_token == token),
            // Unreadable for now: keep counting it, the next look decides.
            Err(_) => true,
            Ok(None) => false,
        }
    }

    /// Extends a lease; stores `details` for later attempts.
    pub async fn heartbeat_task(
        &self,
        task_id: &str,
        token: &str,
        details: Option<Json>,
    ) -> Result<Task, RunnerError> {
        let now = self.now_ms();
        let (id, token) = (task_id.to_string(), token.to_string());
        self.commit(move |tx| {
            let task = ttx::leased(tx, &id, &token)?;
            let task = ttx::heartbeat(tx, task, details.clone(), now)?;
            Ok((task, Vec::new()))
        })
        .await
    }

    /// Completes a task with its output. A repeat of an accepted completion is accepted again;
    /// a task whose cancellation was requested is cancelled instead and says so.
    pub async fn complete_task(
        &self,
        task_id: &str,
        token: &str,
        output: Json,
    ) -> Result<Taken, RunnerError> {
        let result = json!({"status": "succeeded", "result": output});
        self.end_task(task_id, token, TaskEvent::Complete, result, String::new())
            .await
    }

    /// A business error: the node fails with `{code, message}` on its blackboard.
    pub async fn throw_task(
        &self,
        task_id: &str,
        token: &str,
        code: &str,
        message: &str,
    ) -> Result<Taken, RunnerError> {
        let result = json!({"status": "error", "code": code, "message": message});
        let error = format!("{code}: {message}");
        self.end_task(task_id, token, TaskEvent::Throw, result, error)
            .await
    }

    async fn end_task(
        &self,
        task_id: &str,
        token: &str,
        event_kind: TaskEvent,
        result: Json,
        error: String,
    ) -> Result<Taken, RunnerError> {
        let now = self.now_ms();
        let order = self.store.next_id()?;
        let default_max = self.mailbox.config().default_max_attempts;
        let (id, token) = (task_id.to_string(), token.to_string());
        let hand_off = self.hand_off();
        let claimer = hand_off.as_ref().map(|h| h.claimer());
        let taken = self
            .commit_queuing(hand_off, Vec::new(), move |tx| {
                // A repeat of the call that ended this lease (its answer was lost) is answered
                // the same way and changes nothing.
                let done = match event_kind {
                    TaskEvent::Complete => TaskState::Completed,
                    _ => TaskState::Errored,
                };
                if let Some(task) = ttx::get(tx, &id)?
                    && task.lease_token == token
                    && (task.state == done || task.state == TaskState::Cancelled)
                {
                    let taken = Taken {
                        accepted: task.state == done,
                        reason: match task.state == done {
                            true => "already taken".into(),
                            false => format!("task was cancelled: {}", task.cancel_reason),
                        },
                    };
                    return Ok(((taken, None), Vec::new()));
                }
                let task = ttx::leased(tx, &id, &token)?;
                if task.cancel_requested {
                    let reason = format!("task was cancelled: {}", task.cancel_reason);
                    let task = ttx::close(tx, task, TaskEvent::Cancel, "", now)?;
                    let appended = events::append(tx, &[cancelled_event(&task)], now, "")?;
                    let taken = Taken {
                        accepted: false,
                        reason,
                    };
                    return Ok(((taken, None), appended));
                }
                let run = records::must_get_run(tx, &task.run_id)?;
                let task = ttx::close(tx, task, event_kind, &error, now)?;
                let claimed = deliver(
                    tx,
                    &run,
                    &outcome(&task, result.clone()),
                    (order, now, default_max),
                    claimer.as_ref(),
                )?;
                let detail = match event_kind {
                    TaskEvent::Complete => EventDetail::TaskCompleted {
                        task: task.event_ref(),
                    },
                    _ => EventDetail::TaskFailed {
                        task: task.event_ref(),
                        error: error.clone(),
                        cause: TaskFailure::Error,
                        code: result
                            .get("code")
                            .and_then(Json::as_str)
                            .unwrap_or_default()
                            .to_string(),
                        will_retry: false,
                        retry_at_ms: 0,
                    },
                };
                let appended = events::append(tx, &[event(&task, detail)], now, "")?;
                let taken = Taken {
                    accepted: true,
                    reason: String::new(),
                };
                Ok(((taken, claimed), appended))
            })
            .await?;
        self.task_metrics.ended(if taken.accepted {
            event_kind
        } else {
            TaskEvent::Cancel
        });
        self.lease_ended(task_id);
        self.notify_tasks();
        Ok(taken)
    }

    /// A technical failure: retried after a backoff while attempts are left (and `retryable`),
    /// else the node fails.
    pub async fn fail_task(
        &self,
        task_id: &str,
        token: &str,
        error: &str,
        retryable: bool,
        backoff_ms: Option<u64>,
    ) -> Result<FailOutcome, RunnerError> {
        let now = self.now_ms();
        let order = self.store.next_id()?;
        let default_max = self.mailbox.config().default_max_attempts;
        let (id, token, error) = (task_id.to_string(), token.to_string(), error.to_string());
        let outcome = self
            .commit(move |tx| {
                // A repeat of the FailTask that ended this lease: the same answer, no change.
                if let Some(task) = ttx::get(tx, &id)?
                    && task.lease_token == token
                    && task.state != TaskState::Leased
                {
                    let out = FailOutcome {
                        will_retry: task.state == TaskState::Queued,
                        attempt: task.attempt,
                        retry_at_ms: match task.state {
                            TaskState::Queued => task.available_at_ms,
                            _ => 0,
                        },
                    };
                    if matches!(
                        task.state,
                        TaskState::Queued | TaskState::Failed | TaskState::Cancelled
                    ) {
                        return Ok((out, Vec::new()));
                    }
                }
                let task = ttx::leased(tx, &id, &token)?;
                let attempt = task.attempt;
                if task.cancel_requested {
                    let task = ttx::close(tx, task, TaskEvent::Cancel, &error, now)?;
                    let appended = events::append(tx, &[cancelled_event(&task)], now, "")?;
                    let out = FailOutcome {
                        will_retry: false,
                        attempt,
                        retry_at_ms: 0,
                    };
                    return Ok((out, appended));
                }
                let retry = retryable && task.attempt < task.max_attempts;
                let backoff = backoff_ms
                    .map(|b| b.min(tasks::MAX_BACKOFF_MS))
                    .unwrap_or_else(|| task.backoff_after(task.attempt));
                let (out, appended) = attempt_failed(
                    tx,
                    task,
                    TaskFailure::Failed,
                    &error,
                    retry,
                    backoff,
                    now,
                    order,
                    default_max,
                )?;
                Ok((out, appended))
            })
            .await?;
        if !outcome.will_retry {
            self.task_metrics.ended(TaskEvent::Fail);
        }
        self.lease_ended(task_id);
        self.after_task_change();
        Ok(outcome)
    }

    pub(crate) fn after_task_change(&self) {
        self.notify_tasks();
        self.wake_pool();
    }

    /// Tasks in id order, filtered.
    pub fn list_tasks(
        &self,
        filter: &TaskFilter,
        page_size: u32,
        page_token: &str,
    ) -> Result<TaskPage, RunnerError> {
        let limit = page::size(page_size);
        let after = if page_token.is_empty() {
            Vec::new()
        } else {
            page::key(TASKS, page_token)
                .ok_or_else(|| RunnerError::invalid("page_token", page::INVALID))?
        };
        let mut out = Vec::new();
        let mut more = false;
        for entry in self.store.tree(T::Tasks).after(&after) {
            let (_, bytes) = entry?;
            let task: Task = codec::decode("task", &bytes)?;
            let keep = (filter.states.is_empty() || filter.states.contains(&task.state))
                && filter
                    .task_type
                    .as_ref()
                    .is_none_or(|g| g.is_match(&task.task_type))
                && (filter.worker_id.is_empty() || task.worker_id == filter.worker_id)
                && (filter.run_id.is_empty() || task.run_id == filter.run_id);
            if !keep {
                continue;
            }
            if out.len() == limit {
                more = true;
                break;
            }
            out.push(task);
        }
        let next_page_token = match (more, out.last()) {
            (true, Some(last)) => page::token(TASKS, last.task_id.as_bytes()),
            _ => String::new(),
        };
        Ok(TaskPage {
            tasks: out,
            next_page_token,
        })
    }

    /// (queued, leased) tasks now, for metrics.
    pub fn live_task_counts(&self) -> (u64, u64) {
        let count = |t| {
            self.store
                .tree(t)
                .iter()
                .keys()
                .filter(|k| k.is_ok())
                .count() as u64
        };
        (count(T::TaskQueue), count(T::TaskLeases))
    }
}

/// One attempt ended without a result: requeue it after `backoff` (when `retry`), else fail the
/// task and deliver the failure to the run.
#[allow(clippy::too_many_arguments)]
pub(super) fn attempt_failed(
    tx: &Tx<'_>,
    task: Task,
    cause: TaskFailure,
    error: &str,
    retry: bool,
    backoff: u64,
    now: u64,
    order: u64,
    default_max: u32,
) -> TxResult<(FailOutcome, Vec<arbor_shared::domain::Event>), RunnerError> {
    let attempt = task.attempt;
    let (task, retry_at_ms) = if retry {
        let at = now + backoff;
        (ttx::requeue(tx, task, at, error, now)?, at)
    } else {
        let Some(run) = records::get_run(tx, &task.run_id)? else {
            return abort(RunnerError::RunNotFound(task.run_id.clone()));
        };
        let task = ttx::close(tx, task, TaskEvent::Fail, error, now)?;
        let result = json!({"status": "failed", "result": error});
        deliver(
            tx,
            &run,
            &outcome(&task, result),
            (order, now, default_max),
            None,
        )?;
        (task, 0)
    };
    let detail = EventDetail::TaskFailed {
        task: task.event_ref(),
        error: error.to_string(),
        cause,
        code: String::new(),
        will_retry: retry,
        retry_at_ms,
    };
    let appended = events::append(tx, &[event(&task, detail)], now, "")?;
    Ok((
        FailOutcome {
            will_retry: retry,
            attempt,
            retry_at_ms,
        },
        appended,
    ))
}
