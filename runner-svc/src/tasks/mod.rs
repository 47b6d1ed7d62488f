//! Tasks: the work a node hands to task workers (a remote tool call that passed its guards, or
//! an `external` node), leased to one worker at a time and fenced by the lease's token.
//!
//! A task's id is the id of the suspension it resolves, so a replayed tick asks for the same
//! task, and the task is queued in the same transaction as the step that suspended. Its outcome
//! reaches the run as a decision in the run's inbox, in the same transaction that ends the task:
//! a completed task's output is taken once. Withdrawing the suspension (a timeout, a cancelled or
//! superseded run, the run's end) cancels the task in the step that withdraws it.
//!
//! ```text
//! Queued  --dispatch-->                    Leased   (attempt + 1, new token)
//! Leased  --heartbeat-->                   Leased   (lease extended)
//! Leased  --complete-->                    Completed
//! Leased  --fail(retryable) / lease expired--> Queued (after backoff; attempts left)
//! Leased  --release-->                     Queued   (at once; attempt - 1, so none is spent)
//! Leased  --fail / lease expired, no attempts left--> Failed
//! Leased  --throw-->                       Errored
//! Queued  --cancel-->                      Cancelled
//! Leased  --cancel-->                      Leased with cancel_requested; its next completion,
//!                                          failure or expiry makes it Cancelled
//! Queued/Leased --Resolve (external only)--> Resolved
//! ```
//!
//! Time: `available_at`, `lease_until` are on the store's clock (the database's on a shared
//! store), so replicas agree on when a lease ran out.

pub mod tx;

use std::sync::atomic::{AtomicU64, Ordering};

use arbor_shared::domain::TaskRef;
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::engine::TaskKind;

/// Lease a worker gets when it asks for none.
pub const DEFAULT_LEASE_MS: u32 = 30_000;
/// Bounds of a lease a worker may ask for.
pub const LEASE_MS: std::ops::RangeInclusive<u32> = 100..=3_600_000;
/// Upper bound of a retry's backoff.
pub const MAX_BACKOFF_MS: u64 = 3_600_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskState {
    Queued,
    Leased,
    Completed,
    Failed,
    Errored,
    Cancelled,
    Resolved,
}

impl TaskState {
    pub const ALL: [TaskState; 7] = [
        TaskState::Queued,
        TaskState::Leased,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::Errored,
        TaskState::Cancelled,
        TaskState::Resolved,
    ];

    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Queued | Self::Leased)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Leased => "leased",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Errored => "errored",
            Self::Cancelled => "cancelled",
            Self::Resolved => "resolved",
        }
    }
}

/// What happens to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskEvent {
    Dispatch,
    Heartbeat,
    Complete,
    Retry,
    /// The worker gave the lease back (ReleaseTask): queued again, no attempt spent.
    Release,
    Fail,
    Throw,
    Cancel,
    Resolve,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("task cannot go from {} on {event:?}", .from.as_str())]
pub struct InvalidTransition {
    pub from: TaskState,
    pub event: TaskEvent,
}

/// The next state, or why the move is illegal. (A cancel of a leased task only flags it; the
/// lease's end then makes it Cancelled whatever the worker reports.)
pub fn transition(from: TaskState, event: TaskEvent) -> Result<TaskState, InvalidTransition> {
    use TaskEvent as E;
    use TaskState as S;
    Ok(match (from, event) {
        (S::Queued, E::Dispatch) => S::Leased,
        (S::Leased, E::Heartbeat) => S::Leased,
        (S::Leased, E::Complete) => S::Completed,
        (S::Leased, E::Retry | E::Release) => S::Queued,
        (S::Leased, E::Fail) => S::Failed,
        (S::Leased, E::Throw) => S::Errored,
        (S::Queued, E::Cancel) => S::Cancelled,
        (S::Leased, E::Cancel) => S::Cancelled,
        (S::Queued | S::Leased, E::Resolve) => S::Resolved,
        _ => return Err(InvalidTransition { from, event }),
    })
}

/// A stored task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub task_id: String,
    pub task_type: String,
    pub kind: TaskKind,
    pub state: TaskState,
    pub run_id: String,
    pub thread_id: String,
    pub node_locator: String,
    #[serde(with = "arbor_shared::json::as_text")]
    pub args: Json,
    pub idempotency_key: String,
    /// Attempts dispatched so far (the current one while leased).
    pub attempt: u32,
    pub max_attempts: u32,
    pub backoff_ms: u64,
    pub worker_id: String,
    pub lease_token: String,
    pub lease_until_ms: u64,
    pub lease_ms: u32,
    pub available_at_ms: u64,
    pub dispatched_at_ms: u64,
    pub cancel_requested: bool,
    pub cancel_reason: String,
    /// The last heartbeat's details, kept for later attempts.
    #[serde(with = "arbor_shared::json::as_text")]
    pub details: Json,
    pub last_error: String,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    /// Queue order among tasks available at the same time.
    pub order: u64,
}

impl Task {
    pub fn event_ref(&self) -> TaskRef {
        TaskRef {
            task_id: self.task_id.clone(),
            task_type: self.task_type.clone(),
            attempt: self.attempt,
            worker_id: self.worker_id.clone(),
            request_id: self.task_id.clone(),
        }
    }

    /// The wait before attempt `attempt + 1`: the node's backoff, doubling per attempt.
    pub fn backoff_after(&self, attempt: u32) -> u64 {
        let doublings = attempt.saturating_sub(1).min(20);
        self.backoff_ms
            .saturating_mul(1u64 << doublings)
            .min(MAX_BACKOFF_MS)
    }
}

/// Counters of this process's task traffic, for metrics.
#[derive(Debug, Default)]
pub struct TaskMetrics {
    pub dispatched: AtomicU64,
    /// Sum of the waits from due to dispatched, ms.
    pub dispatch_wait_ms: AtomicU64,
    pub lease_expiries: AtomicU64,
    pub completed: AtomicU64,
    pub failed: AtomicU64,
    pub errored: AtomicU64,
    pub cancelled: AtomicU64,
    /// Leases given back by their workers (ReleaseTask).
    pub released: AtomicU64,
}

impl TaskMetrics {
    pub fn observe_dispatch(&self, waited_ms: u64) {
        self.dispatch_wait_ms
            .fetch_add(waited_ms, Ordering::Relaxed);
    }

    pub fn ended(&self, how: TaskEvent) {
        let counter = match how {
            TaskEvent::Complete => &self.completed,
            TaskEvent::Fail => &self.failed,
            TaskEvent::Throw => &self.errored,
            _ => &self.cancelled,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_accept_nothing() {
        for state in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for event in [
                TaskEvent::Dispatch,
                TaskEvent::Heartbeat,
                TaskEvent::Complete,
                TaskEvent::Retry,
                TaskEvent::Release,
                TaskEvent::Fail,
                TaskEvent::Throw,
                TaskEvent::Cancel,
                TaskEvent::Resolve,
            ] {
                assert!(transition(state, event).is_err(), "{state:?} on {event:?}");
            }
        }
    }

    #[test]
    fn a_queued_task_is_only_dispatched_cancelled_or_resolved() {
        assert_eq!(
            transition(TaskState::Queued, TaskEvent::Dispatch),
            Ok(TaskState::Leased)
        );
        assert!(transition(TaskState::Queued, TaskEvent::Complete).is_err());
        assert!(transition(TaskState::Queued, TaskEvent::Heartbeat).is_err());
        assert!(transition(TaskState::Queued, TaskEvent::Release).is_err());
    }
}
