//! ReleaseTask: a worker gives a leased task back without spending an attempt (a draining
//! worker hands over what it has not finished, instead of failing it or letting its lease run
//! out). One durable transaction, fenced by the lease token like every other task call.

use std::sync::atomic::Ordering;

use arbor_shared::domain::EventDetail;

use super::cancelled_event;
use crate::{
    error::RunnerError,
    events::{self, NewEvent},
    runs::Runner,
    tasks::{TaskEvent, TaskState, tx as ttx},
};

/// How a ReleaseTask call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// False when the run had asked to cancel the task: it was cancelled, not queued.
    pub accepted: bool,
    pub reason: String,
    /// The released attempt's number, which the next lease carries again.
    pub attempt: u32,
}

impl Runner {
    /// Queues a leased task again at once, with the attempt number it had; a task whose
    /// cancellation was requested is cancelled instead. A repeat with the same token (its
    /// answer was lost) is answered the same and changes nothing.
    pub async fn release_task(
        &self,
        task_id: &str,
        token: &str,
        reason: &str,
    ) -> Result<Released, RunnerError> {
        let now = self.now_ms();
        let (id, token, reason) = (task_id.to_string(), token.to_string(), reason.to_string());
        let (released, changed) = self
            .commit(move |tx| {
                if let Some(task) = ttx::get(tx, &id)? {
                    if task.state == TaskState::Queued
                        && task.lease_token == ttx::released_token(&token)
                    {
                        let same = Released {
                            accepted: true,
                            reason: "already released".into(),
                            attempt: task.attempt + 1,
                        };
                        return Ok(((same, false), Vec::new()));
                    }
                    if task.state == TaskState::Cancelled && task.lease_token == token {
                        let same = Released {
                            accepted: false,
                            reason: format!("task was cancelled: {}", task.cancel_reason),
                            attempt: task.attempt,
                        };
                        return Ok(((same, false), Vec::new()));
                    }
                }
                let task = ttx::leased(tx, &id, &token)?;
                let attempt = task.attempt;
                if task.cancel_requested {
                    let cancelled = Released {
                        accepted: false,
                        reason: format!("task was cancelled: {}", task.cancel_reason),
                        attempt,
                    };
                    let task = ttx::close(tx, task, TaskEvent::Cancel, "", now)?;
                    let appended = events::append(tx, &[cancelled_event(&task)], now, "")?;
                    return Ok(((cancelled, true), appended));
                }
                let detail = EventDetail::TaskReleased {
                    task: task.event_ref(),
                    reason: reason.clone(),
                };
                let task = ttx::release(tx, task, now)?;
                let event = NewEvent {
                    run_id: task.run_id.clone(),
                    thread_id: task.thread_id.clone(),
                    detail,
                };
                let appended = events::append(tx, &[event], now, "")?;
                let released = Released {
                    accepted: true,
                    reason: String::new(),
                    attempt,
                };
                Ok(((released, true), appended))
            })
            .await?;
        if !changed {
            return Ok(released);
        }
        if released.accepted {
            self.task_metrics.released.fetch_add(1, Ordering::Relaxed);
        } else {
            self.task_metrics.ended(TaskEvent::Cancel);
        }
        self.lease_ended(task_id);
        self.after_task_change();
        Ok(released)
    }
}
