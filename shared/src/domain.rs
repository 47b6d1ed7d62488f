//! Domain types both services speak: the vocabulary enums, approval requests and the event log
//! entry. Handlers convert to and from the generated proto types at the edge (`convert`), so
//! nothing past a handler sees prost types.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value as Json};

/// Lifecycle of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RunStatus {
    Queued,
    Running,
    Suspended,
    Succeeded,
    Failed,
    Cancelled,
    Superseded,
}

impl RunStatus {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Cancelled | Self::Superseded
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "QUEUED",
            Self::Running => "RUNNING",
            Self::Suspended => "SUSPENDED",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
            Self::Cancelled => "CANCELLED",
            Self::Superseded => "SUPERSEDED",
        }
    }
}

/// What a suspension waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SuspensionCategory {
    RequireApproval,
    RequireUserInput,
    RequireExternalExecution,
}

impl SuspensionCategory {
    pub fn reason(self) -> SuspensionReason {
        match self {
            Self::RequireApproval => SuspensionReason::ApprovalPending,
            Self::RequireUserInput => SuspensionReason::AwaitingUserInput,
            Self::RequireExternalExecution => SuspensionReason::ExternalResultPending,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SuspensionReason {
    ApprovalPending,
    AwaitingUserInput,
    ExternalResultPending,
}

/// Active → Inactive (withdrawn) or Cleared (decision consumed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SuspensionState {
    Active,
    Inactive,
    Cleared,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApprovalKind {
    /// An `approval` gate around a subtree.
    Node,
    /// A guarded tool call whose policy said `ask`.
    Tool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApprovalPhase {
    Before,
    After,
}

/// What a pending approval becomes when its deadline passes. Fail-closed default: reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum TimeoutAction {
    #[default]
    Reject,
    Approve,
}

/// A decision on an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DecisionKind {
    Approve,
    Reject,
    /// Approve with new tool arguments.
    Edit,
    /// A result that stands in for the tool's own.
    Respond,
}

impl DecisionKind {
    /// How the runner acts on this decision.
    pub fn action(self) -> ResolveAction {
        match self {
            Self::Reject => ResolveAction::Cancel,
            Self::Approve | Self::Edit | Self::Respond => ResolveAction::Resume,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject => "reject",
            Self::Edit => "edit",
            Self::Respond => "respond",
        }
    }
}

/// How a delivered decision acts on the suspended node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResolveAction {
    Resume,
    Cancel,
}

/// What a delivered decision does, as the runner stores and applies it: user input and external
/// results are resumed or cancelled, an approval is decided by its kind. Stored records keep the
/// variant's index, so variants are only ever appended (`Resume` and `Cancel` came first, and
/// records written before the kinds existed still read as them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Verdict {
    Resume,
    Cancel,
    Approve,
    Reject,
    Edit,
    Respond,
}

impl Verdict {
    pub fn of(kind: DecisionKind) -> Self {
        match kind {
            DecisionKind::Approve => Self::Approve,
            DecisionKind::Reject => Self::Reject,
            DecisionKind::Edit => Self::Edit,
            DecisionKind::Respond => Self::Respond,
        }
    }

    /// The approval decision's kind; `None` for a plain resume or cancel.
    pub fn kind(self) -> Option<DecisionKind> {
        match self {
            Self::Resume | Self::Cancel => None,
            Self::Approve => Some(DecisionKind::Approve),
            Self::Reject => Some(DecisionKind::Reject),
            Self::Edit => Some(DecisionKind::Edit),
            Self::Respond => Some(DecisionKind::Respond),
        }
    }

    pub fn action(self) -> ResolveAction {
        match self {
            Self::Cancel | Self::Reject => ResolveAction::Cancel,
            Self::Resume | Self::Approve | Self::Edit | Self::Respond => ResolveAction::Resume,
        }
    }

    pub fn is_cancel(self) -> bool {
        self.action() == ResolveAction::Cancel
    }

    pub fn as_str(self) -> &'static str {
        match self.kind() {
            Some(kind) => kind.as_str(),
            None if self.is_cancel() => "cancel",
            None => "resume",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum DecisionSource {
    #[default]
    Person,
    Policy,
    Timeout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobStatus {
    Queued,
    Claimed,
    Accepted,
    DeadLetter,
    Cancelled,
    Superseded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum JobOrigin {
    #[default]
    User,
    A2a,
    Internal,
}

/// Why a job wakes its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobKind {
    Start,
    Resume,
    Timer,
    Cancel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum RunMode {
    /// Persist and park at the first suspension.
    #[default]
    Yield,
    /// Keep ticking other branches while a suspension is pending.
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum RestorePolicy {
    Never,
    #[default]
    IfExists,
    Required,
}

/// Everything a person needs to decide an approval without another call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    pub request_id: String,
    pub run_id: String,
    pub thread_id: String,
    pub tree_id: String,
    pub tree_version: u32,
    pub node_locator: String,
    pub node_name: String,
    pub kind: ApprovalKind,
    /// Tool approvals: the tool, its resolved args and the call id; empty for gates.
    pub tool_name: String,
    #[serde(with = "crate::json::as_text")]
    pub tool_args: Json,
    pub tool_call_id: String,
    pub title: String,
    #[serde(with = "crate::json::as_text")]
    pub context: Map<String, Json>,
    pub phase: ApprovalPhase,
    /// Absolute deadline (epoch ms); 0 when the gate has none.
    pub deadline_ms: u64,
    pub on_timeout: TimeoutAction,
    pub allowed_decisions: Vec<DecisionKind>,
    pub submitted_by: String,
    pub requested_at_ms: u64,
}

impl ApprovalRequest {
    /// What a vote on this request is bound to (see [`crate::digest`]): the digest of a tool
    /// call's arguments, or of a gate's context.
    pub fn args_digest(&self) -> String {
        match self.kind {
            ApprovalKind::Tool => crate::digest::of(&self.tool_args),
            ApprovalKind::Node => crate::digest::of(&Json::Object(self.context.clone())),
        }
    }
}

/// The event kinds of DESIGN §6, plus `SuspensionWithdrawn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    RunQueued,
    RunStarted,
    ApprovalRequested,
    ExecutionSuspended,
    ApprovalResolved,
    ExecutionResumed,
    ApprovalConsumed,
    CheckpointSaved,
    CheckpointRestored,
    RunSucceeded,
    RunFailed,
    RunCancelled,
    RunSuperseded,
    JobDeadLettered,
    SuspensionWithdrawn,
    TaskDispatched,
    TaskCompleted,
    TaskFailed,
    TaskReleased,
}

/// One durable event-log entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub run_id: String,
    pub thread_id: String,
    pub time_ms: u64,
    pub detail: EventDetail,
    /// W3C trace context of the operation that produced the event ("" when none).
    pub traceparent: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum EventDetail {
    RunQueued {
        job_id: String,
        tree_id: String,
        tree_version: u32,
        priority: i32,
        job_kind: JobKind,
    },
    RunStarted {
        tree_id: String,
        tree_version: u32,
        attempt: u32,
    },
    ApprovalRequested(Box<ApprovalRequest>),
    ExecutionSuspended {
        request_id: String,
        category: SuspensionCategory,
        message: String,
        #[serde(with = "crate::json::as_text")]
        payload: Json,
        node_locator: String,
    },
    /// An `ApprovalResolved` as builds before args digests wrote it: still read, no longer
    /// written. (Postcard names variants by position, so this one keeps its place.)
    ApprovalResolvedUnbound {
        request_id: String,
        decision_id: String,
        action: Verdict,
        reason: String,
        decided_by: String,
        category: SuspensionCategory,
        source: DecisionSource,
    },
    ExecutionResumed {
        request_ids: Vec<String>,
        job_kind: JobKind,
    },
    ApprovalConsumed {
        request_id: String,
        decision_id: String,
    },
    CheckpointSaved {
        step: u64,
        size_bytes: u64,
    },
    CheckpointRestored {
        step: u64,
        cause: String,
    },
    /// Terminal: the kind follows the status.
    RunFinished {
        status: RunStatus,
        error: String,
        #[serde(with = "crate::json::as_text")]
        blackboard: Map<String, Json>,
    },
    JobDeadLettered {
        job_id: String,
        attempt_count: u32,
        last_error: String,
    },
    SuspensionWithdrawn {
        request_id: String,
        reason: String,
    },
    /// A task was leased to a worker.
    TaskDispatched {
        task: TaskRef,
        lease_until_ms: u64,
    },
    TaskCompleted {
        task: TaskRef,
    },
    /// An attempt of a task ended without a result.
    TaskFailed {
        task: TaskRef,
        error: String,
        cause: TaskFailure,
        /// The business error's code (`TaskFailure::Error`).
        code: String,
        will_retry: bool,
        /// When the next attempt may be dispatched (0 when none).
        retry_at_ms: u64,
    },
    /// A worker gave a leased task back: queued again at once, no attempt spent. (Last, so
    /// stored events of older builds keep their variant numbers.)
    TaskReleased {
        task: TaskRef,
        reason: String,
    },
    /// A decision entered the run's inbox. (Last, after `TaskReleased`, for the same reason.)
    ApprovalResolved {
        request_id: String,
        decision_id: String,
        action: Verdict,
        reason: String,
        decided_by: String,
        category: SuspensionCategory,
        source: DecisionSource,
        /// The digest of what the run goes on with (see [`crate::digest`]): an approval's
        /// arguments, edited arguments or stand-in result; empty for a reject, user input and
        /// external results.
        args_digest: String,
    },
}

/// Which task and attempt an event is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRef {
    pub task_id: String,
    pub task_type: String,
    pub attempt: u32,
    pub worker_id: String,
    /// The suspension the task resolves.
    pub request_id: String,
}

/// How an attempt of a task ended without a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskFailure {
    /// The worker called FailTask.
    Failed,
    /// The worker threw a business error.
    Error,
    /// The lease ran out.
    LeaseExpired,
    /// The run no longer wanted the result (cancelled, interrupted, timed out, ended).
    Cancelled,
}

impl TaskFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Error => "error",
            Self::LeaseExpired => "lease_expired",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "failed" => Self::Failed,
            "error" => Self::Error,
            "lease_expired" => Self::LeaseExpired,
            "cancelled" => Self::Cancelled,
            _ => return None,
        })
    }
}

impl EventDetail {
    pub fn kind(&self) -> EventKind {
        match self {
            Self::RunQueued { .. } => EventKind::RunQueued,
            Self::RunStarted { .. } => EventKind::RunStarted,
            Self::ApprovalRequested(_) => EventKind::ApprovalRequested,
            Self::ExecutionSuspended { .. } => EventKind::ExecutionSuspended,
            Self::ApprovalResolved { .. } | Self::ApprovalResolvedUnbound { .. } => {
                EventKind::ApprovalResolved
            }
            Self::ExecutionResumed { .. } => EventKind::ExecutionResumed,
            Self::ApprovalConsumed { .. } => EventKind::ApprovalConsumed,
            Self::CheckpointSaved { .. } => EventKind::CheckpointSaved,
            Self::CheckpointRestored { .. } => EventKind::CheckpointRestored,
            Self::RunFinished { status, .. } => match status {
                RunStatus::Failed => EventKind::RunFailed,
                RunStatus::Cancelled => EventKind::RunCancelled,
                RunStatus::Superseded => EventKind::RunSuperseded,
                _ => EventKind::RunSucceeded,
            },
            Self::JobDeadLettered { .. } => EventKind::JobDeadLettered,
            Self::SuspensionWithdrawn { .. } => EventKind::SuspensionWithdrawn,
            Self::TaskDispatched { .. } => EventKind::TaskDispatched,
            Self::TaskCompleted { .. } => EventKind::TaskCompleted,
            Self::TaskFailed { .. } => EventKind::TaskFailed,
            Self::TaskReleased { .. } => EventKind::TaskReleased,
        }
    }
}

impl Event {
    pub fn kind(&self) -> EventKind {
        self.detail.kind()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(detail: EventDetail) -> Event {
        Event {
            seq: 7,
            run_id: "run".into(),
            thread_id: "thread".into(),
            time_ms: 1_700_000_000_000,
            detail,
            traceparent: String::new(),
        }
    }

    /// An APPROVAL_RESOLVED written before args digests, laid out by hand as that build stored
    /// it (variant 4 with seven fields), still reads, as the same kind, with no digest.
    #[test]
    fn an_approval_resolved_event_written_before_digests_still_reads() {
        let mut old =
            postcard::to_allocvec(&(7u64, "run", "thread", 1_700_000_000_000u64)).unwrap();
        old.push(4);
        let fields = ("r-1", "d-1", Verdict::Edit, "fine", "bob");
        old.extend(postcard::to_allocvec(&fields).unwrap());
        let rest = (
            SuspensionCategory::RequireApproval,
            DecisionSource::Person,
            "",
        );
        old.extend(postcard::to_allocvec(&rest).unwrap());

        let read: Event = postcard::from_bytes(&old).unwrap();
        let unbound = EventDetail::ApprovalResolvedUnbound {
            request_id: "r-1".into(),
            decision_id: "d-1".into(),
            action: Verdict::Edit,
            reason: "fine".into(),
            decided_by: "bob".into(),
            category: SuspensionCategory::RequireApproval,
            source: DecisionSource::Person,
        };
        assert_eq!(read, event(unbound));
        assert_eq!(read.kind(), EventKind::ApprovalResolved);
    }

    /// What is written now round-trips with its digest, and no stored variant changed place.
    #[test]
    fn an_approval_resolved_event_keeps_its_digest() {
        let bound = event(EventDetail::ApprovalResolved {
            request_id: "r-1".into(),
            decision_id: "d-1".into(),
            action: Verdict::Approve,
            reason: String::new(),
            decided_by: "bob".into(),
            category: SuspensionCategory::RequireApproval,
            source: DecisionSource::Person,
            args_digest: crate::digest::of(&serde_json::json!({"amount": 5})),
        });
        let bytes = postcard::to_allocvec(&bound).unwrap();
        assert_eq!(postcard::from_bytes::<Event>(&bytes).unwrap(), bound);
        assert_eq!(bound.kind(), EventKind::ApprovalResolved);
        // Variant 16 (after TaskReleased, the last one before): the bytes after the header.
        let header = postcard::to_allocvec(&(7u64, "run", "thread", 1_700_000_000_000u64)).unwrap();
        assert_eq!(bytes[header.len()], 16);
    }
}
