//! What each store operation does to the records, written once for every backend: which move
//! the lifecycle allows, what the new record holds, which audit entry goes with it. A backend
//! gives a transaction's view of the records ([`Records`]) and runs these functions inside one
//! of its transactions; it keeps nothing of the domain's rules for itself.

use arbor_shared::domain::{ApprovalRequest, DecisionKind, DecisionSource, TimeoutAction};
use serde_json::{Map, Value as Json};

use super::{
    ACTOR_RUNNER, ACTOR_SERVICE, ACTOR_TIMEOUT, DeliveryOutcome, Put, Resolved, backend::Records,
    webhooks::enqueue,
};
use crate::{
    error::Error,
    lifecycle::{ApprovalState, Transition},
    model::{Approval, AuditAction, AuditEntry, NewDecision},
    webhooks::EventKind,
};

type Outcome<R, T> = Result<T, <R as Records>::Fail>;

pub(super) fn load<R: Records>(tx: &R, request_id: &str) -> Outcome<R, Approval> {
    tx.find(request_id)?
        .ok_or_else(|| Error::NotFound(request_id.to_string()).into())
}

/// A copy of `a` one version on, moved by `event` if the lifecycle allows it.
fn step<R: Records>(tx: &R, a: &Approval, event: Transition) -> Outcome<R, Approval> {
    let state = a
        .state
        .apply(event)
        .map_err(|source| Error::InvalidTransition {
            request_id: a.id().to_string(),
            source,
        })?;
    Ok(next(tx, a, state))
}

/// A copy of `a` one version on, in `state`.
fn next<R: Records>(tx: &R, a: &Approval, state: ApprovalState) -> Approval {
    let mut n = a.clone();
    (n.state, n.version, n.updated_at_ms) = (state, n.version + 1, tx.now());
    n
}

/// Writes `n` over `old` with the audit entry of the move, and answers `n`.
fn write<R: Records>(
    tx: &R,
    old: &Approval,
    n: Approval,
    entry: AuditEntry,
) -> Outcome<R, Approval> {
    tx.save(Some(old), &n)?;
    tx.append(entry)?;
    Ok(n)
}

/// A new request is stored PENDING; a known id (whatever its state) is returned unchanged.
pub(super) fn put<R: Records>(
    tx: &R,
    request: &ApprovalRequest,
    unknown_kind: Option<i32>,
) -> Outcome<R, Put> {
    put_deciding(tx, request, unknown_kind, None)
}

/// What the policy does with a new request as it is stored: decides it, hands it to an
/// approval rule's stages, or leaves it to any approver.
pub(super) type Decide<'a> = &'a (dyn Fn(&Approval) -> Plan + Send + Sync);

/// [`put`], and a new request that `decide` decides is stored already RESOLVED with that
/// decision (its id `decision_id`): the record is written once, with the REQUESTED and then
/// the DECIDED audit entry, as [`put`] then [`resolve`] would leave it. A decision the request
/// does not allow is not taken here: the request is stored PENDING, and whoever decides it
/// next is refused as anyone is.
pub(super) fn put_deciding<R: Records>(
    tx: &R,
    request: &ApprovalRequest,
    unknown_kind: Option<i32>,
    decide: Option<(Decide<'_>, &str)>,
) -> Outcome<R, Put> {
    if let Some(approval) = tx.find(&request.request_id)? {
        return Ok(Put {
            approval,
            created: false,
            decided: false,
        });
    }
    let now = tx.now();
    let approval = Approval {
        arrival: tx.next_arrival()?,
        request: request.clone(),
        unknown_kind,
        state: ApprovalState::Pending,
        decision: None,
        created_at_ms: now,
        updated_at_ms: now,
        version: 1,
        delivery_attempts: 0,
        last_delivery_error: String::new(),
        delivered_at_ms: 0,
        cancel_reason: String::new(),
        ext: crate::model::Extras {
            args_digest: request.args_digest(),
            ..Default::default()
        },
    };
    let requested = AuditEntry::about(&approval, AuditAction::Requested, ACTOR_RUNNER)
        .with_reason(request.title.clone());
    let plan = decide.map_or(Plan::Leave, |(decide, _)| decide(&approval));
    let decision_id = decide.map_or("", |(_, id)| id);
    let mut approval = approval;
    let decision = match plan {
        Plan::Decide(d) if approval.allows(d.kind) => Some(d),
        Plan::Decide(_) | Plan::Leave => None,
        Plan::Govern(governed) => {
            let (g, opened) = *governed;
            let rule = g.rule.clone();
            approval.ext.governance = Some(g);
            match opened {
                Ok(()) => None,
                // A stage that cannot reach its quorum never waits: REJECT now, saying why.
                Err(why) => Some(NewDecision {
                    kind: DecisionKind::Reject,
                    reason: why,
                    decided_by: format!("policy:{rule}"),
                    source: DecisionSource::Policy,
                    rule,
                    ..NewDecision::person(DecisionKind::Reject, "")
                }),
            }
        }
    };
    let Some(decision) = decision else {
        tx.save(None, &approval)?;
        let opened = approval.ext.governance.as_ref().map(|g| {
            let mut e = AuditEntry::about(&approval, AuditAction::StageOpened, ACTOR_SERVICE);
            e.ext.stage = g.stage().name.clone();
            e.ext.args_digest = g.proposal.digest.clone();
            e.with_reason(format!("eligible: {}", g.eligible.join(", ")))
        });
        let governed = opened.is_some();
        tx.audit_all(std::iter::once(requested).chain(opened).collect())?;
        enqueue(tx, EventKind::Requested, &approval)?;
        if governed {
            enqueue(tx, EventKind::StageOpened, &approval)?;
        }
        return Ok(Put {
            approval,
            created: true,
            decided: false,
        });
    };
    let (mut n, entry) = decided(tx, &approval, &decision, decision_id, Transition::Decide)?;
    // Stored once: this is its first version (watchers are told it was CREATED).
    n.version = approval.version;
    tx.save(None, &n)?;
    tx.audit_all(vec![requested, entry])?;
    // Told as it happened: requested, then decided.
    enqueue(tx, EventKind::Requested, &approval)?;
    enqueue(tx, EventKind::Decided, &n)?;
    Ok(Put {
        approval: n,
        created: true,
        decided: true,
    })
}

/// What the policy does with a new request (see [`Decide`]).
pub enum Plan {
    Leave,
    Decide(NewDecision),
    /// Governed by an approval rule: its first stage opened, or why it cannot be.
    Govern(Box<(crate::governance::Governance, Result<(), String>)>),
}

impl From<Option<NewDecision>> for Plan {
    fn from(d: Option<NewDecision>) -> Self {
        d.map_or(Plan::Leave, Plan::Decide)
    }
}

/// PENDING → RESOLVED with `decision` (its id generated by the caller, once, so a retried
/// transaction reuses it); the same decision again is a duplicate.
pub(super) fn resolve<R: Records>(
    tx: &R,
    request_id: &str,
    decision: &NewDecision,
    decision_id: &str,
) -> Outcome<R, Resolved> {
    let a = load(tx, request_id)?;
    crate::voting::check_not_submitter(&a, &decision.decided_by, decision.not_by_submitter)?;
    if !a.allows(decision.kind) {
        return Err(
            Error::not_allowed(request_id, decision.kind, &a.request.allowed_decisions).into(),
        );
    }
    // A cancelled approval refuses every decision, even the one it held.
    if let (Some(held), false) = (&a.decision, a.state == ApprovalState::Cancelled) {
        if decision.repeats(held, a.state == ApprovalState::Pruned) {
            return Ok(Resolved {
                approval: a,
                duplicate: true,
                traceparent: None,
            });
        }
        return Err(Error::AlreadyDecided {
            request_id: request_id.to_string(),
            existing: held.kind.as_str(),
            decision_id: held.decision_id.clone(),
        }
        .into());
    }
    crate::voting::check_digest(&a, &decision.expected_digest)?;
    if decision.source == DecisionSource::Person {
        crate::voting::check_claim(&a, &decision.decided_by, tx.now())?;
    }
    if a.ext.governance.is_some() && decision.source == DecisionSource::Person {
        let delegations = tx.delegations()?;
        let counted = crate::voting::vote(&a, decision, &delegations, tx.now())?;
        return settle_vote(tx, &a, counted, decision_id, Transition::Decide);
    }
    let (n, entry) = decided(tx, &a, decision, decision_id, Transition::Decide)?;
    let n = write(tx, &a, n, entry)?;
    enqueue(tx, EventKind::Decided, &n)?;
    Ok(Resolved {
        approval: n,
        duplicate: false,
        traceparent: None,
    })
}

/// `n`, a change of `a` that keeps its state, one version on at the transaction's time.
fn stamped<R: Records>(tx: &R, a: &Approval, mut n: Approval) -> Approval {
    (n.version, n.updated_at_ms) = (a.version + 1, tx.now());
    n
}

/// A change that keeps an approval's state: the new record and its audit entries, or a refusal.
pub(super) type Change =
    dyn Fn(&Approval, u64) -> crate::error::Result<(Approval, Vec<AuditEntry>)> + Send + Sync;

/// One change to approval `request_id` that keeps its state (a claim, a comment): `f`, given
/// the record and the transaction's time, answers the new record and its audit entries, or
/// refuses and nothing is written.
pub(super) fn change<R: Records>(tx: &R, request_id: &str, f: &Change) -> Outcome<R, Approval> {
    let a = load(tx, request_id)?;
    let (n, entries) = f(&a, tx.now())?;
    let n = stamped(tx, &a, n);
    tx.save(Some(&a), &n)?;
    tx.audit_all(entries)?;
    Ok(n)
}

/// Writes what a vote or a stage's deadline did to `a`: the record with its entries, and, when
/// the request is now decided, the decision (by `event`, DECIDE or EXPIRE) after them.
fn settle_vote<R: Records>(
    tx: &R,
    a: &Approval,
    counted: crate::voting::Counted,
    decision_id: &str,
    event: Transition,
) -> Outcome<R, Resolved> {
    use crate::voting::Counted;
    let (n, entries) = match counted {
        Counted::Pending(n, entries) => (stamped(tx, a, n), entries),
        Counted::Decide(n, mut entries, d) => {
            let (mut decided, entry) = decided(tx, &n, &d, decision_id, event)?;
            if let Some(g) = &n.ext.governance {
                decided.ext.voters = g.voters();
                decided.ext.decided_digest = g.proposal.digest.clone();
            }
            entries.push(entry);
            (decided, entries)
        }
    };
    tx.save(Some(a), &n)?;
    let events: Vec<EventKind> = entries
        .iter()
        .filter_map(|e| webhook_of(e.action))
        .collect();
    tx.audit_all(entries)?;
    for event in events {
        enqueue(tx, event, &n)?;
    }
    Ok(Resolved {
        approval: n,
        duplicate: false,
        traceparent: None,
    })
}

/// The webhook event an audit entry of a governed change is told as.
fn webhook_of(action: AuditAction) -> Option<EventKind> {
    match action {
        AuditAction::Voted => Some(EventKind::Voted),
        AuditAction::StageOpened => Some(EventKind::StageOpened),
        AuditAction::Escalated => Some(EventKind::Escalated),
        AuditAction::Reminded => Some(EventKind::Reminded),
        AuditAction::Decided => Some(EventKind::Decided),
        AuditAction::Expired => Some(EventKind::Expired),
        _ => None,
    }
}

/// `a` decided with `decision` (its id `decision_id`) by `event` (a decision or the deadline),
/// and the audit entry that says so.
fn decided<R: Records>(
    tx: &R,
    a: &Approval,
    decision: &NewDecision,
    decision_id: &str,
    event: Transition,
) -> Outcome<R, (Approval, AuditEntry)> {
    let mut n = step(tx, a, event)?;
    let d = decision
        .clone()
        .into_decision(decision_id.to_string(), tx.now());
    let actor = match d.source {
        DecisionSource::Person => d.decided_by.clone(),
        DecisionSource::Policy => d.rule.clone(),
        DecisionSource::Timeout => ACTOR_TIMEOUT.to_string(),
    };
    let action = match event {
        Transition::Expire => AuditAction::Expired,
        _ => AuditAction::Decided,
    };
    let entry = AuditEntry::about(&n, action, actor).with_decision(&d);
    n.decision = Some(d);
    Ok((n, entry))
}

/// PENDING → EXPIRED with the request's `on_timeout` decision.
pub(super) fn expire<R: Records>(
    tx: &R,
    request_id: &str,
    decision_id: &str,
) -> Outcome<R, Approval> {
    let a = load(tx, request_id)?;
    let stage_due = a
        .stage_deadline_first()
        .is_some_and(|g| g.stage_deadline_ms <= tx.now());
    if stage_due && a.state == ApprovalState::Pending {
        let counted = crate::voting::stage_timeout(&a, tx.now());
        return Ok(settle_vote(tx, &a, counted, decision_id, Transition::Expire)?.approval);
    }
    // A governed request whose stage is not due and which has no deadline of its own has
    // nothing to expire (a timer that read a deadline since moved on).
    if a.ext.governance.is_some() && a.request.deadline_ms == 0 {
        return Ok(a);
    }
    let kind = match a.request.on_timeout {
        TimeoutAction::Approve => DecisionKind::Approve,
        TimeoutAction::Reject => DecisionKind::Reject,
    };
    let d = NewDecision {
        kind,
        reason: "deadline passed".into(),
        args: Json::Null,
        result: Json::Null,
        decided_by: ACTOR_TIMEOUT.into(),
        source: DecisionSource::Timeout,
        rule: String::new(),
        not_by_submitter: false,
        expected_digest: String::new(),
    };
    let (n, entry) = decided(tx, &a, &d, decision_id, Transition::Expire)?;
    let n = write(tx, &a, n, entry)?;
    enqueue(tx, EventKind::Expired, &n)?;
    Ok(n)
}

/// Counts a delivery attempt of the decision the approval holds; `None` when it holds
/// another or no longer awaits delivery.
pub(super) fn record_delivery<R: Records>(
    tx: &R,
    request_id: &str,
    decision_id: &str,
    outcome: &DeliveryOutcome,
) -> Outcome<R, Option<Approval>> {
    let a = load(tx, request_id)?;
    let holds = a
        .decision
        .as_ref()
        .is_some_and(|d| d.decision_id == decision_id);
    if !holds || !a.needs_delivery() {
        return Ok(None);
    }
    let (n, delivered) = attempted(tx, &a, outcome);
    tx.save(Some(&a), &n)?;
    if let Some(entry) = delivered {
        tx.append(entry)?;
    }
    Ok(Some(n))
}

/// `a` with a delivery attempt of its decision counted, and for an accepted one, the
/// DELIVERED audit entry; not written yet.
fn attempted<R: Records>(
    tx: &R,
    a: &Approval,
    outcome: &DeliveryOutcome,
) -> (Approval, Option<AuditEntry>) {
    let mut n = next(tx, a, a.state);
    n.delivery_attempts = n.delivery_attempts.saturating_add(1);
    match outcome {
        DeliveryOutcome::Accepted => {
            n.delivered_at_ms = tx.now();
            n.last_delivery_error.clear();
        }
        DeliveryOutcome::Failed(e) => n.last_delivery_error = e.clone(),
    }
    let entry = match (outcome, &n.decision) {
        (DeliveryOutcome::Accepted, Some(d)) => {
            Some(AuditEntry::about(&n, AuditAction::Delivered, ACTOR_SERVICE).with_decision(d))
        }
        _ => None,
    };
    (n, entry)
}

/// RESOLVED/EXPIRED → ACKED, only for the decision held.
pub(super) fn ack<R: Records>(tx: &R, request_id: &str, decision_id: &str) -> Outcome<R, Approval> {
    let a = load(tx, request_id)?;
    let (n, entry) = acked(tx, &a, decision_id)?;
    write(tx, &a, n, entry)
}

/// ACKED → PRUNED: the bulky payload and the decision's args/result go.
pub(super) fn prune<R: Records>(tx: &R, request_id: &str) -> Outcome<R, Approval> {
    let a = load(tx, request_id)?;
    let (n, entry) = pruned(tx, &a)?;
    write(tx, &a, n, entry)
}

/// The moves of a consumption ([`ack`] then [`prune`], the record written once, in its pruned
/// form) and their audit entries, not written yet.
pub(super) struct Consumption {
    /// The delivery recorded with the consumption, when it was not recorded before.
    delivered: Option<AuditEntry>,
    acked: (Approval, AuditEntry),
    pruned: (Approval, AuditEntry),
}

/// Every check of a consumption on the loaded `a`, before anything is written: a refusal
/// here leaves the transaction as it was. With `delivered`, the runner's acceptance of the
/// decision is recorded first, as an accepted [`record_delivery`] would, unless it already is.
pub(super) fn consumption<R: Records>(
    tx: &R,
    a: &Approval,
    decision_id: &str,
    delivered: bool,
) -> Outcome<R, Consumption> {
    // Of another decision than the one held, `acked` refuses it, marked or not.
    let (marked, delivered) = match delivered && a.needs_delivery() {
        true => {
            let (n, entry) = attempted(tx, a, &DeliveryOutcome::Accepted);
            (Some(n), entry)
        }
        false => (None, None),
    };
    let acked = acked(tx, marked.as_ref().unwrap_or(a), decision_id)?;
    let pruned = pruned(tx, &acked.0)?;
    Ok(Consumption {
        delivered,
        acked,
        pruned,
    })
}

/// Writes `consumption` of `a`: the record once, in its pruned form, and its audit entries.
pub(super) fn consume<R: Records>(
    tx: &R,
    a: &Approval,
    consumption: Consumption,
) -> Outcome<R, (Approval, Approval)> {
    let Consumption {
        delivered,
        acked: (acked, acked_entry),
        pruned: (pruned, pruned_entry),
    } = consumption;
    tx.save(Some(a), &pruned)?;
    let entries = delivered.into_iter().chain([acked_entry, pruned_entry]);
    tx.audit_all(entries.collect())?;
    Ok((acked, pruned))
}

/// `a` acked, and the audit entry that says so; the decision must be the one held.
fn acked<R: Records>(
    tx: &R,
    a: &Approval,
    decision_id: &str,
) -> Outcome<R, (Approval, AuditEntry)> {
    let n = step(tx, a, Transition::Ack)?;
    let held = a
        .decision
        .as_ref()
        .map(|d| d.decision_id.clone())
        .unwrap_or_default();
    if held != decision_id {
        return Err(Error::DecisionMismatch {
            request_id: a.id().to_string(),
            held,
            given: decision_id.to_string(),
        }
        .into());
    }
    let mut entry = AuditEntry::about(&n, AuditAction::Acked, ACTOR_RUNNER);
    if let Some(d) = &n.decision {
        entry = entry.with_decision(d);
    }
    Ok((n, entry))
}

/// `a` pruned, and the audit entry that says so.
fn pruned<R: Records>(tx: &R, a: &Approval) -> Outcome<R, (Approval, AuditEntry)> {
    let mut n = step(tx, a, Transition::Prune)?;
    n.request.tool_args = Json::Null;
    n.request.context = Map::new();
    if let Some(d) = &mut n.decision {
        d.args = Json::Null;
        d.result = Json::Null;
    }
    let entry = AuditEntry::about(&n, AuditAction::Pruned, ACTOR_SERVICE);
    Ok((n, entry))
}

/// PENDING/RESOLVED/EXPIRED → CANCELLED.
pub(super) fn cancel<R: Records>(
    tx: &R,
    a: &Approval,
    actor: &str,
    reason: &str,
) -> Outcome<R, Approval> {
    let mut n = step(tx, a, Transition::Cancel)?;
    n.cancel_reason = reason.to_string();
    tx.save(Some(a), &n)?;
    let mut entry = AuditEntry::about(&n, AuditAction::Cancelled, actor).with_reason(reason);
    if let Some(d) = &n.decision {
        entry = entry.with_decision(d).with_reason(reason);
    }
    tx.append(entry)?;
    Ok(n)
}

/// Whether the lifecycle lets `a` be cancelled (a run's cancel skips the others).
pub(super) fn cancellable(a: &Approval) -> bool {
    a.state.apply(Transition::Cancel).is_ok()
}
