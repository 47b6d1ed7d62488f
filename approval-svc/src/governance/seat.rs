//! Who may vote on a governed request, and in whose seat: an eligible principal in their own,
//! a delegate in their delegator's. Delegations are not chained: only a delegation *to* the
//! voter *from* an eligible principal counts, never one passed on.

use globset::Glob;
use serde::{Deserialize, Serialize};

use super::Governance;

/// `to` may vote in `from`'s seat between `starts_ms` and `ends_ms` on requests whose tool or
/// node name matches `scope` (empty: every request).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delegation {
    pub id: String,
    pub from: String,
    pub to: String,
    pub starts_ms: u64,
    pub ends_ms: u64,
    pub scope: String,
    pub created_by: String,
    pub created_at_ms: u64,
}

impl Delegation {
    /// Whether it lets its delegate act at `now_ms` on a request named `names` (tool, node).
    pub fn covers(&self, now_ms: u64, names: &[&str]) -> bool {
        let in_time = self.starts_ms <= now_ms && now_ms < self.ends_ms;
        let in_scope = self.scope.is_empty()
            || Glob::new(&self.scope).is_ok_and(|g| {
                let g = g.compile_matcher();
                names.iter().any(|n| !n.is_empty() && g.is_match(n))
            });
        in_time && in_scope
    }
}

/// The seat a vote by `voter` fills in the open stage: their own when they are eligible, else
/// that of an eligible delegator (the first, by name, whose seat has no live vote on what is
/// proposed now; else the first). `None`: they may not vote.
pub fn seat_for(
    g: &Governance,
    voter: &str,
    delegations: &[Delegation],
    now_ms: u64,
    names: &[&str],
) -> Option<String> {
    if g.eligible.iter().any(|e| e == voter) {
        return Some(voter.to_string());
    }
    let mut seats: Vec<&str> = delegations
        .iter()
        .filter(|d| d.to == voter && d.covers(now_ms, names))
        .map(|d| d.from.as_str())
        .filter(|from| g.eligible.iter().any(|e| e == from))
        .collect();
    seats.sort();
    seats.dedup();
    let open = seats.iter().find(|seat| {
        !g.live()
            .any(|v| v.seat == **seat && v.digest == g.proposal.digest)
    });
    open.or(seats.first()).map(|s| s.to_string())
}

/// Whether `voter` has something to do on `g` now: a seat (theirs or a delegator's) with no
/// live vote on what is proposed.
pub fn actionable(
    g: &Governance,
    voter: &str,
    delegations: &[Delegation],
    now_ms: u64,
    names: &[&str],
) -> bool {
    let own = std::iter::once(voter);
    let delegated = delegations
        .iter()
        .filter(|d| d.to == voter && d.covers(now_ms, names))
        .map(|d| d.from.as_str());
    own.chain(delegated).any(|seat| {
        g.eligible.iter().any(|e| e == seat)
            && !g.live().any(|v| {
                v.seat == seat
                    && (v.digest == g.proposal.digest
                        || v.kind == arbor_shared::domain::DecisionKind::Reject)
            })
            && (seat != g.proposal.by || g.editor_counts)
    })
}
