//! Task changes inside a transaction: each keeps the record and its queue and lease index
//! entries in step, and moves the state only through [`transition`](super::transition).

use serde_json::Value as Json;

use super::{Task, TaskEvent, TaskState, transition};
use crate::{
    engine::TaskOrder,
    error::RunnerError,
    store::{
        T, Tx, TxResult, Wake, abort, codec,
        tables::{
            finished,
            tasks::{lease_key, queue_key},
        },
    },
};

pub fn get(tx: &Tx<'_>, task_id: &str) -> TxResult<Option<Task>, RunnerError> {
    match tx.tree(T::Tasks).get(task_id.as_bytes())? {
        None => Ok(None),
        Some(bytes) => match codec::decode("task", &bytes) {
            Ok(task) => Ok(Some(task)),
            Err(e) => abort(e),
        },
    }
}

fn put(tx: &Tx<'_>, task: &Task) -> TxResult<(), RunnerError> {
    tx.tree(T::Tasks)
        .insert(task.task_id.as_bytes(), codec::encode(task))?;
    Ok(())
}

fn moved(task: &Task, event: TaskEvent) -> TxResult<TaskState, RunnerError> {
    transition(task.state, event).or_else(|e| abort(RunnerError::InvalidTransition(e.to_string())))
}

/// Removes the task from whichever index holds it.
fn unindex(tx: &Tx<'_>, task: &Task) -> TxResult<(), RunnerError> {
    match task.state {
        TaskState::Queued => tx.tree(T::TaskQueue).remove(queue_key(
            task.available_at_ms,
            task.order,
            &task.task_id,
        ))?,
        TaskState::Leased => {
            tx.tree(T::TaskLeases)
                .remove(lease_key(task.lease_until_ms, &task.task_id))?;
            // A lease that ended or moved frees a slot of a task stream, maybe elsewhere.
            tx.wake(Wake::Tasks);
        }
        _ => {}
    }
    Ok(())
}

fn enqueue(tx: &Tx<'_>, task: &Task) -> TxResult<(), RunnerError> {
    tx.tree(T::TaskQueue).insert(
        queue_key(task.available_at_ms, task.order, &task.task_id),
        task.task_type.as_bytes(),
    )?;
    tx.wake(Wake::Tasks);
    Ok(())
}

/// Queues the task a step asked for; a task that exists already (a replayed step) is left
/// alone. Returns whether it was new.
pub fn queue(
    tx: &Tx<'_>,
    order: &TaskOrder,
    (run_id, thread_id): (&str, &str),
    seq: u64,
    now: u64,
) -> TxResult<bool, RunnerError> {
    if get(tx, &order.task_id)?.is_some() {
        return Ok(false);
    }
    let task = Task {
        task_id: order.task_id.clone(),
        task_type: order.task_type.clone(),
        kind: order.kind,
        state: TaskState::Queued,
        run_id: run_id.to_string(),
        thread_id: thread_id.to_string(),
        node_locator: order.node_locator.clone(),
        args: order.args.clone(),
        idempotency_key: order.idempotency_key.clone(),
        attempt: 0,
        max_attempts: order.max_attempts.max(1),
        backoff_ms: order.backoff_ms,
        worker_id: String::new(),
        lease_token: String::new(),
        lease_until_ms: 0,
        lease_ms: 0,
        available_at_ms: now,
        dispatched_at_ms: 0,
        cancel_requested: false,
        cancel_reason: String::new(),
        details: Json::Null,
        last_error: String::new(),
        created_at_ms: now,
        updated_at_ms: now,
        order: seq,
    };
    enqueue(tx, &task)?;
    put(tx, &task)?;
    Ok(true)
}

/// Leases a queued task that is due to `worker_id`; `None` when another worker took it first
/// or it is not due.
pub fn dispatch(
    tx: &Tx<'_>,
    task_id: &str,
    worker_id: &str,
    lease_ms: u32,
    token: &str,
    now: u64,
) -> TxResult<Option<Task>, RunnerError> {
    let Some(mut task) = get(tx, task_id)? else {
        return Ok(None);
    };
    if task.state != TaskState::Queued || task.available_at_ms > now {
        return Ok(None);
    }
    unindex(tx, &task)?;
    task.state = moved(&task, TaskEvent::Dispatch)?;
    task.attempt += 1;
    task.worker_id = worker_id.to_string();
    task.lease_token = token.to_string();
    task.lease_ms = lease_ms;
    task.lease_until_ms = now + u64::from(lease_ms);
    task.dispatched_at_ms = now;
    task.updated_at_ms = now;
    tx.tree(T::TaskLeases)
        .insert(lease_key(task.lease_until_ms, &task.task_id), [])?;
    put(tx, &task)?;
    Ok(Some(task))
}

/// The task, if `token` is its current lease's: a foreign or stale token is ABORTED, and so is
/// a task that is no longer leased.
pub fn leased(tx: &Tx<'_>, task_id: &str, token: &str) -> TxResult<Task, RunnerError> {
    let Some(task) = get(tx, task_id)? else {
        return abort(RunnerError::TaskNotFound(task_id.to_string()));
    };
    if token.is_empty() || task.lease_token != token {
        return abort(RunnerError::StaleLease(task_id.to_string()));
    }
    if task.state != TaskState::Leased {
        return abort(RunnerError::TaskClosed {
            task_id: task_id.to_string(),
            state: task.state.as_str(),
        });
    }
    Ok(task)
}

/// Extends the lease from now by the lease's length and keeps `details` when given.
pub fn heartbeat(
    tx: &Tx<'_>,
    mut task: Task,
    details: Option<Json>,
    now: u64,
) -> TxResult<Task, RunnerError> {
    unindex(tx, &task)?;
    task.state = moved(&task, TaskEvent::Heartbeat)?;
    task.lease_until_ms = now + u64::from(task.lease_ms);
    if let Some(details) = details {
        task.details = details;
    }
    task.updated_at_ms = now;
    tx.tree(T::TaskLeases)
        .insert(lease_key(task.lease_until_ms, &task.task_id), [])?;
    put(tx, &task)?;
    Ok(task)
}

/// Ends the task (Completed, Failed, Errored, Cancelled or Resolved).
pub fn close(
    tx: &Tx<'_>,
    mut task: Task,
    event: TaskEvent,
    error: &str,
    now: u64,
) -> TxResult<Task, RunnerError> {
    unindex(tx, &task)?;
    task.state = moved(&task, event)?;
    if !error.is_empty() {
        task.last_error = error.to_string();
    }
    task.updated_at_ms = now;
    // Retention deletes ended tasks with finished runs and jobs.
    tx.tree(T::Finished)
        .insert(finished::key(finished::TASK, now, &task.task_id), [])?;
    put(tx, &task)?;
    Ok(task)
}

/// Returns a leased task to the queue for another attempt at `available_at_ms`.
pub fn requeue(
    tx: &Tx<'_>,
    mut task: Task,
    available_at_ms: u64,
    error: &str,
    now: u64,
) -> TxResult<Task, RunnerError> {
    unindex(tx, &task)?;
    task.state = moved(&task, TaskEvent::Retry)?;
    task.available_at_ms = available_at_ms;
    task.last_error = error.to_string();
    task.updated_at_ms = now;
    enqueue(tx, &task)?;
    put(tx, &task)?;
    Ok(task)
}

/// What a released task's `lease_token` becomes: no call can act with it (every fenced call
/// compares the whole token), yet a repeat of the release recognises its own.
pub fn released_token(token: &str) -> String {
    format!("released:{token}")
}

/// Gives a leased task back: queued again at once, with the attempt it had before this lease,
/// so the next dispatch carries the same number and no attempt is spent. The details stay.
pub fn release(tx: &Tx<'_>, mut task: Task, now: u64) -> TxResult<Task, RunnerError> {
    unindex(tx, &task)?;
    task.state = moved(&task, TaskEvent::Release)?;
    task.attempt = task.attempt.saturating_sub(1);
    task.lease_token = released_token(&task.lease_token);
    task.available_at_ms = now;
    task.updated_at_ms = now;
    enqueue(tx, &task)?;
    put(tx, &task)?;
    Ok(task)
}

/// The run no longer wants the task's result (its suspension was withdrawn): a queued task is
/// cancelled, a leased one is flagged so its worker hears it on the next heartbeat.
pub fn cancel(
    tx: &Tx<'_>,
    task_id: &str,
    reason: &str,
    now: u64,
) -> TxResult<Option<Task>, RunnerError> {
    let Some(mut task) = get(tx, task_id)? else {
        return Ok(None);
    };
    match task.state {
        TaskState::Queued => {
            task.cancel_requested = true;
            task.cancel_reason = reason.to_string();
            close(tx, task, TaskEvent::Cancel, "", now).map(Some)
        }
        TaskState::Leased if !task.cancel_requested => {
            task.cancel_requested = true;
            task.cancel_reason = reason.to_string();
            task.updated_at_ms = now;
            put(tx, &task)?;
            Ok(Some(task))
        }
        _ => Ok(None),
    }
}

/// An `external` node's suspension was answered through `Resolve`: its task is closed.
pub fn resolve_external(tx: &Tx<'_>, task: Task, now: u64) -> TxResult<(), RunnerError> {
    if !task.state.is_terminal() {
        close(tx, task, TaskEvent::Resolve, "", now)?;
    }
    Ok(())
}
