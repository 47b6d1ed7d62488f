//! What a vote, an approver's edit and a stage's deadline do to one governed approval: the new
//! record and its audit entries, or the decision the request now takes. Pure functions over
//! the record, written once; the store runs them inside the transaction of each change, and
//! the counting itself is `governance::quorum`'s.

use arbor_shared::{
    digest,
    domain::{DecisionKind, DecisionSource},
};
use serde_json::Value as Json;

use crate::{
    error::Error,
    governance::{
        Governance, OnTimeout, Proposal, Vote,
        quorum::{self, Tally},
        seat::{Delegation, seat_for},
    },
    model::{Approval, AuditAction, AuditEntry, NewDecision},
};

/// Where a governed request stands after a change.
#[derive(Debug)]
pub enum Counted {
    /// Still PENDING: the changed record (not yet written) and its audit entries.
    Pending(Approval, Vec<AuditEntry>),
    /// Decided: the record as it stands before the decision, the audit entries of the change
    /// that decided it, and the decision.
    Decide(Approval, Vec<AuditEntry>, NewDecision),
}

/// FAILED_PRECONDITION unless `expected` (when given) is what `a` is bound to now.
pub fn check_digest(a: &Approval, expected: &str) -> Result<(), Error> {
    let current = a.args_digest();
    match expected.is_empty() || expected == current {
        true => Ok(()),
        false => Err(Error::StaleDigest {
            request_id: a.id().to_string(),
            current,
            given: expected.to_string(),
        }),
    }
}

/// FAILED_PRECONDITION when someone other than `who` holds `a` at `now_ms`.
pub fn check_claim(a: &Approval, who: &str, now_ms: u64) -> Result<(), Error> {
    match a.claim_at(now_ms) {
        Some(c) if c.by != who => Err(Error::Claimed {
            request_id: a.id().to_string(),
            holder: c.by.clone(),
        }),
        _ => Ok(()),
    }
}

/// PERMISSION_DENIED when `who` submitted `a`'s run and submitters are kept from deciding
/// their own runs (`not_by_submitter`: authentication is on).
pub fn check_not_submitter(a: &Approval, who: &str, not_by_submitter: bool) -> Result<(), Error> {
    let submitter = &a.request.submitted_by;
    match not_by_submitter && !submitter.is_empty() && submitter == who {
        true => Err(Error::OwnRun {
            principal: who.to_string(),
            run_id: a.request.run_id.clone(),
        }),
        false => Ok(()),
    }
}

/// The seat `who` votes in on `a`, governed by `g` (their own, or that of an eligible
/// delegator they stand in for), or PERMISSION_DENIED naming who is eligible.
fn seat_of(
    a: &Approval,
    g: &Governance,
    who: &str,
    delegations: &[Delegation],
    now_ms: u64,
) -> Result<String, Error> {
    seat_for(g, who, delegations, now_ms, &names(a)).ok_or_else(|| Error::NotEligible {
        principal: who.to_string(),
        request_id: a.id().to_string(),
        stage: g.stage().name.clone(),
        eligible: g.eligible.join(", "),
    })
}

/// Whether `who` may decide `a` as it stands at `now_ms`, and if not, why: the checks a
/// person's decision meets in the store (the submitter, a decision already held, a claim,
/// the open stage's seats), in that order. Pages use it to say why an item is not theirs to
/// decide; the store runs the same functions when the decision is taken.
pub fn may_decide(
    a: &Approval,
    who: &str,
    not_by_submitter: bool,
    delegations: &[Delegation],
    now_ms: u64,
) -> Result<(), Error> {
    check_not_submitter(a, who, not_by_submitter)?;
    if let Some(held) = &a.decision {
        return Err(Error::AlreadyDecided {
            request_id: a.id().to_string(),
            existing: held.kind.as_str(),
            decision_id: held.decision_id.clone(),
        });
    }
    check_claim(a, who, now_ms)?;
    match &a.ext.governance {
        Some(g) => seat_of(a, g, who, delegations, now_ms).map(|_| ()),
        None => Ok(()),
    }
}

fn names(a: &Approval) -> [&str; 2] {
    [&a.request.tool_name, &a.request.node_name]
}

fn entry(a: &Approval, g: &Governance, action: AuditAction, actor: &str) -> AuditEntry {
    let mut e = AuditEntry::about(a, action, actor);
    e.ext.args_digest = g.proposal.digest.clone();
    e.ext.stage = g.stage().name.clone();
    e
}

/// A person's decision on a governed, PENDING `a`, as a vote: APPROVE and REJECT count in the
/// voter's seat (or the seat of the eligible delegator they stand in for); EDIT and RESPOND
/// change what is voted on.
pub fn vote(
    a: &Approval,
    d: &NewDecision,
    delegations: &[Delegation],
    now_ms: u64,
) -> Result<Counted, Error> {
    let mut n = a.clone();
    let Some(g) = n.ext.governance.as_mut() else {
        return Err(Error::Storage(format!(
            "approval {} is not governed",
            a.id()
        )));
    };
    let seat = seat_of(a, g, &d.decided_by, delegations, now_ms)?;
    let mut entries = Vec::new();
    match d.kind {
        DecisionKind::Approve | DecisionKind::Reject => {
            let stage = g.current;
            let digest = g.proposal.digest.clone();
            quorum::cast(
                g,
                Vote {
                    seat: seat.clone(),
                    by: d.decided_by.clone(),
                    kind: d.kind,
                    digest,
                    stage,
                    at_ms: now_ms,
                    reason: d.reason.clone(),
                    stale: false,
                },
            );
            let mut e = entry(a, g, AuditAction::Voted, &d.decided_by);
            e.decision = Some(d.kind);
            e.source = Some(DecisionSource::Person);
            e.reason = d.reason.clone();
            entries.push(e);
        }
        DecisionKind::Edit | DecisionKind::Respond => {
            let payload = match d.kind {
                DecisionKind::Edit => d.args.clone(),
                _ => d.result.clone(),
            };
            let proposal = Proposal {
                kind: d.kind,
                digest: digest::of(&payload),
                payload,
                by: seat.clone(),
            };
            quorum::propose(g, proposal, now_ms, &d.reason);
            let mut e = entry(a, g, AuditAction::Proposed, &d.decided_by);
            e.decision = Some(d.kind);
            e.reason = d.reason.clone();
            entries.push(e);
        }
    }
    if seat != d.decided_by
        && let Some(e) = entries.last_mut()
    {
        e.ext.on_behalf_of = seat;
    }
    Ok(settle(n, entries, DecisionSource::Person, now_ms))
}

/// The open stage's deadline passed: its `on_timeout` is carried out.
pub fn stage_timeout(a: &Approval, now_ms: u64) -> Counted {
    let mut n = a.clone();
    let Some(g) = n.ext.governance.as_mut() else {
        return Counted::Pending(n, Vec::new());
    };
    let spec = g.stage().clone();
    let reason = format!("stage '{}' deadline passed", spec.name);
    let submitter = a.request.submitted_by.clone();
    let decide = |n: Approval, entries, kind, reason: String| {
        let d = decision(&n, kind, reason, DecisionSource::Timeout);
        Counted::Decide(n, entries, d)
    };
    match spec.on_timeout {
        OnTimeout::Reject => decide(n, Vec::new(), DecisionKind::Reject, reason),
        OnTimeout::Approve => {
            let kind = g.proposal.kind;
            decide(n, Vec::new(), kind, reason)
        }
        OnTimeout::Remind => {
            g.stage_deadline_ms = now_ms.saturating_add(spec.deadline_ms);
            let e = entry(a, g, AuditAction::Reminded, "timeout").with_reason(reason);
            Counted::Pending(n, vec![e])
        }
        OnTimeout::Escalate => {
            let next = g.current + 1;
            let opened = match (
                !quorum::can_escalate(g, &submitter),
                (next as usize) < g.stages.len(),
            ) {
                (false, _) => {
                    g.stage_deadline_ms = now_ms.saturating_add(spec.deadline_ms);
                    quorum::escalate(g, &submitter)
                }
                (true, true) => quorum::open(g, next, &submitter, now_ms),
                (true, false) => Err(format!("{reason} and there is no one to escalate to")),
            };
            let e = entry(a, g, AuditAction::Escalated, "timeout").with_reason(reason);
            match opened {
                Ok(()) => settle(n, vec![e], DecisionSource::Timeout, now_ms),
                Err(why) => decide(n, vec![e], DecisionKind::Reject, why),
            }
        }
    }
}

/// After a change: the request decided when its last stage passed or a stage can no longer
/// pass, the next stage opened when one passed, or still pending.
fn settle(
    mut n: Approval,
    mut entries: Vec<AuditEntry>,
    source: DecisionSource,
    now_ms: u64,
) -> Counted {
    let submitter = n.request.submitted_by.clone();
    loop {
        let Some(g) = n.ext.governance.as_mut() else {
            return Counted::Pending(n, entries);
        };
        match quorum::tally(g) {
            Tally::Pending => return Counted::Pending(n, entries),
            Tally::Rejected(why) => {
                let d = decision(&n, DecisionKind::Reject, why, source);
                return Counted::Decide(n, entries, d);
            }
            Tally::Passed if (g.current as usize) + 1 >= g.stages.len() => {
                let kind = g.proposal.kind;
                let why = format!("quorum of stage '{}' met", g.stage().name);
                let d = decision(&n, kind, why, source);
                return Counted::Decide(n, entries, d);
            }
            Tally::Passed => {
                let next = g.current + 1;
                let opened = quorum::open(g, next, &submitter, now_ms);
                if let Some(g) = n.ext.governance.as_ref() {
                    entries.push(entry(&n, g, AuditAction::StageOpened, "approval-svc"));
                }
                if let Err(why) = opened {
                    let d = decision(&n, DecisionKind::Reject, why, source);
                    return Counted::Decide(n, entries, d);
                }
            }
        }
    }
}

/// The decision a governed request takes: `kind` with the proposal's payload, named after
/// everyone whose vote counted.
fn decision(
    a: &Approval,
    kind: DecisionKind,
    reason: String,
    source: DecisionSource,
) -> NewDecision {
    let g = a.ext.governance.as_ref();
    let payload = g.map_or(Json::Null, |g| g.proposal.payload.clone());
    let voters = g.map(Governance::voters).unwrap_or_default();
    NewDecision {
        kind,
        reason,
        args: match kind {
            DecisionKind::Edit => payload.clone(),
            _ => Json::Null,
        },
        result: match kind {
            DecisionKind::Respond => payload,
            _ => Json::Null,
        },
        decided_by: match (source, voters.is_empty()) {
            (DecisionSource::Timeout, _) | (_, true) => "timeout".into(),
            _ => voters.join(", "),
        },
        source,
        rule: g.map(|g| g.rule.clone()).unwrap_or_default(),
        not_by_submitter: false,
        expected_digest: String::new(),
    }
}

/// Longest comment kept.
pub const MAX_COMMENT_BYTES: usize = 4096;

/// `who` takes `a` (for `ttl_ms`, 0: until released); `release` gives it back instead. A claim
/// someone else holds is refused; taking one's own again renews it.
pub fn claim(
    a: &Approval,
    who: &str,
    ttl_ms: u64,
    release: bool,
    now_ms: u64,
) -> Result<(Approval, Vec<AuditEntry>), Error> {
    if a.state != crate::lifecycle::ApprovalState::Pending {
        return Err(Error::InvalidTransition {
            request_id: a.id().to_string(),
            source: crate::lifecycle::InvalidTransition {
                from: a.state,
                event: crate::lifecycle::Transition::Decide,
            },
        });
    }
    check_claim(a, who, now_ms)?;
    let mut n = a.clone();
    let action = match release {
        true => {
            n.ext.claim = None;
            AuditAction::Released
        }
        false => {
            n.ext.claim = Some(crate::model::Claim {
                by: who.to_string(),
                until_ms: match ttl_ms {
                    0 => 0,
                    t => now_ms.saturating_add(t),
                },
            });
            AuditAction::Claimed
        }
    };
    let mut e = AuditEntry::about(a, action, who);
    e.ext.args_digest = a.args_digest();
    Ok((n, vec![e]))
}

/// `actor` moves `a`'s claim to `to` (the holder may; an operator may always, `overrides`).
pub fn reassign(
    a: &Approval,
    actor: &str,
    to: &str,
    overrides: bool,
    now_ms: u64,
) -> Result<(Approval, Vec<AuditEntry>), Error> {
    if !overrides {
        check_claim(a, actor, now_ms)?;
    }
    let until_ms = a.claim_at(now_ms).map_or(0, |c| c.until_ms);
    let (mut n, _) = claim(a, actor, 0, false, now_ms)?;
    n.ext.claim = Some(crate::model::Claim {
        by: to.to_string(),
        until_ms,
    });
    let from = a.claim_at(now_ms).map_or("nobody", |c| c.by.as_str());
    let e = AuditEntry::about(a, AuditAction::Reassigned, actor)
        .with_reason(format!("from {from} to {to}"));
    Ok((n, vec![e]))
}

/// Appends `author`'s comment, bound to the digest current now.
pub fn comment(
    a: &Approval,
    author: &str,
    text: &str,
    now_ms: u64,
) -> Result<(Approval, Vec<AuditEntry>), Error> {
    let mut n = a.clone();
    let digest = a.args_digest();
    n.ext.comments.push(crate::model::Comment {
        author: author.to_string(),
        text: text.to_string(),
        args_digest: digest.clone(),
        at_ms: now_ms,
    });
    let mut e = AuditEntry::about(a, AuditAction::Commented, author).with_reason(text);
    e.ext.args_digest = digest;
    Ok((n, vec![e]))
}
