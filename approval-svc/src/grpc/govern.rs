//! The governance RPCs: Delegate, RevokeDelegation, ListDelegations, Claim, Reassign and
//! Comment. Thin: check the caller, convert, call `Approvals`, convert back.

use arbor_shared::{
    auth::{Principal, Role},
    proto::approval::v1 as pb,
    time::{from_timestamp, opt_timestamp, timestamp},
};

use super::{DECIDERS, READERS, require, required};
use crate::{
    approvals::Approvals,
    error::{Error, Result},
    governance::seat::Delegation,
    store::ApprovalStore,
    voting::MAX_COMMENT_BYTES,
};

fn to_pb(d: &Delegation) -> pb::Delegation {
    pb::Delegation {
        id: d.id.clone(),
        from: d.from.clone(),
        to: d.to.clone(),
        starts: Some(timestamp(d.starts_ms)),
        ends: opt_timestamp(d.ends_ms),
        scope: d.scope.clone(),
        created_by: d.created_by.clone(),
    }
}

pub async fn delegate<S: ApprovalStore>(
    approvals: &Approvals<S>,
    caller: &Principal,
    r: pb::DelegateRequest,
) -> Result<pb::DelegateResponse> {
    require(caller, DECIDERS, "delegate approvals")?;
    let from = match r.from.is_empty() {
        true => caller.name.clone(),
        false => required(&r.from, "from")?.to_string(),
    };
    if from != caller.name && !caller.has(Role::Operator) {
        return Err(Error::RoleRequired {
            principal: caller.name.clone(),
            action: "delegate another principal's seat",
            roles: "operator".into(),
        });
    }
    let to = required(&r.to, "to")?.to_string();
    let now = approvals.store().now_ms();
    let starts_ms = r.starts.as_ref().map_or(now, from_timestamp);
    let ends_ms = r
        .ends
        .as_ref()
        .map(from_timestamp)
        .ok_or_else(|| Error::invalid("ends", "required: when the delegation ends"))?;
    if ends_ms <= now {
        return Err(Error::invalid("ends", "must be in the future"));
    }
    if r.scope.len() > 256 {
        return Err(Error::invalid("scope", "at most 256 bytes"));
    }
    let d = approvals
        .delegate(Delegation {
            id: String::new(),
            from,
            to,
            starts_ms,
            ends_ms,
            scope: r.scope,
            created_by: caller.name.clone(),
            created_at_ms: now,
        })
        .await?;
    Ok(pb::DelegateResponse {
        delegation: Some(to_pb(&d)),
    })
}

pub async fn revoke<S: ApprovalStore>(
    approvals: &Approvals<S>,
    caller: &Principal,
    r: pb::RevokeDelegationRequest,
) -> Result<pb::RevokeDelegationResponse> {
    require(caller, DECIDERS, "revoke delegations")?;
    let id = required(&r.id, "id")?;
    approvals.revoke_delegation(id, caller).await?;
    Ok(pb::RevokeDelegationResponse {})
}

pub async fn list<S: ApprovalStore>(
    approvals: &Approvals<S>,
    caller: &Principal,
    r: pb::ListDelegationsRequest,
) -> Result<pb::ListDelegationsResponse> {
    require(caller, READERS, "list delegations")?;
    let all = caller.reads_all() || caller.has(Role::Operator);
    let who = match (r.principal.is_empty(), all) {
        (true, true) => None,
        (true, false) => Some(caller.name.clone()),
        (false, _) => Some(required(&r.principal, "principal")?.to_string()),
    };
    if let Some(who) = &who
        && *who != caller.name
        && !all
    {
        return Err(Error::RoleRequired {
            principal: caller.name.clone(),
            action: "list another principal's delegations",
            roles: "operator, service, reader".into(),
        });
    }
    let delegations = approvals
        .delegations()
        .await?
        .iter()
        .filter(|d| who.as_ref().is_none_or(|w| d.from == *w || d.to == *w))
        .map(to_pb)
        .collect();
    Ok(pb::ListDelegationsResponse { delegations })
}

pub async fn claim<S: ApprovalStore>(
    approvals: &Approvals<S>,
    caller: &Principal,
    r: pb::ClaimRequest,
) -> Result<pb::ClaimResponse> {
    require(caller, DECIDERS, "claim approvals")?;
    let id = required(&r.request_id, "request_id")?;
    if r.release && r.ttl_ms > 0 {
        return Err(Error::invalid("ttl_ms", "a release takes no ttl"));
    }
    let a = approvals
        .claim(id, &caller.name, r.ttl_ms, r.release)
        .await?;
    Ok(pb::ClaimResponse {
        approval: Some((&a).into()),
    })
}

pub async fn reassign<S: ApprovalStore>(
    approvals: &Approvals<S>,
    caller: &Principal,
    r: pb::ReassignRequest,
) -> Result<pb::ReassignResponse> {
    require(caller, DECIDERS, "reassign approvals")?;
    let id = required(&r.request_id, "request_id")?;
    let to = required(&r.to, "to")?;
    let overrides = caller.has(Role::Operator);
    let a = approvals.reassign(id, &caller.name, to, overrides).await?;
    Ok(pb::ReassignResponse {
        approval: Some((&a).into()),
    })
}

pub async fn comment<S: ApprovalStore>(
    approvals: &Approvals<S>,
    caller: &Principal,
    r: pb::CommentRequest,
) -> Result<pb::CommentResponse> {
    require(caller, DECIDERS, "comment on approvals")?;
    let id = required(&r.request_id, "request_id")?;
    if r.text.trim().is_empty() {
        return Err(Error::invalid("text", "required"));
    }
    if r.text.len() > MAX_COMMENT_BYTES {
        return Err(Error::invalid(
            "text",
            format!("at most {MAX_COMMENT_BYTES} bytes"),
        ));
    }
    crate::convert::no_nul(&r.text, "text")?;
    let a = approvals.comment(id, &caller.name, &r.text).await?;
    Ok(pb::CommentResponse {
        approval: Some((&a).into()),
    })
}
