//! What runs wait for besides approvals: user-input questions and external results, read from
//! the runner with the signed-in person's own token (so the runner's rule on who may answer
//! applies), each answered through a form generated from its schema.

use arbor_shared::{
    json::{from_optional_value, to_proto_value},
    proto::runner::v1::{
        self as rpb, ResolveAction, RunStatus, SuspensionCategory, SuspensionState,
        runner_service_client::RunnerServiceClient,
    },
};
use askama::Template;
use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use serde_json::{Value as Json, json};

use super::{
    Shared, Web, forms,
    page::{self, Chrome},
    session::{Person, post_of},
};
use crate::store::ApprovalStore;

/// How long one call to the runner for a page may take.
const RUNNER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct QuestionRow {
    pub run_id: String,
    pub request_id: String,
    pub kind: String,
    pub prompt: String,
    pub href: String,
}

#[derive(Template)]
#[template(path = "question.html")]
struct QuestionPage {
    chrome: Chrome,
    csrf: String,
    run_id: String,
    request_id: String,
    kind: String,
    prompt: String,
    node: String,
    answerers: String,
    fields: Vec<forms::Field>,
    read_only: String,
    message: String,
    notice: String,
}

const READ_ONLY: &str = "You signed in through the proxy in front of the inbox, so the inbox \
    holds no token of yours to answer the runner with: questions are shown here, and answered \
    with your own token (`runner-svc resolve`).";

impl<S: ApprovalStore> Web<S> {
    /// The token the runner is asked with for `p`: theirs, or (signed in through a proxy) the
    /// service's, to read only.
    pub(super) fn runner_token(&self, p: &Person) -> Option<(String, bool)> {
        match (&p.token, &self.service_token) {
            (Some(t), _) => Some((t.clone(), false)),
            (None, Some(t)) => Some((t.clone(), true)),
            (None, None) => None,
        }
    }

    pub(super) fn runner_req<T>(token: &str, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Ok(v) = format!("Bearer {token}").parse() {
            r.metadata_mut().insert("authorization", v);
        }
        r.set_timeout(RUNNER_TIMEOUT);
        r
    }

    pub(super) fn runner_client(&self) -> RunnerServiceClient<tonic::transport::Channel> {
        RunnerServiceClient::new(self.runner.clone())
            .max_decoding_message_size(arbor_shared::server::MAX_RESPONSE_BYTES)
    }

    pub(super) async fn get_run(
        &self,
        p: &Person,
        run_id: &str,
    ) -> Result<(rpb::Run, bool), String> {
        let Some((token, read_only)) = self.runner_token(p) else {
            return Err("the inbox holds no token to ask the runner with".into());
        };
        let req = rpb::GetRunRequest {
            run_id: run_id.to_string(),
        };
        match self
            .runner_client()
            .get_run(Self::runner_req(&token, req))
            .await
        {
            Ok(r) => r
                .into_inner()
                .run
                .map(|r| (r, read_only))
                .ok_or_else(|| "the runner answered no run".into()),
            Err(s) => Err(s.message().to_string()),
        }
    }
}

/// Who a request names to answer it (`answerers` in its payload); empty: the run's submitter.
fn answerers_of(s: &rpb::Suspension) -> Vec<String> {
    from_optional_value(s.payload.as_ref())
        .get("answerers")
        .and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Json::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the runner will take `p`'s answer to `s`: the rule the runner applies on Resolve
/// (operators and services always; else those the node names, a `group:NAME` by membership;
/// a node that names no one, the run's submitter), used here only to show what to offer. The
/// runner checks it again when the answer arrives.
fn may_answer(p: &arbor_shared::auth::Principal, s: &rpb::Suspension, submitted_by: &str) -> bool {
    use arbor_shared::auth::Role;
    if p.has_any(&[Role::Service, Role::Operator]) {
        return true;
    }
    let names = answerers_of(s);
    if names.is_empty() {
        return p.name == submitted_by;
    }
    names.iter().any(|who| match who.strip_prefix("group:") {
        Some(g) => p.groups.iter().any(|mine| mine == g),
        None => *who == p.name,
    })
}

fn waits_for_a_person(s: &rpb::Suspension) -> bool {
    s.state == SuspensionState::Active as i32
        && (s.category == SuspensionCategory::RequireUserInput as i32
            || s.category == SuspensionCategory::RequireExternalExecution as i32)
}

fn kind_of(s: &rpb::Suspension) -> &'static str {
    match s.category == SuspensionCategory::RequireUserInput as i32 {
        true => "Question",
        false => "External result",
    }
}

fn prompt_of(s: &rpb::Suspension) -> String {
    let payload = from_optional_value(s.payload.as_ref());
    match payload.get("prompt").and_then(Json::as_str) {
        Some(p) => p.to_string(),
        None => s.message.clone(),
    }
}

/// The questions and external results waiting on suspended runs the person may read, and a
/// note when they cannot be read or only read.
pub async fn waiting<S: ApprovalStore>(w: &Web<S>, p: &Person) -> (Vec<QuestionRow>, String) {
    let Some((token, read_only)) = w.runner_token(p) else {
        let why = match p.token {
            None => READ_ONLY,
            Some(_) => "The inbox holds no token to ask the runner with.",
        };
        return (Vec::new(), why.into());
    };
    let req = rpb::ListRunsRequest {
        statuses: vec![RunStatus::Suspended as i32],
        page_size: 100,
        ..Default::default()
    };
    let runs = match w
        .runner_client()
        .list_runs(Web::<S>::runner_req(&token, req))
        .await
    {
        Ok(r) => r.into_inner().runs,
        Err(s) => {
            let why = format!("The runner's questions cannot be shown: {}", s.message());
            return match read_only {
                true => (Vec::new(), format!("{READ_ONLY} {why}")),
                false => (Vec::new(), why),
            };
        }
    };
    let mut rows = Vec::new();
    for run in &runs {
        let mine = |s: &&rpb::Suspension| may_answer(&p.principal, s, &run.submitted_by);
        for s in run
            .suspensions
            .iter()
            .filter(|s| waits_for_a_person(s))
            .filter(mine)
        {
            rows.push(QuestionRow {
                href: format!("/questions/{}/{}", run.run_id, s.request_id),
                run_id: run.run_id.clone(),
                request_id: s.request_id.clone(),
                kind: kind_of(s).into(),
                prompt: prompt_of(s),
            });
        }
    }
    let note = match read_only {
        true => READ_ONLY.to_string(),
        false => String::new(),
    };
    (rows, note)
}

/// The form of a suspension: an answer for a question, status and result for external work.
fn form_of(s: &rpb::Suspension) -> Vec<forms::Field> {
    let payload = from_optional_value(s.payload.as_ref());
    match s.category == SuspensionCategory::RequireUserInput as i32 {
        true => {
            let schema = payload.get("schema").cloned().unwrap_or(json!({}));
            let kind = payload
                .get("input_kind")
                .and_then(Json::as_str)
                .unwrap_or("text");
            let mut f = forms::value_field("Answer", &schema, kind, payload.get("default"));
            if let Some(Json::Array(options)) = payload.get("options") {
                let shown: Vec<String> = options.iter().map(page::show).collect();
                f.hint = format!("one of: {}", shown.join(", "));
            }
            vec![f]
        }
        false => {
            let schema = json!({"type": "object", "required": ["status"], "properties": {
                "status": {"type": "string", "enum": ["succeeded", "failed"],
                           "description": "succeeded or failed"},
                "result": {"description": "the result (JSON)"}
            }});
            forms::object_fields(&schema, &json!({"status": "succeeded"}))
        }
    }
}

async fn question_page<S: ApprovalStore>(
    w: &Web<S>,
    p: &Person,
    (run_id, request_id): (&str, &str),
    fields: Option<Vec<forms::Field>>,
    (status, message, notice): (StatusCode, String, String),
) -> Response {
    let (run, read_only) = match w.get_run(p, run_id).await {
        Ok(r) => r,
        Err(e) => return page::error(StatusCode::NOT_FOUND, &format!("No such run: {e}")),
    };
    let Some(s) = run.suspensions.iter().find(|s| s.request_id == request_id) else {
        let msg = "The run no longer waits for this (it was answered or withdrawn).";
        return page::error(StatusCode::NOT_FOUND, msg);
    };
    let mut answerers = answerers_of(s);
    if answerers.is_empty() {
        answerers.push(format!("the run's submitter ({})", run.submitted_by));
    }
    let read_only = match (read_only, may_answer(&p.principal, s, &run.submitted_by)) {
        (true, _) => READ_ONLY.to_string(),
        (false, true) => String::new(),
        (false, false) => format!(
            "You may not answer this: the run takes an answer from {} (and operators).",
            answerers.join(", ")
        ),
    };
    let view = QuestionPage {
        chrome: Chrome::new(prompt_of(s), Some(p)),
        csrf: p.csrf.clone(),
        run_id: run_id.to_string(),
        request_id: request_id.to_string(),
        kind: kind_of(s).into(),
        prompt: prompt_of(s),
        node: s.node_locator.clone(),
        answerers: answerers.join(", "),
        fields: fields.unwrap_or_else(|| form_of(s)),
        read_only,
        message,
        notice,
    };
    page::render(status, &view)
}

pub async fn page<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path((run_id, request_id)): Path<(String, String)>,
) -> Response {
    let Some(p) = w.person(&headers) else {
        return Redirect::to("/sign-in").into_response();
    };
    let ok = (StatusCode::OK, String::new(), String::new());
    question_page(&w, &p, (&run_id, &request_id), None, ok).await
}

/// Answers a question (or reports an external result) through the runner's Resolve, with the
/// person's own token.
pub async fn answer<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Path((run_id, request_id)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let (p, f) = match post_of(&w, &headers, &body) {
        Ok(x) => x,
        Err(res) => return res,
    };
    let ids = (run_id.as_str(), request_id.as_str());
    let Some(token) = p.token.clone() else {
        let refused = (StatusCode::FORBIDDEN, READ_ONLY.to_string(), String::new());
        return question_page(&w, &p, ids, None, refused).await;
    };
    let run = match w.get_run(&p, &run_id).await {
        Ok((r, _)) => r,
        Err(e) => return page::error(StatusCode::NOT_FOUND, &format!("No such run: {e}")),
    };
    let Some(s) = run.suspensions.iter().find(|s| s.request_id == request_id) else {
        return Redirect::to("/queue").into_response();
    };
    let payload = from_optional_value(s.payload.as_ref());
    let result = match s.category == SuspensionCategory::RequireUserInput as i32 {
        true => {
            let schema = payload.get("schema").cloned().unwrap_or(json!({}));
            let kind = payload
                .get("input_kind")
                .and_then(Json::as_str)
                .unwrap_or("text");
            forms::read_value(&schema, kind, &f).map(|v| json!({ "value": v }))
        }
        false => {
            let schema = json!({"type": "object", "required": ["status"], "properties": {
                "status": {"type": "string", "enum": ["succeeded", "failed"]},
                "result": {}
            }});
            forms::read_object(&schema, &json!({"status": "succeeded"}), &f)
        }
    };
    let result = match result {
        Ok(r) => r,
        Err(fields) => {
            let msg = "The answer does not fit what is asked; see the field.".to_string();
            let bad = (StatusCode::UNPROCESSABLE_ENTITY, msg, String::new());
            return question_page(&w, &p, ids, Some(fields), bad).await;
        }
    };
    let req = rpb::ResolveRequest {
        run_id: run_id.clone(),
        request_id: request_id.clone(),
        decision_id: uuid::Uuid::new_v4().to_string(),
        action: ResolveAction::Resume as i32,
        result: Some(to_proto_value(&result)),
        decided_by: p.name().to_string(),
        ..Default::default()
    };
    match w
        .runner_client()
        .resolve(Web::<S>::runner_req(&token, req))
        .await
    {
        Ok(_) => Redirect::to("/queue").into_response(),
        Err(s) => {
            let status = match s.code() {
                tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
                tonic::Code::InvalidArgument => StatusCode::UNPROCESSABLE_ENTITY,
                _ => StatusCode::CONFLICT,
            };
            let msg = format!("The runner refused the answer: {}", s.message());
            question_page(&w, &p, ids, None, (status, msg, String::new())).await
        }
    }
}
