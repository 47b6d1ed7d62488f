//! The run an item belongs to, read from the runner with the person's own token: its nodes with
//! their statuses (the node the item waits at marked), a blackboard excerpt and, as a fragment of
//! its own loaded after the page, its events.

use arbor_shared::{
    json::from_proto_struct,
    proto::runner::v1::{self as rpb, EventFilter},
    time::from_timestamp,
};
use serde_json::Value as Json;
use tokio_stream::StreamExt;

use askama::Template;
use axum::{
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};

use super::{
    Shared, Web,
    page::{self, Pair},
    session::Person,
};
use crate::store::ApprovalStore;

/// Blackboard entries shown on an item's page.
const BLACKBOARD_EXCERPT: usize = 12;
/// Events of the run shown on an item's page (the first ones).
const TIMELINE: usize = 50;

pub struct TreeRow {
    pub depth: usize,
    pub name: String,
    pub kind: String,
    pub status: String,
    pub waiting: bool,
}

/// The run of an item, as far as the person may read it.
#[derive(Default)]
pub struct RunView {
    pub tree: Vec<TreeRow>,
    pub blackboard: Vec<Pair>,
    pub note: String,
}

/// The run's events, answered apart from the item's page: the runner finds a run's events by
/// reading its log from the start, which takes longer the longer the log, and the page should
/// not wait for that.
#[derive(Template)]
#[template(path = "timeline.html")]
struct TimelineFragment {
    timeline: Vec<EventRow>,
    note: String,
}

/// One event of the run.
pub struct EventRow {
    pub at: String,
    pub kind: String,
}

/// The nodes of a tree document, depth first: `(depth, type, name)`.
fn nodes(doc: &Json, depth: usize, out: &mut Vec<(usize, String, String)>) {
    let Some(m) = doc.as_object() else { return };
    if let Some(t) = m.get("type").and_then(Json::as_str) {
        let name = m.get("name").and_then(Json::as_str).unwrap_or_default();
        out.push((depth, t.to_string(), name.to_string()));
    }
    for key in ["root", "child", "children"] {
        match m.get(key) {
            Some(Json::Array(xs)) => xs.iter().for_each(|x| nodes(x, depth + 1, out)),
            Some(x @ Json::Object(_)) => nodes(x, depth + 1, out),
            _ => {}
        }
    }
}

/// The run's nodes with their statuses (`GetRunNodes`); from a runner without it, the tree
/// document (`GetTree`) without statuses, the node waited at found by name.
async fn run_nodes<S: ApprovalStore>(
    w: &Web<S>,
    token: &str,
    run: &rpb::Run,
    locator: &str,
    node_name: &str,
) -> (Vec<TreeRow>, String) {
    let req = rpb::GetRunNodesRequest {
        run_id: run.run_id.clone(),
    };
    let nodes_of = w
        .runner_client()
        .get_run_nodes(Web::<S>::runner_req(token, req))
        .await;
    match nodes_of {
        Ok(r) => {
            let rows = r
                .into_inner()
                .nodes
                .into_iter()
                .map(|n| {
                    let status = rpb::NodeStatus::try_from(n.status)
                        .map(|s| {
                            s.as_str_name()
                                .trim_start_matches("NODE_STATUS_")
                                .to_lowercase()
                        })
                        .unwrap_or_default();
                    TreeRow {
                        waiting: n.locator == locator,
                        depth: (n.depth as usize).min(8),
                        name: match n.name.is_empty() {
                            true => n.locator.clone(),
                            false => n.name,
                        },
                        kind: n.kind,
                        status: match status.as_str() {
                            "unspecified" => String::new(),
                            _ => status,
                        },
                    }
                })
                .collect();
            return (rows, String::new());
        }
        Err(s) if s.code() != tonic::Code::Unimplemented => {
            return (
                Vec::new(),
                format!("The tree cannot be shown: {}", s.message()),
            );
        }
        Err(_) => {}
    }
    let req = rpb::GetTreeRequest {
        tree_id: run.tree_id.clone(),
        version: run.tree_version,
    };
    match w
        .runner_client()
        .get_tree(Web::<S>::runner_req(token, req))
        .await
    {
        Ok(r) => {
            let doc = r
                .into_inner()
                .tree
                .and_then(|t| serde_json::from_str::<Json>(&t.document).ok())
                .unwrap_or(Json::Null);
            let mut found = Vec::new();
            nodes(doc.get("root").unwrap_or(&Json::Null), 0, &mut found);
            let rows = found
                .into_iter()
                .map(|(depth, kind, name)| TreeRow {
                    waiting: !name.is_empty() && name == node_name,
                    status: if name == node_name { "waiting" } else { "" }.into(),
                    depth: depth.min(8),
                    name,
                    kind,
                })
                .collect();
            (rows, String::new())
        }
        Err(s) => (
            Vec::new(),
            format!("The tree cannot be shown: {}", s.message()),
        ),
    }
}

/// The run of an item: its tree (the node it waits at marked) and a blackboard excerpt.
pub async fn run_view<S: ApprovalStore>(
    w: &Web<S>,
    p: &Person,
    run_id: &str,
    (locator, node_name): (&str, &str),
) -> RunView {
    let (run, _) = match w.get_run(p, run_id).await {
        Ok(r) => r,
        Err(e) => {
            return RunView {
                note: format!("The run cannot be shown: {e}"),
                ..Default::default()
            };
        }
    };
    let blackboard = run
        .blackboard
        .as_ref()
        .map(from_proto_struct)
        .unwrap_or_default()
        .into_iter()
        .take(BLACKBOARD_EXCERPT)
        .map(|(key, v)| Pair {
            key,
            value: page::show(&v),
        })
        .collect();
    let Some((token, _)) = w.runner_token(p) else {
        return RunView::default();
    };
    let (tree, note) = run_nodes(w, &token, &run, locator, node_name).await;
    RunView {
        tree,
        blackboard,
        note,
    }
}

/// `GET /items/{id}/timeline`: the first events of the item's run, read with the person's own
/// token (the runner decides whether they may read them).
pub async fn timeline_fragment<S: ApprovalStore>(
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
    let (timeline, note) = match w.runner_token(&p) {
        Some((token, _)) => match timeline(&w, &token, &a.request.run_id).await {
            Ok(rows) => (rows, String::new()),
            Err(s) => (
                Vec::new(),
                format!("The run's events cannot be shown: {}", s.message()),
            ),
        },
        None => (
            Vec::new(),
            "The run's events cannot be shown: no token to read them with.".into(),
        ),
    };
    page::render(StatusCode::OK, &TimelineFragment { timeline, note })
}

/// The run's first events (`StreamEvents` without following, filtered to the run); the runner's
/// refusal when it does not let the person read them.
async fn timeline<S: ApprovalStore>(
    w: &Web<S>,
    token: &str,
    run_id: &str,
) -> Result<Vec<EventRow>, tonic::Status> {
    let req = rpb::StreamEventsRequest {
        filter: Some(EventFilter {
            run_id: run_id.to_string(),
            ..Default::default()
        }),
        after_seq: Some(0),
        follow: false,
        ..Default::default()
    };
    let stream = w
        .runner_client()
        .stream_events(Web::<S>::runner_req(token, req))
        .await?;
    let mut rows = Vec::new();
    let mut stream = stream.into_inner();
    while rows.len() < TIMELINE {
        let item = match stream.next().await {
            Some(Ok(item)) => item,
            Some(Err(s)) if rows.is_empty() => return Err(s),
            _ => break,
        };
        let Some(e) = item.event else { continue };
        rows.push(EventRow {
            at: page::iso(e.time.as_ref().map(from_timestamp).unwrap_or(0)),
            kind: rpb::EventKind::try_from(e.kind)
                .map(|k| {
                    k.as_str_name()
                        .trim_start_matches("EVENT_KIND_")
                        .to_lowercase()
                })
                .unwrap_or_default(),
        });
    }
    Ok(rows)
}
