//! Steps of the approval loop that several end-to-end tests share: register and submit (with
//! or without a `traceparent`), wait for the approval, decide it (or vote on it, delegate a
//! seat), wait for the run, read events and the audit.

use arbor_shared::proto::{approval::v1 as apb, runner::v1 as rpb};

use crate::{Cluster, WAIT, eventually};

/// Registers `tree` (a JSON document).
pub async fn register(cluster: &Cluster, tree: String) -> rpb::Tree {
    let mut runner = cluster.runner_client().await;
    runner
        .register_tree(rpb::RegisterTreeRequest {
            document: tree,
            format: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .tree
        .unwrap()
}

/// Registers `tree` and submits a run of it; `traceparent` goes out as gRPC metadata.
pub async fn submit(cluster: &Cluster, tree: String, traceparent: Option<&str>) -> rpb::Run {
    let tree = register(cluster, tree).await;
    let mut runner = cluster.runner_client().await;
    let mut request = tonic::Request::new(rpb::SubmitRunRequest {
        tree_id: tree.id,
        tree_version: tree.version,
        ..Default::default()
    });
    if let Some(tp) = traceparent {
        request
            .metadata_mut()
            .insert("traceparent", tp.parse().unwrap());
    }
    runner
        .submit_run(request)
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap()
}

/// Waits until approval-svc holds an approval of `run_id` in `state`.
pub async fn approval_of(
    cluster: &Cluster,
    run_id: &str,
    state: apb::ApprovalState,
) -> apb::Approval {
    let approvals = crate::clients::approvals_as(&cluster.approval.url(), None);
    crate::secured::wait_approval(&approvals, run_id, state).await
}

/// Approves through `ApprovalService.Resolve`.
pub async fn approve(cluster: &Cluster, request_id: &str) -> apb::ResolveResponse {
    cluster
        .approval_client()
        .await
        .resolve(apb::ResolveRequest {
            request_id: request_id.into(),
            decision: rpb::DecisionKind::Approve as i32,
            reason: "ok".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// Waits until the run has `status`.
pub async fn wait_run(cluster: &Cluster, run_id: &str, status: rpb::RunStatus) -> rpb::Run {
    let runner = cluster.runner_client().await;
    eventually(&format!("run {run_id} to be {status:?}"), WAIT, || {
        let mut runner = runner.clone();
        async move {
            let run = runner
                .get_run(rpb::GetRunRequest {
                    run_id: run_id.into(),
                })
                .await
                .ok()?
                .into_inner()
                .run?;
            (run.status == status as i32).then_some(run)
        }
    })
    .await
}

/// Every event of a run so far.
pub async fn events_of(cluster: &Cluster, run_id: &str) -> Vec<rpb::Event> {
    let mut runner = crate::clients::runner_as(&cluster.runner.url(), None);
    events_from(&mut runner, run_id).await
}

/// Every event of a run so far, read as the holder of `runner`'s credentials.
pub async fn events_from(
    runner: &mut crate::clients::RunnerClient,
    run_id: &str,
) -> Vec<rpb::Event> {
    let mut stream = runner
        .stream_events(rpb::StreamEventsRequest {
            after_seq: Some(0),
            filter: Some(rpb::EventFilter {
                run_id: run_id.into(),
                ..Default::default()
            }),
            follow: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(item) = stream.message().await.unwrap() {
        out.push(item.event.unwrap());
    }
    out
}

/// Waits until `run_id` is suspended on a request of `category`; returns that suspension.
pub async fn suspension_of(
    runner: &crate::clients::RunnerClient,
    run_id: &str,
    category: rpb::SuspensionCategory,
) -> rpb::Suspension {
    eventually(&format!("{run_id} to wait for {category:?}"), WAIT, || {
        let mut runner = runner.clone();
        let run_id = run_id.to_string();
        async move {
            let run = runner
                .get_run(rpb::GetRunRequest { run_id })
                .await
                .ok()?
                .into_inner()
                .run?;
            run.suspensions
                .into_iter()
                .find(|s| s.category == category as i32)
        }
    })
    .await
}

/// Answers a user input or an external execution through `RunnerService.Resolve`.
pub async fn answer(
    runner: &mut crate::clients::RunnerClient,
    run_id: &str,
    request_id: &str,
    result: serde_json::Value,
) -> rpb::ResolveResponse {
    runner
        .resolve(rpb::ResolveRequest {
            run_id: run_id.into(),
            request_id: request_id.into(),
            decision_id: format!("answer-{request_id}"),
            action: rpb::ResolveAction::Resume as i32,
            result: Some(arbor_shared::json::to_proto_value(&result)),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("RunnerService.Resolve {run_id} {request_id}: {e}"))
        .into_inner()
}

/// Follows `WatchApprovals` for `run_id` until an approval in `state` shows up (in the snapshot
/// or as a change); returns it.
pub async fn watch_for(
    approvals: &mut crate::clients::ApprovalClient,
    run_id: &str,
    state: apb::ApprovalState,
) -> apb::Approval {
    let mut request = tonic::Request::new(apb::WatchApprovalsRequest {
        filter: Some(apb::ApprovalFilter {
            run_id: run_id.into(),
            ..Default::default()
        }),
    });
    request.set_timeout(WAIT);
    let mut stream = approvals
        .watch_approvals(request)
        .await
        .unwrap_or_else(|e| panic!("WatchApprovals {run_id}: {e}"))
        .into_inner();
    let found = tokio::time::timeout(WAIT, async {
        while let Some(item) = stream.message().await.expect("the watch stream") {
            if let Some(a) = item.approval
                && a.state == state as i32
            {
                return Some(a);
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(a)) => a,
        Ok(None) => panic!("the watch of {run_id} ended before an approval was {state:?}"),
        Err(_) => panic!("no approval of {run_id} became {state:?} within {WAIT:?}"),
    }
}

/// An `ApprovalService.Resolve` request: `kind` with `args` (an EDIT's), bound to
/// `expected_digest` (empty: to whatever the approval holds now).
pub fn resolve_request(
    request_id: &str,
    kind: rpb::DecisionKind,
    args: Option<serde_json::Value>,
    expected_digest: &str,
) -> apb::ResolveRequest {
    apb::ResolveRequest {
        request_id: request_id.into(),
        decision: kind as i32,
        reason: format!("decided {kind:?}"),
        args: args.map(|a| arbor_shared::json::to_proto_value(&a)),
        expected_digest: expected_digest.into(),
        ..Default::default()
    }
}

/// Decides an approval through `ApprovalService.Resolve`.
pub async fn decide(
    approvals: &mut crate::clients::ApprovalClient,
    request_id: &str,
    kind: rpb::DecisionKind,
    args: Option<serde_json::Value>,
) -> apb::ResolveResponse {
    approvals
        .resolve(resolve_request(request_id, kind, args, ""))
        .await
        .unwrap_or_else(|e| panic!("ApprovalService.Resolve {request_id} {kind:?}: {e}"))
        .into_inner()
}

/// A vote (APPROVE, REJECT) or a proposal (EDIT with `args`) on a governed approval, bound to
/// `expected_digest`; returns the approval as it stands after it (still PENDING until the
/// quorum decides), or the refusal.
pub async fn vote(
    approvals: &mut crate::clients::ApprovalClient,
    request_id: &str,
    kind: rpb::DecisionKind,
    args: Option<serde_json::Value>,
    expected_digest: &str,
) -> Result<apb::Approval, tonic::Status> {
    let response = approvals
        .resolve(resolve_request(request_id, kind, args, expected_digest))
        .await?;
    Ok(response
        .into_inner()
        .approval
        .expect("Resolve answers the approval"))
}

/// One approval, as approval-svc holds it now.
pub async fn get_approval(
    approvals: &mut crate::clients::ApprovalClient,
    request_id: &str,
) -> apb::Approval {
    approvals
        .get_approval(apb::GetApprovalRequest {
            request_id: request_id.into(),
        })
        .await
        .unwrap_or_else(|e| panic!("GetApproval {request_id}: {e}"))
        .into_inner()
        .approval
        .expect("approval")
}

/// Every audit entry of one request, oldest first, page by page.
pub async fn audit_of(
    approvals: &mut crate::clients::ApprovalClient,
    request_id: &str,
) -> Vec<apb::AuditEntry> {
    let mut entries = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = approvals
            .get_audit_log(apb::GetAuditLogRequest {
                request_id: request_id.into(),
                page_token,
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("GetAuditLog {request_id}: {e}"))
            .into_inner();
        entries.extend(page.entries);
        if page.next_page_token.is_empty() {
            return entries;
        }
        page_token = page.next_page_token;
    }
}

/// Lets `to` vote in the caller's seat for `for_ms` from now, on every request.
pub async fn delegate(
    approvals: &mut crate::clients::ApprovalClient,
    to: &str,
    for_ms: u64,
) -> apb::Delegation {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64;
    approvals
        .delegate(apb::DelegateRequest {
            to: to.into(),
            ends: Some(arbor_shared::time::timestamp(now + for_ms)),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("Delegate to {to}: {e}"))
        .into_inner()
        .delegation
        .expect("delegation")
}
