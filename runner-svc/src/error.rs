//! The runner's one error type and its one mapping to gRPC status codes (DESIGN §7).

use arbor_shared::{
    domain::RunStatus,
    status::{FieldViolation, clip, invalid_argument},
};
use tonic::Status;

use crate::{events::EventLogError, mailbox::MailboxError, store::codec::Corrupt};

/// Everything that can go wrong in the runner, said in the runner's terms. Each variant's gRPC
/// code is chosen once, in `From<RunnerError> for Status`.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// The request is malformed; each violation names its field.
    #[error("{summary}")]
    Invalid {
        summary: String,
        violations: Vec<FieldViolation>,
    },
    #[error("run '{}' not found", clip(.0))]
    RunNotFound(String),
    /// Version 0: the latest.
    #[error("{}", tree_not_found(.id, *.version))]
    TreeNotFound { id: String, version: u32 },
    #[error("request '{}' not found in run '{run_id}'", clip(.request_id))]
    RequestNotFound { run_id: String, request_id: String },
    #[error("job {0} not found")]
    JobNotFound(String),
    #[error(
        "tree '{id}' version {version} is already registered with a different document; \
         register a new version"
    )]
    TreeVersionTaken { id: String, version: u32 },
    #[error("run '{0}' already exists (restore_policy NEVER)")]
    RunExists(String),
    #[error("run '{0}' has no checkpoint to restore (restore_policy REQUIRED)")]
    NothingToRestore(String),
    #[error("run '{run_id}' already finished with {}", .status.as_str())]
    RunFinished { run_id: String, status: RunStatus },
    #[error("request '{request_id}' was already decided by decision '{decision_id}'")]
    AlreadyDecided {
        request_id: String,
        decision_id: String,
    },
    #[error("request '{0}' was withdrawn and can no longer be decided")]
    Withdrawn(String),
    /// A decision of a kind the request does not offer.
    #[error("decision refused for request '{request_id}': {reason}")]
    DecisionNotOffered { request_id: String, reason: String },
    /// Only approval-svc may resolve approval requests.
    #[error(
        "only the approval service (role 'service') may resolve approval requests; decide \
         through ApprovalService.Resolve"
    )]
    ApprovalNeedsService,
    /// The caller is not among those who may answer a user-input or external request.
    #[error("{0}")]
    NotAnswerer(String),
    /// A state change the run's or the job's state machine does not allow.
    #[error("{0}")]
    InvalidTransition(String),
    /// The caller's claim on a job is no longer current (fencing): the lease was lost.
    #[error("{0}")]
    ClaimLost(String),
    /// A stream cursor before the oldest retained event.
    #[error(
        "cursor {cursor} is older than the oldest retained event {first}: events were compacted \
         away; reconcile state, then resume after seq {}",
        .first - 1
    )]
    CursorCompacted { cursor: u64, first: u64 },
    /// A stream cursor past the last event ever written.
    #[error(
        "cursor {cursor} is beyond the last event {last}: this log never had those events; \
         reconcile state, then resume from a cursor of at most {last}"
    )]
    CursorAhead { cursor: u64, last: u64 },
    #[error("task '{}' not found", clip(.0))]
    TaskNotFound(String),
    /// The caller's lease token is not the task's current one (a later attempt took over, or
    /// the token is foreign): nothing changed.
    #[error("task '{}': stale or foreign lease token; the lease was lost or belongs to another worker", clip(.0))]
    StaleLease(String),
    /// The task is no longer leased (it finished, or its lease expired and it was requeued).
    #[error("task '{}' is {state}: it can no longer be acted on with this lease", clip(.task_id))]
    TaskClosed {
        task_id: String,
        state: &'static str,
    },
    /// `Resolve` on a suspension that task workers answer.
    #[error(
        "request '{}' is served by task workers: complete it with WorkerService.CompleteTask",
        clip(.0)
    )]
    ServedByWorkers(String),
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
    /// Storage failed; the text is for the log only.
    #[error("storage error: {0}")]
    Storage(String),
    /// The database cannot be reached for now; the text is for the log only.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
}

fn tree_not_found(id: &str, version: u32) -> String {
    match version {
        0 => format!("tree '{}' not found", clip(id)),
        v => format!("tree '{}' version {v} not found", clip(id)),
    }
}

impl RunnerError {
    pub fn invalid(field: &str, description: impl Into<String>) -> Self {
        Self::Invalid {
            summary: "invalid request".into(),
            violations: vec![FieldViolation::new(field, description)],
        }
    }
}

impl From<crate::store::StoreError> for RunnerError {
    fn from(e: crate::store::StoreError) -> Self {
        match e {
            crate::store::StoreError::Failed(m) => Self::Storage(m),
            crate::store::StoreError::Unavailable(m) => Self::Unavailable(m),
        }
    }
}

impl From<EventLogError> for RunnerError {
    fn from(e: EventLogError) -> Self {
        match e {
            EventLogError::Corrupt(c) => Self::Corrupt(c),
            EventLogError::Storage(s) => s.into(),
        }
    }
}

impl From<MailboxError> for RunnerError {
    fn from(e: MailboxError) -> Self {
        match e {
            MailboxError::NotFound(id) => Self::JobNotFound(id),
            MailboxError::StaleClaim { .. } => Self::ClaimLost(e.to_string()),
            MailboxError::InvalidTransition(t) => Self::InvalidTransition(t.to_string()),
            MailboxError::Corrupt(c) => Self::Corrupt(c),
            MailboxError::Storage(s) => s.into(),
        }
    }
}

impl From<crate::store::TxError<RunnerError>> for RunnerError {
    fn from(e: crate::store::TxError<RunnerError>) -> Self {
        match e {
            crate::store::TxError::Abort(e) => e,
            crate::store::TxError::Storage(e) => e.into(),
        }
    }
}

impl From<arbor_shared::convert::ConvertError> for RunnerError {
    fn from(e: arbor_shared::convert::ConvertError) -> Self {
        Self::invalid(e.field(), e.to_string())
    }
}

impl From<RunnerError> for Status {
    fn from(e: RunnerError) -> Self {
        use RunnerError as E;
        let message = e.to_string();
        match e {
            E::Invalid {
                summary,
                violations,
            } => invalid_argument(&summary, &violations),
            E::RunNotFound(_)
            | E::TreeNotFound { .. }
            | E::RequestNotFound { .. }
            | E::JobNotFound(_)
            | E::TaskNotFound(_) => Status::not_found(message),
            E::TreeVersionTaken { .. } | E::RunExists(_) => Status::already_exists(message),
            E::NothingToRestore(_)
            | E::RunFinished { .. }
            | E::AlreadyDecided { .. }
            | E::Withdrawn(_)
            | E::DecisionNotOffered { .. }
            | E::InvalidTransition(_)
            | E::ServedByWorkers(_) => Status::failed_precondition(message),
            E::ApprovalNeedsService | E::NotAnswerer(_) => Status::permission_denied(message),
            E::ClaimLost(_) | E::StaleLease(_) | E::TaskClosed { .. } => Status::aborted(message),
            E::CursorCompacted { .. } | E::CursorAhead { .. } => Status::out_of_range(message),
            // The details may name files or hold record bytes: they go to the log, the caller
            // learns what kind of thing failed.
            E::Corrupt(c) => {
                tracing::error!(error = %c, "corrupt record answered as DATA_LOSS");
                Status::data_loss(format!(
                    "a stored {} record is damaged; see the runner's log",
                    c.what
                ))
            }
            E::Unavailable(m) => {
                tracing::warn!(error = %m, "storage unreachable, answered as UNAVAILABLE");
                Status::unavailable("runner storage is unreachable; retry later")
            }
            E::Storage(m) => {
                tracing::error!(error = %m, "storage failure answered as INTERNAL");
                Status::internal("runner storage failed; see the runner's log")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_details_stay_in_the_log() {
        let status = Status::from(RunnerError::Storage(
            "IO error: /data/runner/db: EIO".into(),
        ));
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(!status.message().contains("/data"), "{}", status.message());
        let status = Status::from(RunnerError::Corrupt(Corrupt {
            what: "checkpoint",
            message: "bytes 00ff at offset 7".into(),
        }));
        assert_eq!(status.code(), tonic::Code::DataLoss);
        assert!(status.message().contains("checkpoint"));
        assert!(!status.message().contains("00ff"), "{}", status.message());
    }
}
