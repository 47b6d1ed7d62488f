//! Conversions between the domain types of `domain` and the generated proto types. Enums map both
//! ways; an UNSPECIFIED or unknown wire value is a typed `ConvertError`, never a silent default.

use prost_types::Timestamp;

use crate::{
    domain::*,
    json::{from_optional_value, from_proto_struct, to_proto_struct, to_proto_value},
    proto::runner::v1 as pb,
    time::{from_timestamp, opt_timestamp, timestamp},
};

/// A wire value that has no domain meaning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConvertError {
    #[error("{field}: value {value} is not a valid {type_name}; expected one of: {accepted}")]
    BadEnum {
        field: &'static str,
        type_name: &'static str,
        value: i32,
        /// The accepted values' names, comma-separated.
        accepted: String,
    },
    #[error("{0}: required field is missing")]
    Missing(&'static str),
    #[error("{field}: {description}")]
    Conflict {
        field: &'static str,
        description: &'static str,
    },
}

impl ConvertError {
    pub fn field(&self) -> &'static str {
        match self {
            Self::BadEnum { field, .. } | Self::Missing(field) | Self::Conflict { field, .. } => {
                field
            }
        }
    }
}

impl From<ConvertError> for tonic::Status {
    fn from(e: ConvertError) -> Self {
        crate::status::invalid_argument(
            "invalid request",
            &[crate::status::FieldViolation::new(e.field(), e.to_string())],
        )
    }
}

/// Maps a domain enum to its proto enum and back. `$field` names the wire field in errors.
macro_rules! enum_map {
    ($dom:ident <=> $pb:ident { $($dv:ident = $pv:ident),+ $(,)? }) => {
        impl From<$dom> for pb::$pb {
            fn from(v: $dom) -> Self {
                match v { $($dom::$dv => pb::$pb::$pv),+ }
            }
        }
        impl From<$dom> for i32 {
            fn from(v: $dom) -> Self {
                pb::$pb::from(v) as i32
            }
        }
        impl $dom {
            /// Parses a wire value; `field` names it in the error.
            pub fn from_wire(value: i32, field: &'static str) -> Result<Self, ConvertError> {
                match pb::$pb::try_from(value) {
                    $(Ok(pb::$pb::$pv) => Ok($dom::$dv),)+
                    _ => Err(ConvertError::BadEnum {
                        field,
                        type_name: stringify!($pb),
                        value,
                        accepted: [$(pb::$pb::$pv.as_str_name()),+].join(", "),
                    }),
                }
            }
            /// Parses an optional wire value: UNSPECIFIED (0) gives `None`.
            pub fn from_wire_opt(value: i32, field: &'static str) -> Result<Option<Self>, ConvertError> {
                if value == 0 { Ok(None) } else { Self::from_wire(value, field).map(Some) }
            }
        }
    };
}

enum_map!(RunStatus <=> RunStatus {
    Queued = Queued, Running = Running, Suspended = Suspended, Succeeded = Succeeded,
    Failed = Failed, Cancelled = Cancelled, Superseded = Superseded,
});
enum_map!(SuspensionCategory <=> SuspensionCategory {
    RequireApproval = RequireApproval, RequireUserInput = RequireUserInput,
    RequireExternalExecution = RequireExternalExecution,
});
enum_map!(SuspensionReason <=> SuspensionReason {
    ApprovalPending = ApprovalPending, AwaitingUserInput = AwaitingUserInput,
    ExternalResultPending = ExternalResultPending,
});
enum_map!(SuspensionState <=> SuspensionState {
    Active = Active, Inactive = Inactive, Cleared = Cleared,
});
enum_map!(ApprovalKind <=> ApprovalKind { Node = Node, Tool = Tool });
enum_map!(ApprovalPhase <=> ApprovalPhase { Before = Before, After = After });
enum_map!(TimeoutAction <=> TimeoutAction { Reject = Reject, Approve = Approve });
enum_map!(DecisionKind <=> DecisionKind {
    Approve = Approve, Reject = Reject, Edit = Edit, Respond = Respond,
});
enum_map!(ResolveAction <=> ResolveAction { Resume = Resume, Cancel = Cancel });

impl Verdict {
    /// Reads a wire `(action, decision_kind)` pair; `prefix` names the message in errors. With a
    /// kind the action may be left out; given both, they must agree.
    pub fn from_wire(
        action: i32,
        kind: i32,
        fields: (&'static str, &'static str),
    ) -> Result<Self, ConvertError> {
        let (action_field, kind_field) = fields;
        let kind = DecisionKind::from_wire_opt(kind, kind_field)?;
        let action = ResolveAction::from_wire_opt(action, action_field)?;
        match (kind, action) {
            (None, None) => Err(ConvertError::Missing(action_field)),
            (None, Some(ResolveAction::Resume)) => Ok(Self::Resume),
            (None, Some(ResolveAction::Cancel)) => Ok(Self::Cancel),
            (Some(kind), None) => Ok(Self::of(kind)),
            (Some(kind), Some(action)) if kind.action() == action => Ok(Self::of(kind)),
            (Some(_), Some(_)) => Err(ConvertError::Conflict {
                field: action_field,
                description: "contradicts decision_kind (REJECT cancels; APPROVE, EDIT and \
                              RESPOND resume)",
            }),
        }
    }

    /// The wire `decision_kind` (UNSPECIFIED for a plain resume or cancel).
    pub fn wire_kind(self) -> i32 {
        self.kind().map_or(0, i32::from)
    }
}
enum_map!(DecisionSource <=> DecisionSource { Person = Person, Policy = Policy, Timeout = Timeout });
enum_map!(JobStatus <=> JobStatus {
    Queued = Queued, Claimed = Claimed, Accepted = Accepted, DeadLetter = DeadLetter,
    Cancelled = Cancelled, Superseded = Superseded,
});
enum_map!(JobOrigin <=> JobOrigin { User = User, A2a = A2a, Internal = Internal });
enum_map!(JobKind <=> JobKind { Start = Start, Resume = Resume, Timer = Timer, Cancel = Cancel });
enum_map!(RunMode <=> RunMode { Yield = Yield, Wait = Wait });
enum_map!(RestorePolicy <=> RestorePolicy { Never = Never, IfExists = IfExists, Required = Required });
enum_map!(EventKind <=> EventKind {
    RunQueued = RunQueued, RunStarted = RunStarted, ApprovalRequested = ApprovalRequested,
    ExecutionSuspended = ExecutionSuspended, ApprovalResolved = ApprovalResolved,
    ExecutionResumed = ExecutionResumed, ApprovalConsumed = ApprovalConsumed,
    CheckpointSaved = CheckpointSaved, CheckpointRestored = CheckpointRestored,
    RunSucceeded = RunSucceeded, RunFailed = RunFailed, RunCancelled = RunCancelled,
    RunSuperseded = RunSuperseded, JobDeadLettered = JobDeadLettered,
    SuspensionWithdrawn = SuspensionWithdrawn, TaskDispatched = TaskDispatched,
    TaskCompleted = TaskCompleted, TaskFailed = TaskFailed, TaskReleased = TaskReleased,
});

impl From<&ApprovalRequest> for pb::ApprovalRequested {
    fn from(r: &ApprovalRequest) -> Self {
        Self {
            request_id: r.request_id.clone(),
            run_id: r.run_id.clone(),
            thread_id: r.thread_id.clone(),
            tree_id: r.tree_id.clone(),
            tree_version: r.tree_version,
            node_locator: r.node_locator.clone(),
            node_name: r.node_name.clone(),
            kind: r.kind.into(),
            tool_name: r.tool_name.clone(),
            tool_args: Some(to_proto_value(&r.tool_args)),
            tool_call_id: r.tool_call_id.clone(),
            title: r.title.clone(),
            context: Some(to_proto_struct(&r.context)),
            phase: r.phase.into(),
            deadline: opt_timestamp(r.deadline_ms),
            on_timeout: r.on_timeout.into(),
            allowed_decisions: r.allowed_decisions.iter().map(|d| i32::from(*d)).collect(),
            submitted_by: r.submitted_by.clone(),
            requested_at: Some(timestamp(r.requested_at_ms)),
            args_digest: r.args_digest(),
        }
    }
}

impl TryFrom<&pb::ApprovalRequested> for ApprovalRequest {
    type Error = ConvertError;

    fn try_from(r: &pb::ApprovalRequested) -> Result<Self, ConvertError> {
        if r.request_id.is_empty() {
            return Err(ConvertError::Missing("approval_requested.request_id"));
        }
        Ok(Self {
            request_id: r.request_id.clone(),
            run_id: r.run_id.clone(),
            thread_id: r.thread_id.clone(),
            tree_id: r.tree_id.clone(),
            tree_version: r.tree_version,
            node_locator: r.node_locator.clone(),
            node_name: r.node_name.clone(),
            kind: ApprovalKind::from_wire(r.kind, "approval_requested.kind")?,
            tool_name: r.tool_name.clone(),
            tool_args: from_optional_value(r.tool_args.as_ref()),
            tool_call_id: r.tool_call_id.clone(),
            title: r.title.clone(),
            context: r
                .context
                .as_ref()
                .map(from_proto_struct)
                .unwrap_or_default(),
            phase: ApprovalPhase::from_wire(r.phase, "approval_requested.phase")?,
            deadline_ms: r.deadline.as_ref().map(from_timestamp).unwrap_or(0),
            on_timeout: TimeoutAction::from_wire_opt(
                r.on_timeout,
                "approval_requested.on_timeout",
            )?
            .unwrap_or_default(),
            allowed_decisions: r
                .allowed_decisions
                .iter()
                .map(|d| DecisionKind::from_wire(*d, "approval_requested.allowed_decisions"))
                .collect::<Result<_, _>>()?,
            submitted_by: r.submitted_by.clone(),
            requested_at_ms: r.requested_at.as_ref().map(from_timestamp).unwrap_or(0),
        })
    }
}

fn ts(ms: u64) -> Option<Timestamp> {
    Some(timestamp(ms))
}

impl From<&Event> for pb::Event {
    fn from(e: &Event) -> Self {
        use pb::event::Detail as D;
        let detail = match &e.detail {
            EventDetail::RunQueued {
                job_id,
                tree_id,
                tree_version,
                priority,
                job_kind,
            } => D::RunQueued(pb::RunQueued {
                job_id: job_id.clone(),
                tree_id: tree_id.clone(),
                tree_version: *tree_version,
                priority: *priority,
                job_kind: (*job_kind).into(),
            }),
            EventDetail::RunStarted {
                tree_id,
                tree_version,
                attempt,
            } => D::RunStarted(pb::RunStarted {
                tree_id: tree_id.clone(),
                tree_version: *tree_version,
                attempt: *attempt,
            }),
            EventDetail::ApprovalRequested(r) => D::ApprovalRequested(r.as_ref().into()),
            EventDetail::ExecutionSuspended {
                request_id,
                category,
                message,
                payload,
                node_locator,
            } => D::ExecutionSuspended(pb::ExecutionSuspended {
                request_id: request_id.clone(),
                category: (*category).into(),
                reason: category.reason().into(),
                message: message.clone(),
                payload: Some(to_proto_value(payload)),
                node_locator: node_locator.clone(),
            }),
            EventDetail::ApprovalResolved {
                request_id,
                decision_id,
                action,
                reason,
                decided_by,
                category,
                source,
                args_digest,
            } => D::ApprovalResolved(pb::ApprovalResolved {
                request_id: request_id.clone(),
                decision_id: decision_id.clone(),
                action: action.action().into(),
                reason: reason.clone(),
                decided_by: decided_by.clone(),
                category: (*category).into(),
                source: (*source).into(),
                decision_kind: action.wire_kind(),
                args_digest: args_digest.clone(),
            }),
            EventDetail::ApprovalResolvedUnbound {
                request_id,
                decision_id,
                action,
                reason,
                decided_by,
                category,
                source,
            } => D::ApprovalResolved(pb::ApprovalResolved {
                request_id: request_id.clone(),
                decision_id: decision_id.clone(),
                action: action.action().into(),
                reason: reason.clone(),
                decided_by: decided_by.clone(),
                category: (*category).into(),
                source: (*source).into(),
                decision_kind: action.wire_kind(),
                args_digest: String::new(),
            }),
            EventDetail::ExecutionResumed {
                request_ids,
                job_kind,
            } => D::ExecutionResumed(pb::ExecutionResumed {
                request_ids: request_ids.clone(),
                job_kind: (*job_kind).into(),
            }),
            EventDetail::ApprovalConsumed {
                request_id,
                decision_id,
            } => D::ApprovalConsumed(pb::ApprovalConsumed {
                request_id: request_id.clone(),
                decision_id: decision_id.clone(),
            }),
            EventDetail::CheckpointSaved { step, size_bytes } => {
                D::CheckpointSaved(pb::CheckpointSaved {
                    step: *step,
                    size_bytes: *size_bytes,
                })
            }
            EventDetail::CheckpointRestored { step, cause } => {
                D::CheckpointRestored(pb::CheckpointRestored {
                    step: *step,
                    cause: cause.clone(),
                })
            }
            EventDetail::RunFinished {
                status,
                error,
                blackboard,
            } => D::RunFinished(pb::RunFinished {
                status: (*status).into(),
                error: error.clone(),
                blackboard: Some(to_proto_struct(blackboard)),
            }),
            EventDetail::JobDeadLettered {
                job_id,
                attempt_count,
                last_error,
            } => D::JobDeadLettered(pb::JobDeadLettered {
                job_id: job_id.clone(),
                attempt_count: *attempt_count,
                last_error: last_error.clone(),
            }),
            EventDetail::SuspensionWithdrawn { request_id, reason } => {
                D::SuspensionWithdrawn(pb::SuspensionWithdrawn {
                    request_id: request_id.clone(),
                    reason: reason.clone(),
                })
            }
            EventDetail::TaskDispatched {
                task,
                lease_until_ms,
            } => D::TaskDispatched(pb::TaskDispatched {
                task_id: task.task_id.clone(),
                task_type: task.task_type.clone(),
                attempt: task.attempt,
                worker_id: task.worker_id.clone(),
                lease_until: ts(*lease_until_ms),
                request_id: task.request_id.clone(),
            }),
            EventDetail::TaskCompleted { task } => D::TaskCompleted(pb::TaskCompleted {
                task_id: task.task_id.clone(),
                task_type: task.task_type.clone(),
                attempt: task.attempt,
                worker_id: task.worker_id.clone(),
                request_id: task.request_id.clone(),
            }),
            EventDetail::TaskFailed {
                task,
                error,
                cause,
                code,
                will_retry,
                retry_at_ms,
            } => D::TaskFailed(pb::TaskFailed {
                task_id: task.task_id.clone(),
                task_type: task.task_type.clone(),
                attempt: task.attempt,
                worker_id: task.worker_id.clone(),
                error: error.clone(),
                cause: cause.as_str().to_string(),
                code: code.clone(),
                will_retry: *will_retry,
                retry_at: (*retry_at_ms > 0).then(|| ts(*retry_at_ms)).flatten(),
                request_id: task.request_id.clone(),
            }),
            EventDetail::TaskReleased { task, reason } => D::TaskReleased(pb::TaskReleased {
                task_id: task.task_id.clone(),
                task_type: task.task_type.clone(),
                attempt: task.attempt,
                worker_id: task.worker_id.clone(),
                request_id: task.request_id.clone(),
                reason: reason.clone(),
            }),
        };
        Self {
            seq: e.seq,
            run_id: e.run_id.clone(),
            thread_id: e.thread_id.clone(),
            time: ts(e.time_ms),
            kind: e.kind().into(),
            detail: Some(detail),
            traceparent: e.traceparent.clone(),
        }
    }
}

fn task_ref(
    task_id: &str,
    task_type: &str,
    attempt: u32,
    worker_id: &str,
    request_id: &str,
) -> TaskRef {
    TaskRef {
        task_id: task_id.to_string(),
        task_type: task_type.to_string(),
        attempt,
        worker_id: worker_id.to_string(),
        request_id: request_id.to_string(),
    }
}

impl TryFrom<&pb::Event> for Event {
    type Error = ConvertError;

    fn try_from(e: &pb::Event) -> Result<Self, ConvertError> {
        use pb::event::Detail as D;
        let detail = match e
            .detail
            .as_ref()
            .ok_or(ConvertError::Missing("event.detail"))?
        {
            D::RunQueued(d) => EventDetail::RunQueued {
                job_id: d.job_id.clone(),
                tree_id: d.tree_id.clone(),
                tree_version: d.tree_version,
                priority: d.priority,
                job_kind: JobKind::from_wire(d.job_kind, "run_queued.job_kind")?,
            },
            D::RunStarted(d) => EventDetail::RunStarted {
                tree_id: d.tree_id.clone(),
                tree_version: d.tree_version,
                attempt: d.attempt,
            },
            D::ApprovalRequested(d) => EventDetail::ApprovalRequested(Box::new(d.try_into()?)),
            D::ExecutionSuspended(d) => EventDetail::ExecutionSuspended {
                request_id: d.request_id.clone(),
                category: SuspensionCategory::from_wire(
                    d.category,
                    "execution_suspended.category",
                )?,
                message: d.message.clone(),
                payload: from_optional_value(d.payload.as_ref()),
                node_locator: d.node_locator.clone(),
            },
            D::ApprovalResolved(d) => EventDetail::ApprovalResolved {
                request_id: d.request_id.clone(),
                decision_id: d.decision_id.clone(),
                action: Verdict::from_wire(
                    d.action,
                    d.decision_kind,
                    (
                        "approval_resolved.action",
                        "approval_resolved.decision_kind",
                    ),
                )?,
                reason: d.reason.clone(),
                decided_by: d.decided_by.clone(),
                category: SuspensionCategory::from_wire(d.category, "approval_resolved.category")?,
                source: DecisionSource::from_wire_opt(d.source, "approval_resolved.source")?
                    .unwrap_or_default(),
                args_digest: d.args_digest.clone(),
            },
            D::ExecutionResumed(d) => EventDetail::ExecutionResumed {
                request_ids: d.request_ids.clone(),
                job_kind: JobKind::from_wire(d.job_kind, "execution_resumed.job_kind")?,
            },
            D::ApprovalConsumed(d) => EventDetail::ApprovalConsumed {
                request_id: d.request_id.clone(),
                decision_id: d.decision_id.clone(),
            },
            D::CheckpointSaved(d) => EventDetail::CheckpointSaved {
                step: d.step,
                size_bytes: d.size_bytes,
            },
            D::CheckpointRestored(d) => EventDetail::CheckpointRestored {
                step: d.step,
                cause: d.cause.clone(),
            },
            D::RunFinished(d) => EventDetail::RunFinished {
                status: RunStatus::from_wire(d.status, "run_finished.status")?,
                error: d.error.clone(),
                blackboard: d
                    .blackboard
                    .as_ref()
                    .map(from_proto_struct)
                    .unwrap_or_default(),
            },
            D::JobDeadLettered(d) => EventDetail::JobDeadLettered {
                job_id: d.job_id.clone(),
                attempt_count: d.attempt_count,
                last_error: d.last_error.clone(),
            },
            D::SuspensionWithdrawn(d) => EventDetail::SuspensionWithdrawn {
                request_id: d.request_id.clone(),
                reason: d.reason.clone(),
            },
            D::TaskDispatched(d) => EventDetail::TaskDispatched {
                task: task_ref(
                    &d.task_id,
                    &d.task_type,
                    d.attempt,
                    &d.worker_id,
                    &d.request_id,
                ),
                lease_until_ms: d.lease_until.as_ref().map(from_timestamp).unwrap_or(0),
            },
            D::TaskCompleted(d) => EventDetail::TaskCompleted {
                task: task_ref(
                    &d.task_id,
                    &d.task_type,
                    d.attempt,
                    &d.worker_id,
                    &d.request_id,
                ),
            },
            D::TaskFailed(d) => EventDetail::TaskFailed {
                task: task_ref(
                    &d.task_id,
                    &d.task_type,
                    d.attempt,
                    &d.worker_id,
                    &d.request_id,
                ),
                error: d.error.clone(),
                cause: TaskFailure::parse(&d.cause)
                    .ok_or(ConvertError::Missing("task_failed.cause"))?,
                code: d.code.clone(),
                will_retry: d.will_retry,
                retry_at_ms: d.retry_at.as_ref().map(from_timestamp).unwrap_or(0),
            },
            D::TaskReleased(d) => EventDetail::TaskReleased {
                task: task_ref(
                    &d.task_id,
                    &d.task_type,
                    d.attempt,
                    &d.worker_id,
                    &d.request_id,
                ),
                reason: d.reason.clone(),
            },
        };
        Ok(Self {
            seq: e.seq,
            run_id: e.run_id.clone(),
            thread_id: e.thread_id.clone(),
            time_ms: e.time.as_ref().map(from_timestamp).unwrap_or(0),
            detail,
            traceparent: e.traceparent.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request() -> ApprovalRequest {
        ApprovalRequest {
            request_id: "r1".into(),
            run_id: "run".into(),
            thread_id: "t".into(),
            tree_id: "deploy".into(),
            tree_version: 2,
            node_locator: "approve-deploy".into(),
            node_name: "approve-deploy".into(),
            kind: ApprovalKind::Tool,
            tool_name: "ledger.append".into(),
            tool_args: json!({"entry": {"replicas": 3}}),
            tool_call_id: "call-1".into(),
            title: "Deploy?".into(),
            context: json!({"plan": {"service": "billing"}})
                .as_object()
                .cloned()
                .unwrap(),
            phase: ApprovalPhase::Before,
            deadline_ms: 1_700_000_000_000,
            on_timeout: TimeoutAction::Reject,
            allowed_decisions: vec![DecisionKind::Approve, DecisionKind::Edit],
            submitted_by: "alice".into(),
            requested_at_ms: 1_699_999_000_000,
        }
    }

    #[test]
    fn events_round_trip_through_proto_and_postcard() {
        let event = Event {
            seq: 7,
            run_id: "run".into(),
            thread_id: "t".into(),
            time_ms: 1_700_000_000_123,
            detail: EventDetail::ApprovalRequested(Box::new(request())),
            traceparent: String::new(),
        };
        let wire = pb::Event::from(&event);
        assert_eq!(wire.kind, pb::EventKind::ApprovalRequested as i32);
        assert_eq!(Event::try_from(&wire).unwrap(), event);
        let bytes = postcard::to_allocvec(&event).unwrap();
        assert_eq!(postcard::from_bytes::<Event>(&bytes).unwrap(), event);
    }

    #[test]
    fn verdicts_read_from_action_and_kind() {
        let f = ("action", "decision_kind");
        let (resume, cancel) = (
            pb::ResolveAction::Resume as i32,
            pb::ResolveAction::Cancel as i32,
        );
        let kind = |k: DecisionKind| i32::from(k);
        assert_eq!(Verdict::from_wire(resume, 0, f), Ok(Verdict::Resume));
        assert_eq!(Verdict::from_wire(cancel, 0, f), Ok(Verdict::Cancel));
        assert_eq!(
            Verdict::from_wire(0, kind(DecisionKind::Edit), f),
            Ok(Verdict::Edit)
        );
        assert_eq!(
            Verdict::from_wire(cancel, kind(DecisionKind::Reject), f),
            Ok(Verdict::Reject)
        );
        assert!(matches!(
            Verdict::from_wire(cancel, kind(DecisionKind::Respond), f),
            Err(ConvertError::Conflict { .. })
        ));
        assert_eq!(
            Verdict::from_wire(0, 0, f),
            Err(ConvertError::Missing("action"))
        );
        let err = Verdict::from_wire(resume, 99, f).unwrap_err();
        assert_eq!(
            err.to_string(),
            "decision_kind: value 99 is not a valid DecisionKind; expected one of: \
             DECISION_KIND_APPROVE, DECISION_KIND_REJECT, DECISION_KIND_EDIT, DECISION_KIND_RESPOND"
        );
        for v in [
            Verdict::Approve,
            Verdict::Reject,
            Verdict::Edit,
            Verdict::Respond,
        ] {
            assert_eq!(
                Verdict::from_wire(v.action().into(), v.wire_kind(), f),
                Ok(v)
            );
        }
    }

    #[test]
    fn verdicts_read_records_written_with_resolve_actions() {
        // Records stored before decisions carried their kind hold a `ResolveAction` index.
        for (old, new) in [
            (ResolveAction::Resume, Verdict::Resume),
            (ResolveAction::Cancel, Verdict::Cancel),
        ] {
            let bytes = postcard::to_allocvec(&old).unwrap();
            assert_eq!(postcard::from_bytes::<Verdict>(&bytes).unwrap(), new);
        }
    }

    #[test]
    fn terminal_kind_follows_status() {
        let detail = EventDetail::RunFinished {
            status: RunStatus::Cancelled,
            error: String::new(),
            blackboard: Default::default(),
        };
        assert_eq!(detail.kind(), EventKind::RunCancelled);
    }

    #[test]
    fn unspecified_and_unknown_enums_are_errors() {
        assert!(DecisionKind::from_wire(0, "decision").is_err());
        let err = DecisionKind::from_wire(99, "decision").unwrap_err();
        assert_eq!(err.field(), "decision");
        assert_eq!(RunMode::from_wire_opt(0, "mode").unwrap(), None);
    }
}
