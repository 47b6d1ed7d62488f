//! One item: what is asked, why it is (or is not) the person's to decide, quorum and votes,
//! the deadline, comments, the audit and the run; and its actions (decide, edit, claim,
//! comment, delegate), each one call of the same `ApprovalService` handler the gRPC API runs.

use arbor_shared::{
    auth::Principal,
    domain::{ApprovalKind, DecisionKind},
    proto::{
        approval::v1 as pb, approval::v1::approval_service_server::ApprovalService,
        runner::v1::DecisionKind as PbKind,
    },
    time::from_timestamp,
};
use askama::Template;
use axum::{
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use serde_json::Value as Json;

use super::{
    Shared, Web, forms,
    page::{self, Chrome, DiffRow, Pair},
    queue::state_name,
    run::{self, TreeRow},
    session::Person,
};
use crate::{model::Approval, store::ApprovalStore};

pub struct VoteRow {
    pub who: String,
    pub kind: String,
    pub digest: String,
    pub stale: bool,
    pub reason: String,
}

pub struct LiveItem {
    pub id: String,
    pub digest: String,
    pub state: String,
    pub state_class: String,
    pub decided: String,
    pub progress: String,
    pub stage: String,
    pub votes: Vec<VoteRow>,
    pub seats_left: String,
    pub deadline_iso: String,
    pub deadline_text: String,
    pub on_deadline: String,
    pub claim: String,
}

pub struct CommentRow {
    pub author: String,
    pub text: String,
    pub at: String,
}

pub struct AuditRow {
    pub at: String,
    pub action: String,
    pub actor: String,
    pub detail: String,
}

#[derive(Template)]
#[template(path = "item.html")]
struct ItemPage {
    chrome: Chrome,
    csrf: String,
    id: String,
    title: String,
    kind: String,
    tool: String,
    node: String,
    run_id: String,
    tree_id: String,
    submitted_by: String,
    args: Vec<Pair>,
    edited: bool,
    /// An approver's edit against the arguments the run asked with.
    edit_diff: Vec<DiffRow>,
    shown: String,
    digest: String,
    context: Vec<Pair>,
    why_mine: String,
    why_not: String,
    may_decide: bool,
    pending: bool,
    allows_approve: bool,
    allows_reject: bool,
    allows_edit: bool,
    allows_respond: bool,
    claimed_by_me: bool,
    comments: Vec<CommentRow>,
    audit: Vec<AuditRow>,
    tree: Vec<TreeRow>,
    blackboard: Vec<Pair>,
    run_note: String,
    live: LiveItem,
    message: String,
    notice: String,
    diff: Vec<DiffRow>,
}

#[derive(Template)]
#[template(path = "item_live.html")]
struct LiveFragment {
    live: LiveItem,
}

#[derive(Template)]
#[template(path = "edit.html")]
struct EditPage {
    chrome: Chrome,
    csrf: String,
    id: String,
    title: String,
    digest: String,
    fields: Vec<forms::Field>,
    diff: Vec<DiffRow>,
    message: String,
}

/// What the item's decision binds to now: an approver's proposed edit or response, else the
/// request's arguments (a gate: its context).
pub(super) fn current_args(a: &Approval) -> (Json, bool) {
    if let Some(g) = &a.ext.governance
        && g.proposal.kind != DecisionKind::Approve
    {
        return (g.proposal.payload.clone(), true);
    }
    match a.kind() {
        Some(ApprovalKind::Node) => (Json::Object(a.request.context.clone()), false),
        _ => (a.request.tool_args.clone(), false),
    }
}

fn title_of(a: &Approval) -> String {
    match a.request.title.is_empty() {
        true => format!("{} at {}", a.request.tool_name, a.request.node_name),
        false => a.request.title.clone(),
    }
}

/// The schema the arguments are edited against: the request's `args_schema` context entry,
/// else one inferred from the arguments as they are.
pub(super) fn args_schema(a: &Approval) -> Json {
    match a.request.context.get("args_schema") {
        Some(s @ (Json::Object(_) | Json::Bool(_))) => s.clone(),
        _ => forms::inferred(&a.request.tool_args),
    }
}

/// A refusal as a person reads it: why they cannot decide.
fn sentence(e: &crate::error::Error) -> String {
    use crate::error::Error as E;
    match e {
        E::OwnRun { .. } => "You submitted this run; someone else must decide it.".into(),
        E::AlreadyDecided { existing, .. } => format!("It is decided already ({existing})."),
        E::Claimed { holder, .. } => format!("{holder} has claimed it; they decide it for now."),
        E::NotEligible {
            stage, eligible, ..
        } => format!(
            "You are not eligible in stage {stage}, and nobody eligible delegated to you \
             (eligible: {eligible})."
        ),
        other => other.to_string(),
    }
}

fn live_of(a: &pb::Approval, now_ms: u64, me: &str) -> LiveItem {
    let (state, state_class) = state_name(a.state);
    let g = a.governance.clone().unwrap_or_default();
    let deadline = a.next_deadline.as_ref().map(from_timestamp).unwrap_or(0);
    LiveItem {
        id: a.request_id.clone(),
        digest: a.args_digest.clone(),
        state,
        state_class,
        decided: a
            .decision
            .as_ref()
            .map(|d| {
                let kind = PbKind::try_from(d.kind)
                    .map(|k| {
                        k.as_str_name()
                            .trim_start_matches("DECISION_KIND_")
                            .to_lowercase()
                    })
                    .unwrap_or_default();
                format!("{kind} by {}", d.decided_by)
            })
            .unwrap_or_default(),
        progress: g.progress.clone(),
        // "1 of 2 in payments" names the stage already.
        stage: g
            .stages
            .get(g.stage as usize)
            .filter(|s| !g.progress.ends_with(&format!(" in {s}")))
            .cloned()
            .unwrap_or_default(),
        votes: g
            .votes
            .iter()
            .map(|v| VoteRow {
                who: match v.delegate.is_empty() {
                    true => v.principal.clone(),
                    false => format!("{} (by {})", v.principal, v.delegate),
                },
                kind: PbKind::try_from(v.kind)
                    .map(|k| {
                        k.as_str_name()
                            .trim_start_matches("DECISION_KIND_")
                            .to_lowercase()
                    })
                    .unwrap_or_default(),
                digest: v.args_digest.chars().take(19).collect(),
                stale: v.stale,
                reason: v.reason.clone(),
            })
            .collect(),
        seats_left: g.seats_left.join(", "),
        deadline_iso: page::iso(deadline),
        deadline_text: match deadline {
            0 => String::new(),
            d => page::until(d, now_ms),
        },
        on_deadline: a.on_deadline.clone(),
        claim: match &a.claim {
            Some(c) if c.principal == me => "You hold it (claimed).".into(),
            Some(c) => format!("Claimed by {}.", c.principal),
            None => String::new(),
        },
    }
}

impl<S: ApprovalStore> Web<S> {
    /// The item as `p` may read it: the same role check as GetApproval, then the record.
    pub(super) fn read(&self, p: &Principal, id: &str) -> Result<Approval, Response> {
        crate::grpc::require(p, crate::grpc::READERS, "read approvals")
            .map_err(|e| page::error(StatusCode::FORBIDDEN, &e.to_string()))?;
        match self.approvals.store().get(id) {
            Ok(Some(a)) => Ok(a),
            Ok(None) => Err(page::error(StatusCode::NOT_FOUND, "There is no such item.")),
            Err(e) => Err(page::error(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())),
        }
    }

    /// Whether `p` may decide `a` now, and if not why: the role, then the store's own rule.
    async fn why_not(&self, p: &Principal, a: &Approval) -> Option<String> {
        if let Err(e) = crate::grpc::require(p, crate::grpc::DECIDERS, "decide approvals") {
            return Some(format!("You may read this but not decide it: {e}."));
        }
        let delegations = self.approvals.delegations().await.unwrap_or_default();
        let now = self.approvals.store().now_ms();
        let auth = self.auth.is_enabled();
        crate::voting::may_decide(a, &p.name, auth, &delegations, now)
            .err()
            .map(|e| sentence(&e))
    }

    async fn why_mine(&self, p: &Principal, a: &Approval) -> String {
        let Some(g) = &a.ext.governance else {
            return "No approval rule governs this request: any approver may decide it.".into();
        };
        let delegations = self.approvals.delegations().await.unwrap_or_default();
        let now = self.approvals.store().now_ms();
        let names = [a.request.tool_name.as_str(), a.request.node_name.as_str()];
        let stage = &g.stage().name;
        match crate::governance::seat::seat_for(g, &p.name, &delegations, now, &names) {
            Some(seat) if seat != p.name => format!(
                "{seat} delegated their seat to you; you vote for them in stage {stage} of rule {}.",
                g.rule
            ),
            _ => format!("You are eligible in stage {stage} of rule {}.", g.rule),
        }
    }

    pub(super) async fn item_page(
        &self,
        p: &Person,
        id: &str,
        status: StatusCode,
        message: String,
        notice: String,
        diff: Vec<DiffRow>,
    ) -> Response {
        let a = match self.read(&p.principal, id) {
            Ok(a) => a,
            Err(res) => return res,
        };
        let now = self.approvals.store().now_ms();
        let pba = pb::Approval::from(&a);
        let (args, edited) = current_args(&a);
        let why_not = self.why_not(&p.principal, &a).await.unwrap_or_default();
        let audit = self
            .api
            .get_audit_log(Self::as_person(
                &p.principal,
                pb::GetAuditLogRequest {
                    request_id: id.to_string(),
                    page_size: 100,
                    ..Default::default()
                },
            ))
            .await
            .map(|r| r.into_inner().entries)
            .unwrap_or_default();
        let run = run::run_view(
            self,
            p,
            &a.request.run_id,
            (&a.request.node_locator, &a.request.node_name),
        )
        .await;
        let view = ItemPage {
            chrome: Chrome::new(title_of(&a), Some(p)),
            csrf: p.csrf.clone(),
            id: id.to_string(),
            title: title_of(&a),
            kind: match a.kind() {
                Some(ApprovalKind::Node) => "A gate".into(),
                Some(ApprovalKind::Tool) => "A tool call".into(),
                None => "An unknown kind of request".into(),
            },
            tool: a.request.tool_name.clone(),
            node: a.request.node_name.clone(),
            run_id: a.request.run_id.clone(),
            tree_id: a.request.tree_id.clone(),
            submitted_by: a.request.submitted_by.clone(),
            args: match a.kind() {
                Some(ApprovalKind::Node) if !edited => Vec::new(),
                _ => page::pairs(&args),
            },
            edit_diff: match edited {
                true => page::diff(&a.request.tool_args, &args),
                false => Vec::new(),
            },
            edited,
            shown: args.to_string(),
            digest: a.args_digest(),
            context: page::pairs(&Json::Object(a.request.context.clone())),
            why_mine: self.why_mine(&p.principal, &a).await,
            may_decide: why_not.is_empty(),
            why_not,
            pending: a.state == crate::lifecycle::ApprovalState::Pending,
            allows_approve: a.allows(DecisionKind::Approve),
            allows_reject: a.allows(DecisionKind::Reject),
            allows_edit: a.allows(DecisionKind::Edit) && a.kind() == Some(ApprovalKind::Tool),
            allows_respond: a.allows(DecisionKind::Respond),
            claimed_by_me: a.claim_at(now).is_some_and(|c| c.by == p.name()),
            comments: a
                .ext
                .comments
                .iter()
                .map(|c| CommentRow {
                    author: c.author.clone(),
                    text: c.text.clone(),
                    at: page::iso(c.at_ms),
                })
                .collect(),
            audit: audit
                .iter()
                .map(|e| AuditRow {
                    at: page::iso(e.time.as_ref().map(from_timestamp).unwrap_or(0)),
                    action: pb::AuditAction::try_from(e.action)
                        .map(|x| {
                            x.as_str_name()
                                .trim_start_matches("AUDIT_ACTION_")
                                .to_lowercase()
                        })
                        .unwrap_or_default(),
                    actor: match e.on_behalf_of.is_empty() {
                        true => e.actor.clone(),
                        false => format!("{} for {}", e.actor, e.on_behalf_of),
                    },
                    detail: e.reason.clone(),
                })
                .collect(),
            tree: run.tree,
            blackboard: run.blackboard,
            run_note: run.note,
            live: live_of(&pba, now, p.name()),
            message,
            notice,
            diff,
        };
        page::render(status, &view)
    }

    pub(super) async fn edit_page(
        &self,
        p: &Person,
        a: &Approval,
        fields: Vec<forms::Field>,
        edited: Option<&Json>,
        message: String,
    ) -> Response {
        let view = EditPage {
            chrome: Chrome::new(format!("Edit {}", title_of(a)), Some(p)),
            csrf: p.csrf.clone(),
            id: a.id().to_string(),
            title: title_of(a),
            digest: a.args_digest(),
            diff: edited
                .map(|e| page::diff(&a.request.tool_args, e))
                .unwrap_or_default(),
            fields,
            message: message.clone(),
        };
        let status = match message.is_empty() {
            true => StatusCode::OK,
            false => StatusCode::UNPROCESSABLE_ENTITY,
        };
        page::render(status, &view)
    }
}

pub async fn page<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(p) = w.person(&headers) else {
        return Redirect::to("/sign-in").into_response();
    };
    let notice = w.take_flash(&p);
    w.item_page(&p, &id, StatusCode::OK, String::new(), notice, Vec::new())
        .await
}

pub async fn live_fragment<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(p) = w.person(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let a = match w.read(&p.principal, &id) {
        Ok(a) => a,
        Err(res) => return res,
    };
    let now = w.approvals.store().now_ms();
    let live = live_of(&pb::Approval::from(&a), now, p.name());
    page::render(StatusCode::OK, &LiveFragment { live })
}

pub async fn edit_page<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let Some(p) = w.person(&headers) else {
        return Redirect::to("/sign-in").into_response();
    };
    let a = match w.read(&p.principal, &id) {
        Ok(a) => a,
        Err(res) => return res,
    };
    let (args, _) = current_args(&a);
    let fields = forms::object_fields(&args_schema(&a), &args);
    w.edit_page(&p, &a, fields, None, String::new()).await
}
