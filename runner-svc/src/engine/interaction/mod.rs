//! Suspensions and decisions: the records a run waits on, the decisions that resolve them, and the
//! per-run interaction namespace (inbox, acks, progress records, tool calls) kept in the checkpoint.

pub(crate) mod input;
pub(crate) mod store;
mod validate;

use arbor_shared::domain::{
    ApprovalRequest, DecisionKind, DecisionSource, SuspensionCategory, SuspensionState, Verdict,
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
    /// What to do: for approvals the decision's kind (after `validate_decision`), for user
    /// input and external results a plain resume or cancel.
    pub action: Verdict,
    #[serde(with = "arbor_shared::json::as_text")]
    pub result: Json,
    pub reason: String,
    pub decided_by: String,
    pub source: DecisionSource,
}

impl Decision {
    /// A decision that resumes the suspended node with `result` (user input, an external result;
    /// on an approval without a result, an approve).
    pub fn resume(request_id: &str, decision_id: &str, result: Json) -> Self {
        Self {
            request_id: request_id.to_string(),
            decision_id: decision_id.to_string(),
            action: Verdict::Resume,
            result,
            reason: String::new(),
            decided_by: String::new(),
            source: DecisionSource::Person,
        }
    }

    /// A decision that cancels (rejects) the suspended node.
    pub fn cancel(request_id: &str, decision_id: &str, reason: &str) -> Self {
        Self {
            action: Verdict::Cancel,
            reason: reason.to_string(),
            ..Self::resume(request_id, decision_id, Json::Null)
        }
    }

    /// An approval decision of the given kind; `result` holds EDIT's arguments or RESPOND's
    /// stand-in result.
    pub fn approval(request_id: &str, decision_id: &str, kind: DecisionKind, result: Json) -> Self {
        Self {
            action: Verdict::of(kind),
            ..Self::resume(request_id, decision_id, result)
        }
    }

    /// The approval decision this is. Records delivered before decisions carried their kind
    /// hold a plain resume or cancel: cancel rejects, resume without a result approves, and a
    /// resume with a result was an edit or a respond, whichever of the two the node allows.
    pub fn approval_kind(&self, allowed: &[DecisionKind]) -> DecisionKind {
        match self.action {
            Verdict::Cancel | Verdict::Reject => DecisionKind::Reject,
            Verdict::Approve => DecisionKind::Approve,
            Verdict::Edit => DecisionKind::Edit,
            Verdict::Respond => DecisionKind::Respond,
            Verdict::Resume if self.result.is_null() => DecisionKind::Approve,
            Verdict::Resume => [DecisionKind::Edit, DecisionKind::Respond]
                .into_iter()
                .find(|k| allowed.contains(k))
                .unwrap_or(DecisionKind::Approve),
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

/// What happens to a suspension. The machine (DESIGN §3): Active --consume--> Cleared (its
/// decision was taken into the checkpoint), Active --withdraw--> Inactive (its node was halted or
/// its run ended); nothing leaves Cleared or Inactive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SuspensionEvent {
    Consume,
    Withdraw,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("suspension cannot go from {from:?} on {event:?}")]
pub struct InvalidSuspensionTransition {
    pub from: SuspensionState,
    pub event: SuspensionEvent,
}

/// The next state, or the typed reason the move is illegal.
pub fn suspension_transition(
    from: SuspensionState,
    event: SuspensionEvent,
) -> Result<SuspensionState, InvalidSuspensionTransition> {
    match (from, event) {
        (SuspensionState::Active, SuspensionEvent::Consume) => Ok(SuspensionState::Cleared),
        (SuspensionState::Active, SuspensionEvent::Withdraw) => Ok(SuspensionState::Inactive),
        _ => Err(InvalidSuspensionTransition { from, event }),
    }
}

/// Why a decision does not fit its suspension; `field` is a path into the decision
/// (`result.value`). `not_allowed`: the decision is well formed, but its kind is not one the
/// suspension's node honours (FAILED_PRECONDITION rather than INVALID_ARGUMENT).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {description}")]
pub struct DecisionError {
    pub field: String,
    pub description: String,
    pub not_allowed: bool,
}

impl DecisionError {
    pub(crate) fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
            not_allowed: false,
        }
    }

    pub(crate) fn not_allowed(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            not_allowed: true,
            ..Self::new(field, description)
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
    fn suspensions_leave_active_once_and_never_come_back() {
        use SuspensionEvent::{Consume, Withdraw};
        use SuspensionState::{Active, Cleared, Inactive};
        assert_eq!(suspension_transition(Active, Consume), Ok(Cleared));
        assert_eq!(suspension_transition(Active, Withdraw), Ok(Inactive));
        for from in [Cleared, Inactive] {
            for event in [Consume, Withdraw] {
                assert_eq!(
                    suspension_transition(from, event),
                    Err(InvalidSuspensionTransition { from, event })
                );
            }
        }
    }

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
