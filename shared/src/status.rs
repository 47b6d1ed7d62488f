//! Building blocks for the one `From<Error> for Status` each service has: invalid-argument
//! statuses carry `google.rpc.BadRequest` field violations so clients can point at the bad field.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// One bad field: its path (JSON path for documents, field name for requests) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    pub field: String,
    pub description: String,
}

impl FieldViolation {
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

impl std::fmt::Display for FieldViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.description)
    }
}

/// INVALID_ARGUMENT whose message lists every violation and whose details carry them as
/// `google.rpc.BadRequest`.
pub fn invalid_argument(summary: &str, violations: &[FieldViolation]) -> Status {
    let listed: Vec<String> = violations.iter().map(ToString::to_string).collect();
    let message = if listed.is_empty() {
        summary.to_string()
    } else {
        format!("{summary}: {}", listed.join("; "))
    };
    let mut details = ErrorDetails::new();
    for v in violations {
        details.add_bad_request_violation(v.field.clone(), v.description.clone());
    }
    Status::with_error_details(Code::InvalidArgument, message, details)
}

/// The field violations carried by a status, if any (used by clients and tests).
pub fn field_violations(status: &Status) -> Vec<FieldViolation> {
    status
        .get_error_details()
        .bad_request()
        .map(|br| {
            br.field_violations
                .iter()
                .map(|v| FieldViolation::new(v.field.clone(), v.description.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Truncates untrusted text before it is echoed into an error message.
pub fn clip(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn violations_survive_the_status_round_trip() {
        let status = invalid_argument(
            "invalid tree",
            &[FieldViolation::new("$.root.children", "must not be empty")],
        );
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("$.root.children"));
        assert_eq!(
            field_violations(&status),
            vec![FieldViolation::new("$.root.children", "must not be empty")]
        );
    }

    #[test]
    fn clip_respects_char_boundaries() {
        let s = "é".repeat(200);
        assert!(clip(&s).len() <= 124);
    }
}
