//! The service's one error type and its one mapping to gRPC statuses (DESIGN §7): each variant
//! says what went wrong, and `Error::code` alone decides the status code it is answered with.

use arbor_shared::{
    convert::ConvertError,
    domain::DecisionKind,
    status::{FieldViolation, invalid_argument},
};
use tonic::Status;

use crate::lifecycle::InvalidTransition;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A caller's request has invalid fields (each violation names one).
    #[error("invalid request")]
    InvalidRequest(Vec<FieldViolation>),
    /// A decision's kind, args, result or reason do not fit together.
    #[error("invalid decision")]
    InvalidDecision(Vec<FieldViolation>),
    /// A page token that no listing of this kind handed out.
    #[error("invalid request")]
    BadPageToken,
    /// A runner connection setting (URL, CA, token) is unusable; found at start-up.
    #[error("{setting}: {detail}")]
    BadRunnerSetting {
        setting: &'static str,
        detail: String,
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
    /// The caller's roles do not allow the action.
    #[error("principal '{principal}' may not {action} (needs one of: {roles})")]
    RoleRequired {
        principal: String,
        action: &'static str,
        roles: String,
    },
    /// Nobody decides the approvals of a run they submitted themselves.
    #[error("principal '{principal}' submitted run {run_id} and may not decide its approvals")]
    OwnRun { principal: String, run_id: String },
    /// A vote or decision against arguments that are no longer the ones voted on.
    #[error(
        "approval {request_id} is now bound to {current}, not {given}: what is voted on changed; read it again"
    )]
    StaleDigest {
        request_id: String,
        current: String,
        given: String,
    },
    /// The caller is not among the open stage's approvers, nor a delegate of one.
    #[error(
        "principal '{principal}' may not vote on approval {request_id} in stage '{stage}' (eligible: {eligible})"
    )]
    NotEligible {
        principal: String,
        request_id: String,
        stage: String,
        eligible: String,
    },
    /// Someone else holds the approval.
    #[error("approval {request_id} is claimed by '{holder}'")]
    Claimed { request_id: String, holder: String },
    #[error("delegation {0} not found")]
    DelegationNotFound(String),
    #[error("approval-svc is shutting down")]
    ShuttingDown,
    #[error("watcher lagged; re-watch")]
    Lagged,
    /// The store's database cannot be reached right now; the caller may retry. The detail
    /// goes to the log.
    #[error("approval store unavailable: {0}")]
    Unavailable(String),
    /// The store failed. The detail (which may name files on the server) goes to the log,
    /// never to a caller.
    #[error("storage failed: {0}")]
    Storage(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An invalid request with one bad field.
    pub fn invalid(field: &str, description: impl Into<String>) -> Self {
        Self::InvalidRequest(vec![FieldViolation::new(field, description)])
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
            Self::InvalidRequest(_)
            | Self::InvalidDecision(_)
            | Self::BadPageToken
            | Self::BadRunnerSetting { .. } => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::InvalidTransition { .. }
            | Self::AlreadyDecided { .. }
            | Self::NotAllowed { .. }
            | Self::DecisionMismatch { .. }
            | Self::StaleDigest { .. }
            | Self::Claimed { .. } => Code::FailedPrecondition,
            Self::RoleRequired { .. } | Self::OwnRun { .. } | Self::NotEligible { .. } => {
                Code::PermissionDenied
            }
            Self::DelegationNotFound(_) => Code::NotFound,
            Self::ShuttingDown | Self::Unavailable(_) => Code::Unavailable,
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

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let summary = e.to_string();
        match e {
            Error::InvalidRequest(violations) | Error::InvalidDecision(violations) => {
                invalid_argument(&summary, &violations)
            }
            Error::BadPageToken => invalid_argument(
                &summary,
                &[FieldViolation::new(
                    "page_token",
                    arbor_shared::page::INVALID,
                )],
            ),
            Error::BadRunnerSetting { setting, detail } => invalid_argument(
                "invalid runner setting",
                &[FieldViolation::new(setting, detail)],
            ),
            Error::Storage(detail) => {
                // The detail may name files on the server; it goes to the log, not the caller.
                tracing::error!(error = %detail, "storage failure answered as INTERNAL");
                Status::internal("approval store failed; see the server log")
            }
            Error::Unavailable(detail) => {
                tracing::warn!(error = %detail, "answered UNAVAILABLE");
                Status::unavailable("approval store unavailable; retry")
            }
            other => Status::new(other.code(), summary),
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
            (Error::BadPageToken, Code::InvalidArgument),
            (
                Error::BadRunnerSetting {
                    setting: "runner_url",
                    detail: "bad".into(),
                },
                Code::InvalidArgument,
            ),
            (
                Error::RoleRequired {
                    principal: "p".into(),
                    action: "decide",
                    roles: "approver".into(),
                },
                Code::PermissionDenied,
            ),
            (
                Error::OwnRun {
                    principal: "p".into(),
                    run_id: "run-1".into(),
                },
                Code::PermissionDenied,
            ),
            (Error::ShuttingDown, Code::Unavailable),
            (Error::Unavailable("db down".into()), Code::Unavailable),
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
