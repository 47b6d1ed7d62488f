//! The queues (for me, all pending, overdue, decided) with their counts, the fragments the
//! script refreshes them with, and bulk decisions. Every list is a `ListApprovals` call of
//! the signed-in person, paged by the store's page tokens.

use std::collections::HashMap;

use arbor_shared::{
    proto::{approval::v1 as pb, approval::v1::approval_service_server::ApprovalService},
    time::from_timestamp,
};
use askama::Template;
use axum::{
    body::Bytes,
    extract::{Query, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{
    Shared, Web,
    page::{self, Chrome},
    question::{self, QuestionRow},
    session::{Person, post_of},
};
use crate::store::ApprovalStore;

/// Rows per page of a queue.
const PAGE: u32 = 50;
/// Counts stop here ("1000+").
const COUNT_CAP: usize = 1000;

#[derive(Debug, Default, Deserialize, Clone)]
pub struct QueueQuery {
    #[serde(default)]
    q: String,
    #[serde(default)]
    tree: String,
    #[serde(default)]
    tool: String,
    #[serde(default)]
    group: String,
    #[serde(default)]
    stage: String,
    #[serde(default)]
    page: String,
}

/// The queues, in the order the page shows them: key, name.
const QUEUES: [(&str, &str); 4] = [
    ("mine", "For me"),
    ("pending", "All pending"),
    ("overdue", "Overdue"),
    ("decided", "Decided"),
];

impl QueueQuery {
    fn queue(&self) -> (&'static str, &'static str) {
        QUEUES
            .into_iter()
            .find(|(k, _)| *k == self.q)
            .unwrap_or(QUEUES[0])
    }

    /// The query string of this queue with its filters (no page), `?…`.
    fn query(&self, q: &str, page: &str) -> String {
        let mut s = form_urlencoded::Serializer::new(String::new());
        s.append_pair("q", q);
        for (k, v) in [
            ("tree", &self.tree),
            ("tool", &self.tool),
            ("group", &self.group),
            ("stage", &self.stage),
        ] {
            if !v.is_empty() {
                s.append_pair(k, v);
            }
        }
        if !page.is_empty() {
            s.append_pair("page", page);
        }
        format!("?{}", s.finish())
    }

    fn filter(&self, q: &str) -> pb::ApprovalFilter {
        use pb::ApprovalState as St;
        let mut f = pb::ApprovalFilter {
            tree_id: self.tree.trim().to_string(),
            tool_name: self.tool.trim().to_string(),
            group: self.group.trim().to_string(),
            stage: self.stage.trim().to_string(),
            ..Default::default()
        };
        match q {
            "mine" => {
                f.states = vec![St::Pending as i32];
                f.actionable = true;
            }
            "pending" => f.states = vec![St::Pending as i32],
            "overdue" => f.overdue = true,
            _ => {
                f.states = [
                    St::Resolved,
                    St::Expired,
                    St::Acked,
                    St::Pruned,
                    St::Cancelled,
                ]
                .into_iter()
                .map(|s| s as i32)
                .collect()
            }
        }
        f
    }
}

pub struct Filters {
    pub tree: String,
    pub tool: String,
    pub group: String,
    pub stage: String,
}

pub struct CountLink {
    pub key: &'static str,
    pub name: &'static str,
    pub count: String,
    pub href: String,
    pub current: bool,
}

pub struct Row {
    pub id: String,
    pub title: String,
    pub tool: String,
    pub state: String,
    pub state_class: String,
    /// A decided item's decision: `rejected`, `approved on its deadline`, ….
    pub outcome: String,
    pub progress: String,
    pub deadline_iso: String,
    pub deadline_text: String,
    pub overdue: bool,
    pub href: String,
    pub digest: String,
}

pub struct RunGroup {
    pub run_id: String,
    pub tree_id: String,
    pub rows: Vec<Row>,
}

pub struct Live {
    pub queue_name: String,
    pub groups: Vec<RunGroup>,
    pub next_href: String,
    pub questions: Vec<QuestionRow>,
    pub questions_note: String,
    pub bulk: bool,
}

#[derive(Template)]
#[template(path = "queue.html")]
struct QueuePage {
    chrome: Chrome,
    queue: &'static str,
    query: String,
    counts_query: String,
    csrf: String,
    counts: Vec<CountLink>,
    filters: Filters,
    live: Live,
    bulk: bool,
}

#[derive(Template)]
#[template(path = "queue_live.html")]
struct LiveFragment {
    live: Live,
}

#[derive(Template)]
#[template(path = "counts.html")]
struct CountsFragment {
    counts: Vec<CountLink>,
    counts_query: String,
}

pub fn state_name(s: i32) -> (String, String) {
    let name = pb::ApprovalState::try_from(s)
        .map(|s| {
            s.as_str_name()
                .trim_start_matches("APPROVAL_STATE_")
                .to_lowercase()
        })
        .unwrap_or_else(|_| "unknown".into());
    (name.clone(), name)
}

/// What a row is called: its title, with the tool it would run when the title does not say.
fn row_title(r: &arbor_shared::proto::runner::v1::ApprovalRequested) -> String {
    match (r.title.is_empty(), r.tool_name.is_empty()) {
        (true, true) => r.node_name.clone(),
        (true, false) => format!("{} at {}", r.tool_name, r.node_name),
        (false, false) if !r.title.contains(&r.tool_name) => {
            format!("{}: {}", r.tool_name, r.title)
        }
        (false, _) => r.title.clone(),
    }
}

/// A decision as a row says it.
pub fn outcome(d: &pb::Decision) -> String {
    use arbor_shared::proto::runner::v1::{DecisionKind as K, DecisionSource as Src};
    let kind = match K::try_from(d.kind) {
        Ok(K::Approve) => "approved",
        Ok(K::Reject) => "rejected",
        Ok(K::Edit) => "approved as edited",
        Ok(K::Respond) => "responded",
        _ => "decided",
    };
    match Src::try_from(d.source) {
        Ok(Src::Timeout) => format!("{kind} when its deadline passed"),
        Ok(Src::Policy) => format!("{kind} by the policy"),
        _ => format!("{kind} by {}", d.decided_by),
    }
}

fn row(a: &pb::Approval, now_ms: u64) -> Row {
    let r = a.request.clone().unwrap_or_default();
    let deadline = a.next_deadline.as_ref().map(from_timestamp).unwrap_or(0);
    let (state, state_class) = state_name(a.state);
    Row {
        href: format!("/items/{}", a.request_id),
        id: a.request_id.clone(),
        title: row_title(&r),
        tool: r.tool_name,
        state,
        state_class,
        outcome: a.decision.as_ref().map(outcome).unwrap_or_default(),
        progress: a
            .governance
            .as_ref()
            .map(|g| g.progress.clone())
            .unwrap_or_default(),
        deadline_iso: page::iso(deadline),
        deadline_text: match deadline {
            0 => String::new(),
            d => page::until(d, now_ms),
        },
        overdue: deadline > 0 && deadline <= now_ms,
        digest: a.args_digest.clone(),
    }
}

/// The rows of a page, soonest deadline first (none last), grouped by run in that order.
fn grouped(mut approvals: Vec<pb::Approval>, now_ms: u64) -> Vec<RunGroup> {
    let due = |a: &pb::Approval| {
        a.next_deadline
            .as_ref()
            .map(from_timestamp)
            .filter(|d| *d > 0)
            .unwrap_or(u64::MAX)
    };
    approvals.sort_by_key(due);
    let mut groups: Vec<RunGroup> = Vec::new();
    let mut at: HashMap<String, usize> = HashMap::new();
    for a in &approvals {
        let r = a.request.clone().unwrap_or_default();
        let i = *at.entry(r.run_id.clone()).or_insert_with(|| {
            groups.push(RunGroup {
                run_id: r.run_id.clone(),
                tree_id: r.tree_id.clone(),
                rows: Vec::new(),
            });
            groups.len() - 1
        });
        groups[i].rows.push(row(a, now_ms));
    }
    groups
}

impl<S: ApprovalStore> Web<S> {
    async fn list(
        &self,
        p: &Person,
        filter: pb::ApprovalFilter,
        size: u32,
        token: &str,
    ) -> Result<pb::ListApprovalsResponse, tonic::Status> {
        let req = pb::ListApprovalsRequest {
            filter: Some(filter),
            page_size: size,
            page_token: token.to_string(),
        };
        self.api
            .list_approvals(Self::as_person(&p.principal, req))
            .await
            .map(tonic::Response::into_inner)
    }

    async fn counts(&self, p: &Person, q: &QueueQuery) -> Vec<CountLink> {
        let current = q.queue().0;
        let mut out = Vec::new();
        for (key, name) in QUEUES {
            let counted = self
                .api
                .count_approvals(&p.principal, &q.filter(key), COUNT_CAP + 1)
                .await;
            let count = match counted {
                Ok(n) if n > COUNT_CAP => format!("{COUNT_CAP}+"),
                Ok(n) => n.to_string(),
                Err(_) => "–".into(),
            };
            out.push(CountLink {
                key,
                name,
                count,
                href: format!("/queue{}", q.query(key, "")),
                current: key == current,
            });
        }
        out
    }

    async fn live(&self, p: &Person, q: &QueueQuery) -> Live {
        let (key, name) = q.queue();
        let now = self.approvals.store().now_ms();
        let (groups, next_href, note) = match self.list(p, q.filter(key), PAGE, &q.page).await {
            Ok(r) => (
                grouped(r.approvals, now),
                match r.next_page_token.is_empty() {
                    true => String::new(),
                    false => format!("/queue{}", q.query(key, &r.next_page_token)),
                },
                String::new(),
            ),
            Err(s) => (Vec::new(), String::new(), s.message().to_string()),
        };
        let (mut questions, mut questions_note) = question::waiting(self, p).await;
        if !note.is_empty() {
            questions_note =
                format!("Approvals cannot be listed for you: {note}. {questions_note}");
        }
        if key == "decided" {
            questions.clear();
        }
        Live {
            queue_name: name.to_string(),
            bulk: key != "decided" && crate::grpc::may_decide_any(&p.principal),
            groups,
            next_href,
            questions,
            questions_note,
        }
    }
}

pub async fn home() -> Redirect {
    Redirect::to("/queue")
}

pub async fn page<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Query(q): Query<QueueQuery>,
) -> Response {
    let Some(p) = w.person(&headers) else {
        return Redirect::to("/sign-in").into_response();
    };
    let (key, name) = q.queue();
    let live = w.live(&p, &q).await;
    let view = QueuePage {
        chrome: Chrome::new(name, Some(&p)),
        queue: key,
        query: q.query(key, &q.page),
        counts_query: q.query(key, ""),
        csrf: p.csrf.clone(),
        counts: w.counts(&p, &q).await,
        filters: Filters {
            tree: q.tree.clone(),
            tool: q.tool.clone(),
            group: q.group.clone(),
            stage: q.stage.clone(),
        },
        bulk: live.bulk,
        live,
    };
    page::render(StatusCode::OK, &view)
}

pub async fn fragment<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Query(q): Query<QueueQuery>,
) -> Response {
    let Some(p) = w.person(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let live = w.live(&p, &q).await;
    page::render(StatusCode::OK, &LiveFragment { live })
}

pub async fn counts_fragment<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    Query(q): Query<QueueQuery>,
) -> Response {
    let Some(p) = w.person(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let counts = w.counts(&p, &q).await;
    let counts_query = q.query(q.queue().0, "");
    page::render(
        StatusCode::OK,
        &CountsFragment {
            counts,
            counts_query,
        },
    )
}

pub struct Outcome {
    pub id: String,
    pub ok: bool,
    pub text: String,
}

#[derive(Template)]
#[template(path = "bulk.html")]
struct BulkPage {
    chrome: Chrome,
    decision: String,
    outcomes: Vec<Outcome>,
}

/// Approves or rejects the selected items in one `BulkResolve`, each bound to the digest its
/// row showed, and shows each item's outcome.
pub async fn bulk<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (p, f) = match post_of(&w, &headers, &body) {
        Ok(x) => x,
        Err(res) => return res,
    };
    let kind = match f.get("decision") {
        Some("approve") => arbor_shared::proto::runner::v1::DecisionKind::Approve,
        Some("reject") => arbor_shared::proto::runner::v1::DecisionKind::Reject,
        _ => return page::error(StatusCode::BAD_REQUEST, "Choose approve or reject."),
    };
    let ids = f.all("id");
    if ids.is_empty() {
        return page::error(StatusCode::BAD_REQUEST, "Select at least one item.");
    }
    let expected_digests = ids
        .iter()
        .filter_map(|id| {
            f.get(&format!("digest.{id}"))
                .map(|d| (id.clone(), d.to_string()))
        })
        .collect();
    let req = pb::BulkResolveRequest {
        request_ids: ids,
        decision: kind as i32,
        reason: f.text("reason"),
        expected_digests,
        ..Default::default()
    };
    let outcomes = match w
        .api
        .bulk_resolve(Web::<S>::as_person(&p.principal, req))
        .await
    {
        Ok(r) => r
            .into_inner()
            .items
            .into_iter()
            .map(|i| {
                let still_pending = i
                    .approval
                    .as_ref()
                    .filter(|a| a.state == pb::ApprovalState::Pending as i32);
                Outcome {
                    ok: i.code == 0,
                    text: match (i.code, still_pending, i.message.is_empty()) {
                        (0, Some(a), _) => format!(
                            "vote counted ({})",
                            a.governance
                                .as_ref()
                                .map(|g| g.progress.as_str())
                                .unwrap_or("")
                        ),
                        (0, None, true) => "done".into(),
                        (0, None, false) => i.message,
                        _ => format!("refused: {}", i.message),
                    },
                    id: i.request_id,
                }
            })
            .collect(),
        Err(s) => return page::error(StatusCode::FORBIDDEN, s.message()),
    };
    page::render(
        StatusCode::OK,
        &BulkPage {
            chrome: Chrome::new("Bulk decision", Some(&p)),
            decision: f.text("decision"),
            outcomes,
        },
    )
}
