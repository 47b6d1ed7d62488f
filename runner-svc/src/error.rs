//! The runner's one error type and its one mapping to gRPC status codes (DESIGN §7).

use arbor_shared::status::{FieldViolation, invalid_argument};
use tonic::Status;

use crate::{events::EventLogError, mailbox::MailboxError, store::codec::Corrupt};

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("{summary}")]
    InvalidArgument {
        summary: String,
        violations: Vec<FieldViolation>,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    /// The request conflicts with the current state (stale request id, other decision, …).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller's claim on a job is no longer current (fencing).
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Unavailable(String),
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
    #[error("storage error: {0}")]
    Storage(String),
}

impl RunnerError {
    pub fn invalid(field: &str, description: impl Into<String>) -> Self {
        Self::InvalidArgument {
            summary: "invalid request".into(),
            violations: vec![FieldViolation::new(field, description)],
        }
    }
}

impl From<crate::store::StoreError> for RunnerError {
    fn from(e: crate::store::StoreError) -> Self {
        Self::Storage(e.0)
    }
}

impl From<crate::runs::state::InvalidTransition> for RunnerError {
    fn from(e: crate::runs::state::InvalidTransition) -> Self {
        Self::FailedPrecondition(e.to_string())
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
            MailboxError::NotFound(id) => Self::NotFound(format!("job {id} not found")),
            MailboxError::StaleClaim { .. } => Self::Aborted(e.to_string()),
            MailboxError::InvalidTransition(t) => Self::FailedPrecondition(t.to_string()),
            MailboxError::Corrupt(c) => Self::Corrupt(c),
            MailboxError::Storage(s) => Self::Storage(s),
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
        match e {
            RunnerError::InvalidArgument {
                summary,
                violations,
            } => invalid_argument(&summary, &violations),
            RunnerError::NotFound(m) => Status::not_found(m),
            RunnerError::AlreadyExists(m) => Status::already_exists(m),
            RunnerError::FailedPrecondition(m) => Status::failed_precondition(m),
            RunnerError::Aborted(m) => Status::aborted(m),
            RunnerError::OutOfRange(m) => Status::out_of_range(m),
            RunnerError::ResourceExhausted(m) => Status::resource_exhausted(m),
            RunnerError::PermissionDenied(m) => Status::permission_denied(m),
            RunnerError::Unavailable(m) => Status::unavailable(m),
            // The details may name files or hold record bytes: they go to the log, the caller
            // learns what kind of thing failed.
            RunnerError::Corrupt(c) => {
                tracing::error!(error = %c, "corrupt record answered as DATA_LOSS");
                Status::data_loss(format!(
                    "a stored {} record is damaged; see the runner's log",
                    c.what
                ))
            }
            RunnerError::Storage(m) => {
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
