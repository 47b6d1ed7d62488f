//! The service's one error type and its one mapping to gRPC statuses (DESIGN §7).

use arbor_shared::{
    convert::ConvertError,
    domain::DecisionKind,
    sled_backend::commit::FlushError,
    status::{FieldViolation, invalid_argument},
};
use tonic::Status;

use crate::lifecycle::InvalidTransition;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{summary}")]
    InvalidArgument {
        summary: String,
        violations: Vec<FieldViolation>,
    },
    #[error("approval {0} not found")]
    NotFound(String),
    #[error("approval {request_id}: {source}")]
    InvalidTransition {
        request_id: String,
        #[source]
        source: InvalidTransition,
    },
    /// Single winner: a different decision arrived after the first one.
    #[error(
        "approval {request_id} was already decided ({existing}, decision {decision_id}); the first decision stands"
    )]
    AlreadyDecided {
        request_id: String,
        existing: &'static str,
        decision_id: String,
    },
    #[error("approval {request_id} does not allow the decision {kind} (allowed: {allowed})")]
    NotAllowed {
        request_id: String,
        kind: &'static str,
        allowed: String,
    },
    /// An ack for a decision the approval does not hold (a stale or foreign consumption).
    #[error("approval {request_id} holds decision {held}, not {given}")]
    DecisionMismatch {
        request_id: String,
        held: String,
        given: String,
    },
    #[error("{0}")]
    PermissionDenied(String),
    #[error("approval-svc is shutting down")]
    ShuttingDown,
    #[error("watcher lagged; re-watch")]
    Lagged,
    #[error("storage failed: {0}")]
    Storage(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn invalid(field: &str, description: impl Into<String>) -> Self {
        Self::InvalidArgument {
            summary: "invalid request".into(),
            violations: vec![FieldViolation::new(field, description)],
        }
    }

    pub fn not_allowed(request_id: &str, kind: DecisionKind, allowed: &[DecisionKind]) -> Self {
        let mut names: Vec<&str> = vec!["approve", "reject"];
        names.extend(
            allowed
                .iter()
                .filter(|k| matches!(k, DecisionKind::Edit | DecisionKind::Respond))
                .map(|k| k.as_str()),
        );
        Self::NotAllowed {
            request_id: request_id.to_string(),
            kind: kind.as_str(),
            allowed: names.join(", "),
        }
    }

    /// The gRPC code this error is answered with; bulk items report it per item.
    pub fn code(&self) -> tonic::Code {
        use tonic::Code;
        match self {
            Self::InvalidArgument { .. } => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::InvalidTransition { .. }
            | Self::AlreadyDecided { .. }
            | Self::NotAllowed { .. }
            | Self::DecisionMismatch { .. } => Code::FailedPrecondition,
            Self::PermissionDenied(_) => Code::PermissionDenied,
            Self::ShuttingDown => Code::Unavailable,
            Self::Lagged => Code::ResourceExhausted,
            Self::Storage(_) => Code::Internal,
        }
    }
}

impl From<ConvertError> for Error {
    fn from(e: ConvertError) -> Self {
        Self::invalid(e.field(), e.to_string())
    }
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        Self::Storage(e.to_string())
    }
}

impl From<FlushError> for Error {
    fn from(e: FlushError) -> Self {
        Self::Storage(e.to_string())
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument {
                summary,
                violations,
            } => invalid_argument(&summary, &violations),
            Error::Storage(detail) => {
                // The detail may name files on the server; it goes to the log, not the caller.
                tracing::error!(error = %detail, "storage failure answered as INTERNAL");
                Status::internal("approval store failed; see the server log")
            }
            other => Status::new(other.code(), other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{ApprovalState, Transition};
    use tonic::Code;

    #[test]
    fn each_error_has_its_status_code() {
        let cases = [
            (Error::invalid("args", "required"), Code::InvalidArgument),
            (Error::NotFound("r".into()), Code::NotFound),
            (
                Error::InvalidTransition {
                    request_id: "r".into(),
                    source: InvalidTransition {
                        from: ApprovalState::Cancelled,
                        event: Transition::Decide,
                    },
                },
                Code::FailedPrecondition,
            ),
            (Error::PermissionDenied("no".into()), Code::PermissionDenied),
            (Error::ShuttingDown, Code::Unavailable),
            (Error::Lagged, Code::ResourceExhausted),
            (Error::Storage("disk".into()), Code::Internal),
        ];
        for (err, code) in cases {
            assert_eq!(Status::from(err).code(), code);
        }
    }

    #[test]
    fn invalid_argument_carries_the_field() {
        let status = Status::from(Error::invalid("args", "required for EDIT"));
        let violations = arbor_shared::status::field_violations(&status);
        assert_eq!(violations[0].field, "args");
    }
}
