//! The approval lifecycle as an explicit state machine, so every store operation asks one
//! function whether its move is legal instead of re-deriving the diagram in place.
//!
//! ```text
//!            decide (person | policy)         ack (APPROVAL_CONSUMED)    prune
//!   PENDING ─────────────────────────▶ RESOLVED ─────────────────▶ ACKED ───────▶ PRUNED
//!      │  │                               │                          ▲
//!      │  └── expire (deadline) ──▶ EXPIRED ──────── ack ────────────┘
//!      │                               │  │
//!      └──────── cancel ───────────────┴──┴──▶ CANCELLED
//! ```
//!
//! RESOLVED and EXPIRED both carry a decision (EXPIRED: the request's `on_timeout`), and both
//! wait for delivery to the runner and its consumption. CANCELLED is reachable from every state
//! that the run can still abandon: a run that is cancelled or superseded, a withdrawn
//! suspension, or a runner that refuses the delivery as stale.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ApprovalState {
    /// Waiting for a person (or nothing matched in the policy).
    Pending,
    /// Decided; waiting for the run to consume the decision.
    Resolved,
    /// The deadline passed; decided by `on_timeout`, then delivered like RESOLVED.
    Expired,
    /// The run consumed the decision.
    Acked,
    /// The bulky payload and result were dropped; the record remains as a tombstone.
    Pruned,
    /// The run abandoned the request; nothing will be delivered.
    Cancelled,
}

/// What is being done to an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    Decide,
    Expire,
    Ack,
    Prune,
    Cancel,
}

/// An illegal move: the store answers FAILED_PRECONDITION and changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot {event} an approval that is {from}")]
pub struct InvalidTransition {
    pub from: ApprovalState,
    pub event: Transition,
}

impl ApprovalState {
    pub const ALL: [ApprovalState; 6] = [
        Self::Pending,
        Self::Resolved,
        Self::Expired,
        Self::Acked,
        Self::Pruned,
        Self::Cancelled,
    ];

    /// The one place the lifecycle diagram lives in code.
    pub fn apply(self, event: Transition) -> Result<ApprovalState, InvalidTransition> {
        use ApprovalState::*;
        use Transition::*;
        match (self, event) {
            (Pending, Decide) => Ok(Resolved),
            (Pending, Expire) => Ok(Expired),
            (Resolved | Expired, Ack) => Ok(Acked),
            (Acked, Prune) => Ok(Pruned),
            (Pending | Resolved | Expired, Cancel) => Ok(Cancelled),
            (from, event) => Err(InvalidTransition { from, event }),
        }
    }

    /// Holds a decision that the runner has not consumed yet.
    pub fn awaits_delivery(self) -> bool {
        matches!(self, Self::Resolved | Self::Expired)
    }

    /// Nothing will ever happen to it again.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Pruned | Self::Cancelled)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Resolved => "RESOLVED",
            Self::Expired => "EXPIRED",
            Self::Acked => "ACKED",
            Self::Pruned => "PRUNED",
            Self::Cancelled => "CANCELLED",
        }
    }
}

impl fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Decide => "decide",
            Self::Expire => "expire",
            Self::Ack => "ack",
            Self::Prune => "prune",
            Self::Cancel => "cancel",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{ApprovalState::*, Transition::*, *};

    #[test]
    fn the_diagram_and_nothing_else() {
        let legal = [
            (Pending, Decide, Resolved),
            (Pending, Expire, Expired),
            (Pending, Cancel, Cancelled),
            (Resolved, Ack, Acked),
            (Resolved, Cancel, Cancelled),
            (Expired, Ack, Acked),
            (Expired, Cancel, Cancelled),
            (Acked, Prune, Pruned),
        ];
        for from in ApprovalState::ALL {
            for event in [Decide, Expire, Ack, Prune, Cancel] {
                let expected = legal
                    .iter()
                    .find(|(f, e, _)| *f == from && *e == event)
                    .map(|(_, _, to)| *to);
                match (from.apply(event), expected) {
                    (Ok(to), Some(want)) => assert_eq!(to, want),
                    (Err(err), None) => assert_eq!(err, InvalidTransition { from, event }),
                    (got, want) => panic!("{from} --{event}--> {got:?}, expected {want:?}"),
                }
            }
        }
    }

    #[test]
    fn errors_read_like_the_move() {
        let err = Cancelled.apply(Decide).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot decide an approval that is CANCELLED"
        );
    }
}
