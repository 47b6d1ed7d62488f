//! `arbor.approval.v1.ApprovalService`: thin handlers that check the caller, convert the wire
//! request, call `Approvals` / the store, and convert back.

mod decision;
mod govern;
mod watch;

use arbor_shared::{
    auth::{Principal, Role, principal_of},
    proto::approval::v1::{self as pb, approval_service_server::ApprovalService},
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use crate::{
    approvals::Approvals,
    convert::filter_from_pb,
    error::{Error, Result},
    lifecycle::ApprovalState,
    model::{Actionable, AuditQuery, Filter, NewDecision},
    store::ApprovalStore,
};

/// Who reads approvals, their audit and their changes (docs/auth.md). Any approver may decide
/// any approval but those of its own runs, and may see those too, so approvers read them all;
/// submitters follow their runs (suspensions included) on the runner instead.
pub const READERS: &[Role] = &[Role::Approver, Role::Operator, Role::Service, Role::Reader];
pub const DECIDERS: &[Role] = &[Role::Approver, Role::Operator];

/// The most ids one bulk decision names or selects: a page's worth.
pub const MAX_PAGE_SIZE: usize = arbor_shared::page::MAX_SIZE;

pub struct ApprovalApi<S> {
    approvals: Approvals<S>,
    auth_enabled: bool,
    shutdown: CancellationToken,
}

impl<S: ApprovalStore> ApprovalApi<S> {
    pub fn new(approvals: Approvals<S>, auth_enabled: bool, shutdown: CancellationToken) -> Self {
        Self {
            approvals,
            auth_enabled,
            shutdown,
        }
    }

    fn store(&self) -> &S {
        self.approvals.store()
    }

    /// How many approvals `ListApprovals` would list for `caller` under `f`, counted no further
    /// than `limit`: the same role check and filter, without building the records (the web
    /// inbox's queue counts).
    pub async fn count_approvals(
        &self,
        caller: &Principal,
        f: &pb::ApprovalFilter,
        limit: usize,
    ) -> Result<usize> {
        require(caller, READERS, "list approvals")?;
        let filter = self.filter(Some(f), caller).await?;
        self.store().count(&filter, limit, self.store().now_ms())
    }

    /// A wire filter as this caller means it: "actionable" is what they may vote on now (their
    /// delegations read once, here), a group is its members now.
    async fn filter(&self, f: Option<&pb::ApprovalFilter>, caller: &Principal) -> Result<Filter> {
        let mut filter = filter_from_pb(f, "filter")?;
        let Some(f) = f else {
            return Ok(filter);
        };
        if f.actionable {
            filter.actionable_by = Some(Actionable {
                name: caller.name.clone(),
                delegations: self.approvals.delegations().await?,
                not_submitter: self.auth_enabled,
            });
        }
        if !f.group.is_empty() {
            required(&f.group, "filter.group")?;
            filter.eligible_any = Some(self.approvals.directory().members(&f.group));
        }
        Ok(filter)
    }

    /// New decisions are refused once draining has begun, so none is taken that delivery will
    /// not get to send before the process exits (it would be sent after the restart anyway).
    fn open_for_writes(&self) -> Result<()> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }
}

/// Whether `p` holds a role that decides approvals (what else it may decide is the store's
/// rule: see [`crate::voting::may_decide`]).
pub fn may_decide_any(p: &Principal) -> bool {
    p.has_any(DECIDERS)
}

/// PERMISSION_DENIED unless `p` holds one of `roles`: the role check of every handler, and of the web
/// inbox's pages.
pub fn require(p: &Principal, roles: &[Role], action: &'static str) -> Result<()> {
    if p.has_any(roles) {
        return Ok(());
    }
    let names: Vec<String> = roles
        .iter()
        .map(|r| format!("{r:?}").to_lowercase())
        .collect();
    Err(Error::RoleRequired {
        principal: p.name.clone(),
        action,
        roles: names.join(", "),
    })
}

fn token(t: &str) -> Option<&str> {
    (!t.is_empty()).then_some(t)
}

/// Longest id accepted; the runner's ids are far shorter, and a huge key helps nobody.
const MAX_ID_BYTES: usize = 256;

fn required<'a>(value: &'a str, field: &str) -> Result<&'a str> {
    if value.is_empty() {
        return Err(Error::invalid(field, "required"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(Error::invalid(
            field,
            format!("at most {MAX_ID_BYTES} bytes"),
        ));
    }
    crate::convert::no_nul(value, field)?;
    Ok(value)
}

#[tonic::async_trait]
impl<S: ApprovalStore> ApprovalService for ApprovalApi<S> {
    async fn list_approvals(
        &self,
        req: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let caller = principal_of(&req);
        require(&caller, READERS, "list approvals")?;
        let r = req.into_inner();
        let filter = self.filter(r.filter.as_ref(), &caller).await?;
        let page = self.store().list(
            &filter,
            arbor_shared::page::size(r.page_size),
            token(&r.page_token),
            self.store().now_ms(),
        )?;
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: page.items.iter().map(Into::into).collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }

    async fn get_approval(
        &self,
        req: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::GetApprovalResponse>, Status> {
        require(&principal_of(&req), READERS, "read approvals")?;
        let id = required(&req.get_ref().request_id, "request_id")?;
        let approval = self
            .store()
            .get(id)?
            .ok_or_else(|| Error::NotFound(id.to_string()))?;
        Ok(Response::new(pb::GetApprovalResponse {
            approval: Some((&approval).into()),
        }))
    }

    async fn resolve(
        &self,
        req: Request<pb::ResolveRequest>,
    ) -> Result<Response<pb::ResolveResponse>, Status> {
        let principal = principal_of(&req);
        require(&principal, DECIDERS, "decide approvals")?;
        self.open_for_writes()?;
        let r = req.into_inner();
        let id = required(&r.request_id, "request_id")?;
        let decision = decision::from_wire(
            r.decision,
            &r.reason,
            r.args.as_ref(),
            r.result.as_ref(),
            &principal,
        )?;
        let decision = NewDecision {
            expected_digest: r.expected_digest.clone(),
            ..decision
        };
        let resolved = self
            .approvals
            .decide_as(&principal, self.auth_enabled, id, decision)
            .instrument(crate::approvals::span_to_trace(id))
            .await?;
        Ok(Response::new(pb::ResolveResponse {
            approval: Some((&resolved.approval).into()),
            duplicate: resolved.duplicate,
        }))
    }

    async fn bulk_resolve(
        &self,
        req: Request<pb::BulkResolveRequest>,
    ) -> Result<Response<pb::BulkResolveResponse>, Status> {
        let principal = principal_of(&req);
        require(&principal, DECIDERS, "decide approvals")?;
        self.open_for_writes()?;
        let r = req.into_inner();
        let decision = decision::from_wire(
            r.decision,
            &r.reason,
            r.args.as_ref(),
            r.result.as_ref(),
            &principal,
        )?;
        let ids = decision::bulk_targets(self.store(), &r)?;
        // Asked for together, the decisions are taken together (one transaction where the
        // store has them), each with its own outcome.
        let outcomes = futures_util::future::join_all(ids.iter().map(|id| {
            let decision = NewDecision {
                expected_digest: r.expected_digests.get(id).cloned().unwrap_or_default(),
                ..decision.clone()
            };
            self.approvals
                .decide_as(&principal, self.auth_enabled, id, decision)
                .instrument(crate::approvals::span_to_trace(id))
        }))
        .await;
        let mut items = Vec::with_capacity(ids.len());
        for (id, outcome) in ids.into_iter().zip(outcomes) {
            items.push(match outcome {
                Ok(resolved) => pb::BulkResolveItem {
                    request_id: id,
                    code: 0,
                    message: if resolved.duplicate {
                        "duplicate".into()
                    } else {
                        String::new()
                    },
                    approval: Some((&resolved.approval).into()),
                },
                Err(e @ Error::Storage(_)) => return Err(e.into()),
                Err(e) => pb::BulkResolveItem {
                    approval: self.store().get(&id)?.as_ref().map(Into::into),
                    request_id: id,
                    code: e.code() as i32,
                    message: e.to_string(),
                },
            });
        }
        Ok(Response::new(pb::BulkResolveResponse { items }))
    }

    type WatchApprovalsStream = ReceiverStream<Result<pb::WatchApprovalsResponse, Status>>;

    async fn watch_approvals(
        &self,
        req: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let caller = principal_of(&req);
        require(&caller, READERS, "watch approvals")?;
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }
        let filter = self.filter(req.get_ref().filter.as_ref(), &caller).await?;
        Ok(Response::new(watch::start(
            self.approvals.clone(),
            filter,
            self.shutdown.clone(),
        )))
    }

    async fn get_audit_log(
        &self,
        req: Request<pb::GetAuditLogRequest>,
    ) -> Result<Response<pb::GetAuditLogResponse>, Status> {
        require(&principal_of(&req), READERS, "read the audit log")?;
        let r = req.into_inner();
        let query = match (r.request_id.is_empty(), r.run_id.is_empty()) {
            (false, true) => {
                required(&r.request_id, "request_id")?;
                if self.store().get(&r.request_id)?.is_none() {
                    return Err(Error::NotFound(r.request_id).into());
                }
                AuditQuery::Request(r.request_id)
            }
            (true, false) => {
                required(&r.run_id, "run_id")?;
                AuditQuery::Run(r.run_id)
            }
            _ => {
                return Err(Error::invalid(
                    "request_id",
                    "give exactly one of request_id or run_id",
                )
                .into());
            }
        };
        let page = self.store().audit(
            &query,
            arbor_shared::page::size(r.page_size),
            token(&r.page_token),
        )?;
        Ok(Response::new(pb::GetAuditLogResponse {
            entries: page.items.iter().map(Into::into).collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }

    async fn get_leader(
        &self,
        req: Request<pb::GetLeaderRequest>,
    ) -> Result<Response<pb::GetLeaderResponse>, Status> {
        require(&principal_of(&req), READERS, "ask which replica leads")?;
        let replica = self.approvals.replica();
        // This replica knows best whether it leads; another one's name is in the store.
        let leading = replica.is_leading();
        let leader = match leading {
            true => replica.name().to_string(),
            false => self.store().leader().await?.unwrap_or_default(),
        };
        Ok(Response::new(pb::GetLeaderResponse {
            replica: replica.name().to_string(),
            leading,
            leader,
        }))
    }
    async fn delegate(
        &self,
        req: Request<pb::DelegateRequest>,
    ) -> Result<Response<pb::DelegateResponse>, Status> {
        let caller = principal_of(&req);
        self.open_for_writes()?;
        Ok(Response::new(
            govern::delegate(&self.approvals, &caller, req.into_inner()).await?,
        ))
    }

    async fn revoke_delegation(
        &self,
        req: Request<pb::RevokeDelegationRequest>,
    ) -> Result<Response<pb::RevokeDelegationResponse>, Status> {
        let caller = principal_of(&req);
        self.open_for_writes()?;
        Ok(Response::new(
            govern::revoke(&self.approvals, &caller, req.into_inner()).await?,
        ))
    }

    async fn list_delegations(
        &self,
        req: Request<pb::ListDelegationsRequest>,
    ) -> Result<Response<pb::ListDelegationsResponse>, Status> {
        let caller = principal_of(&req);
        Ok(Response::new(
            govern::list(&self.approvals, &caller, req.into_inner()).await?,
        ))
    }

    async fn claim(
        &self,
        req: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimResponse>, Status> {
        let caller = principal_of(&req);
        self.open_for_writes()?;
        Ok(Response::new(
            govern::claim(&self.approvals, &caller, req.into_inner()).await?,
        ))
    }

    async fn reassign(
        &self,
        req: Request<pb::ReassignRequest>,
    ) -> Result<Response<pb::ReassignResponse>, Status> {
        let caller = principal_of(&req);
        self.open_for_writes()?;
        Ok(Response::new(
            govern::reassign(&self.approvals, &caller, req.into_inner()).await?,
        ))
    }

    async fn comment(
        &self,
        req: Request<pb::CommentRequest>,
    ) -> Result<Response<pb::CommentResponse>, Status> {
        let caller = principal_of(&req);
        self.open_for_writes()?;
        Ok(Response::new(
            govern::comment(&self.approvals, &caller, req.into_inner()).await?,
        ))
    }
}

/// The states a bulk decision by filter covers: only what can still be decided.
const BULK_STATES: [ApprovalState; 1] = [ApprovalState::Pending];
