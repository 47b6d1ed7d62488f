//! The `arbor.runner.v1.WorkerService` handlers: task workers take leased tasks (streamed with
//! flow control, or long-polled), heartbeat, and end each attempt. Thin adapters over the
//! runner's task calls.

use std::{pin::Pin, sync::Arc, time::Duration};

use arbor_shared::{
    auth::{Role, principal_of},
    json::{from_optional_value, to_proto_value},
    proto::runner::v1::{self as pb, worker_service_server::WorkerService},
    time::{opt_timestamp, timestamp},
};
use globset::{Glob, GlobSet, GlobSetBuilder};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::{
    error::RunnerError,
    runs::{Runner, tasks::TaskFilter},
    tasks::{self, Task, TaskState},
};

/// Longest wait between looks at the queue when nothing woke a stream (a task that falls due
/// after a backoff, a lease that ended on another replica).
const IDLE_LOOK: Duration = Duration::from_millis(500);
/// Back-off of a stream while the store cannot be reached.
const UNAVAILABLE_PAUSE: Duration = Duration::from_millis(250);
const MAX_IN_FLIGHT: u32 = 1024;
const MAX_TYPES: usize = 64;
const MAX_POLL_WAIT_MS: u32 = 60_000;
const MAX_TEXT: usize = 64 * 1024;

type Res<T> = Result<Response<T>, Status>;

#[derive(Clone)]
pub struct WorkerGrpc {
    runner: Arc<Runner>,
    shutdown: CancellationToken,
}

impl WorkerGrpc {
    pub fn new(runner: Arc<Runner>, shutdown: CancellationToken) -> Self {
        Self { runner, shutdown }
    }
}

fn check_id(field: &str, value: &str) -> Result<(), RunnerError> {
    if value.is_empty() || value.len() > 128 || value.contains('\0') {
        return Err(RunnerError::invalid(
            field,
            "must be 1-128 bytes without NUL",
        ));
    }
    Ok(())
}

fn check_text(field: &str, value: &str) -> Result<(), RunnerError> {
    if value.len() > MAX_TEXT {
        return Err(RunnerError::invalid(field, "must be at most 64 KiB"));
    }
    Ok(())
}

/// The longest task type pattern, in bytes (task type names are at most 128 characters too).
const MAX_PATTERN: usize = 128;

/// One task type pattern: `*` and `?` only, what every worker helper can match too.
fn pattern(field: &str, p: &str) -> Result<Glob, RunnerError> {
    if p.is_empty() || p.len() > MAX_PATTERN {
        return Err(RunnerError::invalid(
            field,
            format!(
                "a task type pattern must be 1-{MAX_PATTERN} bytes (this one has {})",
                p.len()
            ),
        ));
    }
    if p.contains(['[', ']', '{', '}', '\\']) {
        return Err(RunnerError::invalid(
            field,
            "only `*` (any run of characters) and `?` (one character) are supported",
        ));
    }
    Glob::new(p).map_err(|e| RunnerError::invalid(field, e.to_string()))
}

fn globs(field: &str, patterns: &[String]) -> Result<GlobSet, RunnerError> {
    if patterns.is_empty() || patterns.len() > MAX_TYPES {
        return Err(RunnerError::invalid(
            field,
            "give 1 to 64 task type patterns",
        ));
    }
    let mut set = GlobSetBuilder::new();
    for (i, p) in patterns.iter().enumerate() {
        set.add(pattern(&format!("{field}[{i}]"), p)?);
    }
    set.build()
        .map_err(|e| RunnerError::invalid(field, e.to_string()))
}

fn lease(lease_ms: u32) -> Result<u32, RunnerError> {
    match lease_ms {
        0 => Ok(tasks::DEFAULT_LEASE_MS),
        n if tasks::LEASE_MS.contains(&n) => Ok(n),
        _ => Err(RunnerError::invalid(
            "lease_ms",
            "must be 100 ms to 1 h (0: 30 s)",
        )),
    }
}

fn fenced(task_id: &str, token: &str) -> Result<(), RunnerError> {
    check_id("task_id", task_id)?;
    check_id("lease_token", token)
}

fn activation(task: &Task) -> pb::TaskActivation {
    pb::TaskActivation {
        task_id: task.task_id.clone(),
        task_type: task.task_type.clone(),
        lease_token: task.lease_token.clone(),
        args: Some(to_proto_value(&task.args)),
        idempotency_key: task.idempotency_key.clone(),
        attempt: task.attempt,
        max_attempts: task.max_attempts,
        lease_until: Some(timestamp(task.lease_until_ms)),
        details: Some(to_proto_value(&task.details)),
        run_id: task.run_id.clone(),
        thread_id: task.thread_id.clone(),
        node_locator: task.node_locator.clone(),
        dispatched_at: Some(timestamp(task.dispatched_at_ms)),
        lease_ms: task.lease_ms,
    }
}

pub fn state_to_wire(state: TaskState) -> pb::TaskState {
    match state {
        TaskState::Queued => pb::TaskState::Queued,
        TaskState::Leased => pb::TaskState::Leased,
        TaskState::Completed => pb::TaskState::Completed,
        TaskState::Failed => pb::TaskState::Failed,
        TaskState::Errored => pb::TaskState::Errored,
        TaskState::Cancelled => pb::TaskState::Cancelled,
        TaskState::Resolved => pb::TaskState::Resolved,
    }
}

fn state_from_wire(value: i32) -> Result<TaskState, RunnerError> {
    let state = match pb::TaskState::try_from(value) {
        Ok(pb::TaskState::Queued) => TaskState::Queued,
        Ok(pb::TaskState::Leased) => TaskState::Leased,
        Ok(pb::TaskState::Completed) => TaskState::Completed,
        Ok(pb::TaskState::Failed) => TaskState::Failed,
        Ok(pb::TaskState::Errored) => TaskState::Errored,
        Ok(pb::TaskState::Cancelled) => TaskState::Cancelled,
        Ok(pb::TaskState::Resolved) => TaskState::Resolved,
        _ => {
            return Err(RunnerError::invalid(
                "states",
                format!("unknown task state {value}"),
            ));
        }
    };
    Ok(state)
}

pub fn task_to_wire(task: &Task) -> pb::Task {
    pb::Task {
        task_id: task.task_id.clone(),
        task_type: task.task_type.clone(),
        state: state_to_wire(task.state).into(),
        run_id: task.run_id.clone(),
        thread_id: task.thread_id.clone(),
        node_locator: task.node_locator.clone(),
        attempt: task.attempt,
        max_attempts: task.max_attempts,
        worker_id: task.worker_id.clone(),
        lease_until: opt_timestamp(task.lease_until_ms),
        available_at: opt_timestamp(task.available_at_ms),
        cancel_requested: task.cancel_requested,
        last_error: task.last_error.clone(),
        created_at: opt_timestamp(task.created_at_ms),
        updated_at: opt_timestamp(task.updated_at_ms),
        idempotency_key: task.idempotency_key.clone(),
    }
}

const WORKER_ROLES: &[Role] = &[Role::Worker, Role::Service];

#[tonic::async_trait]
impl WorkerService for WorkerGrpc {
    type StreamTasksStream =
        Pin<Box<dyn Stream<Item = Result<pb::StreamTasksResponse, Status>> + Send>>;

    async fn stream_tasks(
        &self,
        req: Request<pb::StreamTasksRequest>,
    ) -> Res<Self::StreamTasksStream> {
        principal_of(&req).require(WORKER_ROLES, "take tasks")?;
        let r = req.into_inner();
        check_id("worker_id", &r.worker_id)?;
        let types = globs("task_types", &r.task_types)?;
        if r.max_in_flight == 0 || r.max_in_flight > MAX_IN_FLIGHT {
            return Err(RunnerError::invalid("max_in_flight", "must be 1 to 1024").into());
        }
        let lease_ms = lease(r.lease_ms)?;
        let max = r.max_in_flight as usize;
        let (tx, rx) = tokio::sync::mpsc::channel(max.min(64) + 1);
        let (runner, stop) = (self.runner.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            // (task id, lease token) of activations sent and not yet finished. Leases that end
            // in this process are reported on `ends`; the store is read for the rest (a lease
            // ended on another replica) once per IDLE_LOOK.
            let mut in_flight: Vec<(String, String)> = Vec::new();
            let mut ends = runner.task_ends();
            let mut looked = tokio::time::Instant::now();
            loop {
                let changed = runner.task_changes();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let mut look = looked.elapsed() >= IDLE_LOOK;
                loop {
                    match ends.try_recv() {
                        Ok(id) => in_flight.retain(|(t, _)| *t != id),
                        Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => look = true,
                        Err(_) => break,
                    }
                }
                if look {
                    in_flight.retain(|(id, token)| runner.holds_lease(id, token));
                    looked = tokio::time::Instant::now();
                }
                let mut wait = IDLE_LOOK;
                if in_flight.len() < max {
                    let free = max - in_flight.len();
                    match runner
                        .take_tasks(&r.worker_id, &types, lease_ms, free)
                        .await
                    {
                        Ok((taken, next_due)) => {
                            let sent = !taken.is_empty();
                            for task in taken {
                                in_flight.push((task.task_id.clone(), task.lease_token.clone()));
                                let item = pb::StreamTasksResponse {
                                    task: Some(activation(&task)),
                                };
                                // A worker that went away leaves its leases to expire: its
                                // tasks are tried again then.
                                if tx.send(Ok(item)).await.is_err() {
                                    return;
                                }
                            }
                            if sent {
                                continue;
                            }
                            if let Some(due) = next_due {
                                let now = runner.now_ms();
                                wait = wait.min(Duration::from_millis(due.saturating_sub(now)));
                            }
                        }
                        Err(RunnerError::Unavailable(_)) => wait = UNAVAILABLE_PAUSE,
                        Err(e) => {
                            let _ = tx.send(Err(e.into())).await;
                            return;
                        }
                    }
                }
                tokio::select! {
                    _ = &mut changed => {}
                    _ = tokio::time::sleep(wait) => {}
                    _ = tx.closed() => return,
                    _ = stop.cancelled() => {
                        let _ = tx
                            .send(Err(Status::unavailable("runner-svc is shutting down; reconnect")))
                            .await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn poll_tasks(&self, req: Request<pb::PollTasksRequest>) -> Res<pb::PollTasksResponse> {
        principal_of(&req).require(WORKER_ROLES, "take tasks")?;
        let r = req.into_inner();
        check_id("worker_id", &r.worker_id)?;
        let types = globs("task_types", &r.task_types)?;
        let max = match r.max_tasks {
            0 => 1,
            n @ 1..=MAX_IN_FLIGHT => n as usize,
            _ => return Err(RunnerError::invalid("max_tasks", "must be at most 1024").into()),
        };
        if r.wait_ms > MAX_POLL_WAIT_MS {
            return Err(RunnerError::invalid("wait_ms", "must be at most 60000").into());
        }
        let lease_ms = lease(r.lease_ms)?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(r.wait_ms.into());
        loop {
            let changed = self.runner.task_changes();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (taken, _) = self
                .runner
                .take_tasks(&r.worker_id, &types, lease_ms, max)
                .await?;
            if !taken.is_empty() || tokio::time::Instant::now() >= deadline {
                return Ok(Response::new(pb::PollTasksResponse {
                    tasks: taken.iter().map(activation).collect(),
                }));
            }
            let look = (tokio::time::Instant::now() + IDLE_LOOK).min(deadline);
            tokio::select! {
                _ = &mut changed => {}
                _ = tokio::time::sleep_until(look) => {}
                _ = self.shutdown.cancelled() => {
                    return Err(Status::unavailable("runner-svc is shutting down"));
                }
            }
        }
    }

    async fn heartbeat(&self, req: Request<pb::HeartbeatRequest>) -> Res<pb::HeartbeatResponse> {
        principal_of(&req).require(WORKER_ROLES, "heartbeat tasks")?;
        let r = req.into_inner();
        fenced(&r.task_id, &r.lease_token)?;
        let details = r.details.as_ref().map(|d| from_optional_value(Some(d)));
        let task = self
            .runner
            .heartbeat_task(&r.task_id, &r.lease_token, details)
            .await?;
        Ok(Response::new(pb::HeartbeatResponse {
            lease_until: Some(timestamp(task.lease_until_ms)),
            cancel_requested: task.cancel_requested,
        }))
    }

    async fn complete_task(
        &self,
        req: Request<pb::CompleteTaskRequest>,
    ) -> Res<pb::CompleteTaskResponse> {
        principal_of(&req).require(WORKER_ROLES, "complete tasks")?;
        let r = req.into_inner();
        fenced(&r.task_id, &r.lease_token)?;
        let output = from_optional_value(r.output.as_ref());
        let taken = self
            .runner
            .complete_task(&r.task_id, &r.lease_token, output)
            .await?;
        Ok(Response::new(pb::CompleteTaskResponse {
            accepted: taken.accepted,
            reason: taken.reason,
        }))
    }

    async fn fail_task(&self, req: Request<pb::FailTaskRequest>) -> Res<pb::FailTaskResponse> {
        principal_of(&req).require(WORKER_ROLES, "fail tasks")?;
        let r = req.into_inner();
        fenced(&r.task_id, &r.lease_token)?;
        check_text("error", &r.error)?;
        if r.backoff_ms
            .is_some_and(|b| u64::from(b) > tasks::MAX_BACKOFF_MS)
        {
            return Err(RunnerError::invalid("backoff_ms", "must be at most 1 h").into());
        }
        let out = self
            .runner
            .fail_task(
                &r.task_id,
                &r.lease_token,
                &r.error,
                r.retryable,
                r.backoff_ms.map(u64::from),
            )
            .await?;
        Ok(Response::new(pb::FailTaskResponse {
            will_retry: out.will_retry,
            attempt: out.attempt,
            retry_at: opt_timestamp(out.retry_at_ms),
        }))
    }

    async fn throw_error(
        &self,
        req: Request<pb::ThrowErrorRequest>,
    ) -> Res<pb::ThrowErrorResponse> {
        principal_of(&req).require(WORKER_ROLES, "throw task errors")?;
        let r = req.into_inner();
        fenced(&r.task_id, &r.lease_token)?;
        check_id("code", &r.code)?;
        check_text("message", &r.message)?;
        let taken = self
            .runner
            .throw_task(&r.task_id, &r.lease_token, &r.code, &r.message)
            .await?;
        Ok(Response::new(pb::ThrowErrorResponse {
            accepted: taken.accepted,
            reason: taken.reason,
        }))
    }

    async fn release_task(
        &self,
        req: Request<pb::ReleaseTaskRequest>,
    ) -> Res<pb::ReleaseTaskResponse> {
        principal_of(&req).require(WORKER_ROLES, "release tasks")?;
        let r = req.into_inner();
        fenced(&r.task_id, &r.lease_token)?;
        check_text("reason", &r.reason)?;
        let out = self
            .runner
            .release_task(&r.task_id, &r.lease_token, &r.reason)
            .await?;
        Ok(Response::new(pb::ReleaseTaskResponse {
            accepted: out.accepted,
            reason: out.reason,
            attempt: out.attempt,
        }))
    }

    async fn list_tasks(&self, req: Request<pb::ListTasksRequest>) -> Res<pb::ListTasksResponse> {
        principal_of(&req).require(super::access::TASK_READERS, "list tasks")?;
        let r = req.into_inner();
        let states = r
            .states
            .iter()
            .map(|s| state_from_wire(*s))
            .collect::<Result<Vec<_>, _>>()?;
        let task_type = match r.task_type.as_str() {
            "" => None,
            p => Some(pattern("task_type", p)?.compile_matcher()),
        };
        let filter = TaskFilter {
            states,
            task_type,
            worker_id: r.worker_id,
            run_id: r.run_id,
        };
        let page = self
            .runner
            .list_tasks(&filter, r.page_size, &r.page_token)?;
        Ok(Response::new(pb::ListTasksResponse {
            tasks: page.tasks.iter().map(task_to_wire).collect(),
            next_page_token: page.next_page_token,
        }))
    }
}
