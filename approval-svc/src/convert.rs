//! Conversions between this service's domain types and the generated proto types, done at the
//! gRPC edge only.

use arbor_shared::{
    convert::ConvertError,
    domain::{ApprovalRequest, DecisionKind},
    json::to_proto_value,
    proto::{approval::v1 as pb, runner::v1 as runner_pb},
    time::{opt_timestamp, timestamp},
};
use globset::Glob;
use serde_json::Value as Json;

use crate::{
    error::{Error, Result},
    governance::{Governance, quorum},
    lifecycle::ApprovalState,
    model::{Approval, AuditAction, AuditEntry, Decision, Filter},
};

impl From<ApprovalState> for pb::ApprovalState {
    fn from(s: ApprovalState) -> Self {
        match s {
            ApprovalState::Pending => Self::Pending,
            ApprovalState::Resolved => Self::Resolved,
            ApprovalState::Expired => Self::Expired,
            ApprovalState::Acked => Self::Acked,
            ApprovalState::Pruned => Self::Pruned,
            ApprovalState::Cancelled => Self::Cancelled,
        }
    }
}

pub fn state_from_wire(value: i32, field: &'static str) -> Result<ApprovalState, ConvertError> {
    match pb::ApprovalState::try_from(value) {
        Ok(pb::ApprovalState::Pending) => Ok(ApprovalState::Pending),
        Ok(pb::ApprovalState::Resolved) => Ok(ApprovalState::Resolved),
        Ok(pb::ApprovalState::Expired) => Ok(ApprovalState::Expired),
        Ok(pb::ApprovalState::Acked) => Ok(ApprovalState::Acked),
        Ok(pb::ApprovalState::Pruned) => Ok(ApprovalState::Pruned),
        Ok(pb::ApprovalState::Cancelled) => Ok(ApprovalState::Cancelled),
        _ => Err(ConvertError::BadEnum {
            field,
            type_name: "ApprovalState",
            value,
            accepted: [
                pb::ApprovalState::Pending,
                pb::ApprovalState::Resolved,
                pb::ApprovalState::Expired,
                pb::ApprovalState::Acked,
                pb::ApprovalState::Pruned,
                pb::ApprovalState::Cancelled,
            ]
            .map(|s| s.as_str_name())
            .join(", "),
        }),
    }
}

fn opt_value(json: &Json) -> Option<prost_types::Value> {
    (!json.is_null()).then(|| to_proto_value(json))
}

impl From<&Decision> for pb::Decision {
    fn from(d: &Decision) -> Self {
        Self {
            decision_id: d.decision_id.clone(),
            kind: d.kind.into(),
            reason: d.reason.clone(),
            args: opt_value(&d.args),
            result: opt_value(&d.result),
            decided_by: d.decided_by.clone(),
            source: d.source.into(),
            rule: d.rule.clone(),
            decided_at: Some(timestamp(d.decided_at_ms)),
            voters: Vec::new(),
            args_digest: String::new(),
        }
    }
}

fn governance(g: &Governance) -> pb::Governance {
    let (approvals, seats_left) = quorum::progress(g);
    let stage = g.stage();
    pb::Governance {
        rule: g.rule.clone(),
        stage: g.current,
        stages: g.stages.iter().map(|s| s.name.clone()).collect(),
        eligible: g.eligible.clone(),
        required: g.required,
        approvals,
        seats_left,
        progress: format!("{approvals} of {} in {}", g.required, stage.name),
        votes: g
            .votes
            .iter()
            .map(|v| pb::Vote {
                principal: v.seat.clone(),
                delegate: match v.by == v.seat {
                    true => String::new(),
                    false => v.by.clone(),
                },
                kind: v.kind.into(),
                args_digest: v.digest.clone(),
                stage: v.stage,
                stale: v.stale,
                at: Some(timestamp(v.at_ms)),
                reason: v.reason.clone(),
            })
            .collect(),
        proposal: g.proposal.kind.into(),
        proposed_by: g.proposal.by.clone(),
    }
}

impl From<&Approval> for pb::Approval {
    fn from(a: &Approval) -> Self {
        let mut request = runner_pb::ApprovalRequested::from(&a.request);
        if let Some(kind) = a.unknown_kind {
            request.kind = kind;
        }
        if a.request.tool_args.is_null() {
            request.tool_args = None;
        }
        Self {
            request_id: a.request.request_id.clone(),
            state: pb::ApprovalState::from(a.state) as i32,
            request: Some(request),
            decision: a.decision.as_ref().map(|d| pb::Decision {
                voters: a.ext.voters.clone(),
                args_digest: a.decided_digest(),
                ..d.into()
            }),
            created_at: Some(timestamp(a.created_at_ms)),
            updated_at: Some(timestamp(a.updated_at_ms)),
            delivery_attempts: a.delivery_attempts,
            last_delivery_error: a.last_delivery_error.clone(),
            args_digest: a.args_digest(),
            governance: a.ext.governance.as_ref().map(governance),
            claim: a.ext.claim.as_ref().map(|c| pb::Claim {
                principal: c.by.clone(),
                until: opt_timestamp(c.until_ms),
            }),
            comments: a
                .ext
                .comments
                .iter()
                .map(|c| pb::Comment {
                    author: c.author.clone(),
                    text: c.text.clone(),
                    args_digest: c.args_digest.clone(),
                    at: Some(timestamp(c.at_ms)),
                })
                .collect(),
            next_deadline: match a.state {
                ApprovalState::Pending => opt_timestamp(a.deadline_ms()),
                _ => None,
            },
            on_deadline: match a.state {
                ApprovalState::Pending => on_deadline(a),
                _ => String::new(),
            },
        }
    }
}

/// What happens when `a`'s next deadline passes.
fn on_deadline(a: &Approval) -> String {
    match (a.stage_deadline_first(), a.deadline_ms()) {
        (_, 0) => String::new(),
        (Some(g), _) => format!("{:?}", g.stage().on_timeout).to_lowercase(),
        (None, _) => match a.request.on_timeout {
            arbor_shared::domain::TimeoutAction::Approve => "approve".into(),
            arbor_shared::domain::TimeoutAction::Reject => "reject".into(),
        },
    }
}

impl From<AuditAction> for pb::AuditAction {
    fn from(a: AuditAction) -> Self {
        match a {
            AuditAction::Requested => Self::Requested,
            AuditAction::Decided => Self::Decided,
            AuditAction::Delivered => Self::Delivered,
            AuditAction::Acked => Self::Acked,
            AuditAction::Pruned => Self::Pruned,
            AuditAction::Expired => Self::Expired,
            AuditAction::Cancelled => Self::Cancelled,
            AuditAction::Voted => Self::Voted,
            AuditAction::StageOpened => Self::StageOpened,
            AuditAction::Escalated => Self::Escalated,
            AuditAction::Reminded => Self::Reminded,
            AuditAction::Proposed => Self::Proposed,
            AuditAction::Claimed => Self::Claimed,
            AuditAction::Released => Self::Released,
            AuditAction::Reassigned => Self::Reassigned,
            AuditAction::Commented => Self::Commented,
        }
    }
}

impl From<&AuditEntry> for pb::AuditEntry {
    fn from(e: &AuditEntry) -> Self {
        Self {
            id: e.id,
            request_id: e.request_id.clone(),
            run_id: e.run_id.clone(),
            time: Some(timestamp(e.time_ms)),
            action: pb::AuditAction::from(e.action) as i32,
            actor: e.actor.clone(),
            decision: e.decision.map(i32::from).unwrap_or(0),
            reason: e.reason.clone(),
            source: e.source.map(i32::from).unwrap_or(0),
            rule: e.rule.clone(),
            decision_id: e.decision_id.clone(),
            on_behalf_of: e.ext.on_behalf_of.clone(),
            args_digest: e.ext.args_digest.clone(),
            stage: e.ext.stage.clone(),
        }
    }
}

/// Refuses an id with a NUL in it: no stored id holds one (the runner's events with one are
/// refused), and PostgreSQL's text cannot, so a lookup by it is a mistake.
pub fn no_nul(value: &str, field: &str) -> Result<()> {
    match value.contains('\0') {
        true => Err(Error::invalid(field, "holds a NUL byte")),
        false => Ok(()),
    }
}

/// A wire filter; `prefix` names the request field in violations (`filter`).
pub fn filter_from_pb(f: Option<&pb::ApprovalFilter>, prefix: &str) -> Result<Filter> {
    let Some(f) = f else {
        return Ok(Filter::default());
    };
    let states = f
        .states
        .iter()
        .map(|s| state_from_wire(*s, "filter.states"))
        .collect::<Result<Vec<_>, _>>()?;
    let tool_glob = if f.tool_name.is_empty() {
        None
    } else {
        Some(
            Glob::new(&f.tool_name)
                .map_err(|e| Error::invalid(&format!("{prefix}.tool_name"), e.to_string()))?
                .compile_matcher(),
        )
    };
    for (field, value) in [
        ("run_id", &f.run_id),
        ("thread_id", &f.thread_id),
        ("tree_id", &f.tree_id),
    ] {
        no_nul(value, &format!("{prefix}.{field}"))?;
    }
    if f.max_age_ms > 0 && f.min_age_ms > f.max_age_ms {
        return Err(Error::invalid(
            &format!("{prefix}.min_age_ms"),
            "must not exceed max_age_ms",
        ));
    }
    Ok(Filter {
        states,
        run_id: f.run_id.clone(),
        thread_id: f.thread_id.clone(),
        tool_glob,
        tree_id: f.tree_id.clone(),
        min_age_ms: f.min_age_ms,
        max_age_ms: f.max_age_ms,
        actionable_by: None,
        eligible_any: None,
        overdue: f.overdue,
        stage: f.stage.clone(),
        args_digest: f.args_digest.clone(),
    })
}

/// An APPROVAL_REQUESTED event as this service stores it. It is more forgiving than the shared
/// conversion where forgiving is safe: an unknown kind is kept (and rejected by the policy, fail
/// closed), a tool approval without a phase counts as `before`, and unknown decision kinds are
/// dropped from `allowed_decisions` (approve and reject are always allowed anyway).
pub fn request_from_event(
    r: &runner_pb::ApprovalRequested,
) -> Result<(ApprovalRequest, Option<i32>), ConvertError> {
    let mut wire = r.clone();
    let unknown_kind = runner_pb::ApprovalKind::try_from(r.kind)
        .ok()
        .filter(|k| *k != runner_pb::ApprovalKind::Unspecified)
        .is_none()
        .then_some(r.kind);
    if unknown_kind.is_some() {
        wire.kind = runner_pb::ApprovalKind::Node as i32;
    }
    if wire.phase == 0 {
        wire.phase = runner_pb::ApprovalPhase::Before as i32;
    }
    wire.allowed_decisions
        .retain(|d| DecisionKind::from_wire(*d, "allowed_decisions").is_ok());
    let request = ApprovalRequest::try_from(&wire)?;
    Ok((request, unknown_kind))
}

/// What the runner's `Resolve` carries for a stored decision.
pub fn runner_resolve(a: &Approval, d: &Decision) -> runner_pb::ResolveRequest {
    runner_pb::ResolveRequest {
        run_id: a.request.run_id.clone(),
        request_id: a.request.request_id.clone(),
        decision_id: d.decision_id.clone(),
        action: d.kind.action().into(),
        decision_kind: d.kind.into(),
        result: opt_value(&d.runner_result()),
        reason: d.reason.clone(),
        decided_by: d.decided_by.clone(),
        source: d.source.into(),
        args_digest: a.decided_digest(),
    }
}
