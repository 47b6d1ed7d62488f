//! Suspensions and decisions: the records a run waits on, the decisions that resolve them, and the
//! per-run interaction namespace (inbox, acks, progress records, tool calls) kept in the checkpoint.

pub(crate) mod input;
pub(crate) mod store;
mod validate;

use arbor_shared::domain::{
    ApprovalRequest, DecisionSource, ResolveAction, SuspensionCategory, SuspensionState,
};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use sha1::{Digest, Sha1};

pub use validate::validate_decision;

/// What resolves a suspension. `decision_id` makes delivery idempotent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub request_id: String,
    pub decision_id: String,
    pub action: ResolveAction,
    #[serde(with = "arbor_shared::json::as_text")]
    pub result: Json,
    pub reason: String,
    pub decided_by: String,
    pub source: DecisionSource,
}

impl Decision {
    /// A decision that resumes the suspended node with `result` (approve, edit, respond, input).
    pub fn resume(request_id: &str, decision_id: &str, result: Json) -> Self {
        Self {
            request_id: request_id.to_string(),
            decision_id: decision_id.to_string(),
            action: ResolveAction::Resume,
            result,
            reason: String::new(),
            decided_by: String::new(),
            source: DecisionSource::Person,
        }
    }

    /// A decision that cancels (rejects) the suspended node.
    pub fn cancel(request_id: &str, decision_id: &str, reason: &str) -> Self {
        Self {
            action: ResolveAction::Cancel,
            reason: reason.to_string(),
            ..Self::resume(request_id, decision_id, Json::Null)
        }
    }
}

/// A point where a run waits for the outside world.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuspensionRecord {
    pub request_id: String,
    pub category: SuspensionCategory,
    pub message: String,
    #[serde(with = "arbor_shared::json::as_text")]
    pub payload: Json,
    pub state: SuspensionState,
    pub node_locator: String,
    pub created_at_ms: u64,
    /// Filled for `RequireApproval`.
    pub approval: Option<ApprovalRequest>,
    /// Set when the record was cleared by a decision.
    pub consumed_decision_id: Option<String>,
}

/// Why a decision does not fit its suspension; `field` is a path into the decision
/// (`result.value`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {description}")]
pub struct DecisionError {
    pub field: String,
    pub description: String,
}

impl DecisionError {
    pub(crate) fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// Deterministic suspension id: the same run, node, phase and attempt always give the same id, so
/// a replay after a crash re-finds its record, while a retry (new attempt) asks anew. The run id is
/// part of it because one thread hosts many runs.
pub(crate) fn request_id(
    thread_id: &str,
    run_id: &str,
    locator: &str,
    phase: &str,
    attempt: u32,
) -> String {
    let mut h = Sha1::new();
    for part in [thread_id, run_id, locator, phase] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    h.update(attempt.to_string().as_bytes());
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_stable_and_separate_runs_and_attempts() {
        let a = request_id("t", "r1", "gate", "before", 0);
        assert_eq!(a, request_id("t", "r1", "gate", "before", 0));
        assert_eq!(a.len(), 40);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_uppercase())
        );
        assert_ne!(a, request_id("t", "r2", "gate", "before", 0));
        assert_ne!(a, request_id("t", "r1", "gate", "before", 1));
        assert_ne!(a, request_id("t", "r1", "gate", "after", 0));
    }
}
