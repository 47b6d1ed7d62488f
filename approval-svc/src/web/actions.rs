//! An item's actions: decide (approve, reject, edit against the schema, respond), claim,
//! comment and delegate, each one call of the same `ApprovalService` handler the gRPC API runs,
//! then a redirect back to the item (or the item saying why not).

use arbor_shared::{
    json::to_proto_value,
    proto::{
        approval::v1 as pb, approval::v1::approval_service_server::ApprovalService,
        runner::v1::DecisionKind as PbKind,
    },
    time::timestamp,
};
use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use serde_json::Value as Json;

use super::{
    Shared, Web, forms,
    item::{args_schema, current_args},
    page,
    session::{Person, post_of},
};
use crate::store::ApprovalStore;

/// How long a claim from the inbox holds.
const CLAIM_MS: u64 = 30 * 60 * 1000;

fn status_of(s: &tonic::Status) -> StatusCode {
    match s.code() {
        tonic::Code::PermissionDenied | tonic::Code::Unauthenticated => StatusCode::FORBIDDEN,
        tonic::Code::FailedPrecondition | tonic::Code::Aborted => StatusCode::CONFLICT,
        tonic::Code::InvalidArgument => StatusCode::UNPROCESSABLE_ENTITY,
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// Approve, reject, edit or respond, bound to the digest the page showed (`digest`).
pub async fn decide<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (p, f) = match post_of(&w, &headers, &body) {
        Ok(x) => x,
        Err(res) => return res,
    };
    let decision = f.text("decision");
    let mut req = pb::ResolveRequest {
        request_id: id.clone(),
        reason: f.text("reason"),
        expected_digest: f.text("digest"),
        ..Default::default()
    };
    req.decision = match decision.as_str() {
        "approve" => PbKind::Approve,
        "reject" => PbKind::Reject,
        "edit" => PbKind::Edit,
        "respond" => PbKind::Respond,
        _ => return page::error(StatusCode::BAD_REQUEST, "Choose a decision."),
    } as i32;
    if decision == "edit" {
        let a = match w.read(&p.principal, &id) {
            Ok(a) => a,
            Err(res) => return res,
        };
        let (args, _) = current_args(&a);
        match forms::read_object(&args_schema(&a), &args, &f) {
            Ok(edited) => req.args = Some(to_proto_value(&edited)),
            Err(fields) => {
                let msg = "Some arguments do not fit the tool's schema; see each field.";
                return w.edit_page(&p, &a, fields, None, msg.into()).await;
            }
        }
    }
    if decision == "respond" {
        match serde_json::from_str::<Json>(&f.text("result")) {
            Ok(v) => req.result = Some(to_proto_value(&v)),
            Err(e) => {
                let msg = format!("The result must be JSON: {e}.");
                return w
                    .item_page(
                        &p,
                        &id,
                        StatusCode::UNPROCESSABLE_ENTITY,
                        msg,
                        String::new(),
                        vec![],
                    )
                    .await;
            }
        }
    }
    match w.api.resolve(Web::<S>::as_person(&p.principal, req)).await {
        Ok(_) => {
            w.flash(&p, format!("Your decision ({decision}) was recorded."));
            Redirect::to(&format!("/items/{id}")).into_response()
        }
        Err(s) => {
            let stale = s.message().contains("what is voted on changed");
            let (message, diff) = match stale {
                true => {
                    let shown = serde_json::from_str(&f.text("shown")).unwrap_or(Json::Null);
                    let now = w
                        .approvals
                        .store()
                        .get(&id)
                        .ok()
                        .flatten()
                        .map(|a| current_args(&a).0)
                        .unwrap_or(Json::Null);
                    (
                        "Refused: what you decided on changed since the page showed it. Read \
                         the item again below; the table shows what changed."
                            .to_string(),
                        page::diff(&shown, &now),
                    )
                }
                false => (format!("Refused: {}", s.message()), Vec::new()),
            };
            w.item_page(&p, &id, status_of(&s), message, String::new(), diff)
                .await
        }
    }
}

/// The outcome of a state-keeping action: back to the item, or the item saying why not.
async fn after<S: ApprovalStore>(
    w: &Web<S>,
    p: &Person,
    id: &str,
    done: &str,
    r: Result<(), tonic::Status>,
) -> Response {
    match r {
        Ok(()) => {
            w.flash(p, done);
            Redirect::to(&format!("/items/{id}")).into_response()
        }
        Err(s) => {
            let message = format!("Refused: {}", s.message());
            w.item_page(p, id, status_of(&s), message, String::new(), Vec::new())
                .await
        }
    }
}

pub async fn claim<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (p, f) = match post_of(&w, &headers, &body) {
        Ok(x) => x,
        Err(res) => return res,
    };
    let release = f.get("release").is_some();
    let req = pb::ClaimRequest {
        request_id: id.clone(),
        ttl_ms: if release { 0 } else { CLAIM_MS },
        release,
    };
    let r = w.api.claim(Web::<S>::as_person(&p.principal, req)).await;
    let done = if release { "Released." } else { "Claimed." };
    after(&w, &p, &id, done, r.map(|_| ())).await
}

pub async fn comment<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (p, f) = match post_of(&w, &headers, &body) {
        Ok(x) => x,
        Err(res) => return res,
    };
    let req = pb::CommentRequest {
        request_id: id.clone(),
        text: f.text("text"),
    };
    let r = w.api.comment(Web::<S>::as_person(&p.principal, req)).await;
    after(&w, &p, &id, "Your comment was added.", r.map(|_| ())).await
}

pub async fn delegate<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let (p, f) = match post_of(&w, &headers, &body) {
        Ok(x) => x,
        Err(res) => return res,
    };
    let hours: u64 = f.text("hours").trim().parse().unwrap_or(0);
    if hours == 0 {
        let r = Err(tonic::Status::invalid_argument(
            "hours: a whole number, at least 1",
        ));
        return after(&w, &p, &id, "", r).await;
    }
    let now = w.approvals.store().now_ms();
    let req = pb::DelegateRequest {
        to: f.text("to").trim().to_string(),
        ends: Some(timestamp(
            now.saturating_add(hours.saturating_mul(3_600_000)),
        )),
        ..Default::default()
    };
    let r = w.api.delegate(Web::<S>::as_person(&p.principal, req)).await;
    after(&w, &p, &id, "Your seat is delegated.", r.map(|_| ())).await
}
